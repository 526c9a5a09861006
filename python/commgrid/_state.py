"""The process-wide parallel state that commgrid.torch fills and the collections read.

Kept free of torch so that ``import commgrid`` and the collections do not import torch.
"""


class ParallelState:
    """This rank's groups: per kind the group handle and its global ranks (the kind's member
    order), plus Megatron's overrides and the virtual pipeline rank."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.layout = None          # commgrid.Layout of the initialized configuration
        self.rank = None            # this process's global rank
        self.groups = {}            # kind -> group handle (hcp: list, one per level)
        self.ranks = {}             # kind -> list of global ranks (hcp: list per level)
        self.gloo_groups = {}       # dp, dp_cp, intra_dp_cp, expt_dp, intra_expt_dp twins
        self.creation_calls = 0     # new_group calls this rank made
        self.creation = None        # "megatron" or "local"
        self.virtual_rank = None
        self.virtual_size = None
        self.overrides = {}         # Megatron's set_*_world_size / set_*_rank values

    @property
    def initialized(self):
        return self.layout is not None

    def group(self, kind):
        """The handle of this rank's group of the kind; None when it has none or the state
        is not initialized (Megatron's getters with check_initialized=False)."""
        return self.groups.get(kind)


STATE = ParallelState()
