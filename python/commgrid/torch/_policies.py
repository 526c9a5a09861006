"""Megatron-core's default embedding policies: from a pipeline group's ranks to the ranks of
its embedding (first and last stage) and position-embedding (first stage) groups. The seed
also places the split rank's stage of its deprecated encoder/decoder split in both."""


def default_embedding_ranks_seed(pp_ranks, split_rank=None):
    """The seed's default embedding policy: the first and last stage (one stage: itself),
    and the split rank's stage when given and not already one of them."""
    if len(pp_ranks) == 1:
        return [pp_ranks[0]]
    if split_rank is not None and pp_ranks[split_rank] not in (pp_ranks[0], pp_ranks[-1]):
        return [pp_ranks[0], pp_ranks[split_rank], pp_ranks[-1]]
    return [pp_ranks[0], pp_ranks[-1]]


def default_position_embedding_ranks_seed(pp_ranks, split_rank=None):
    """The seed's default position-embedding policy: the first stage (and the split rank's
    stage when given and different)."""
    if split_rank is not None and pp_ranks[0] != pp_ranks[split_rank]:
        return [pp_ranks[0], pp_ranks[split_rank]]
    return [pp_ranks[0]]


def default_embedding_ranks_head(pp_ranks):
    """HEAD's default embedding policy: the first and last stage (one stage: itself)."""
    return [pp_ranks[0]] if len(pp_ranks) == 1 else [pp_ranks[0], pp_ranks[-1]]


def default_position_embedding_ranks_head(pp_ranks):
    """HEAD's default position-embedding policy: the first stage."""
    return [pp_ranks[0]]
