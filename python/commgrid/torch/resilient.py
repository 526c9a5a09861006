"""commgrid's resilient driver for torch training loops run by `commgrid launch --spares S`.

    driver = commgrid.torch.ResilientDriver(tp=2, snapshot_every=2)
    driver.run(steps, start_epoch=build, step=train_step,
               state_dict=lambda: {"model": model.state_dict(), "optim": opt.state_dict()},
               load_state_dict=load)

The C++ driver (commgrid::ResilientDriver) runs the loop: it snapshots the state every K
steps in memory, and when a process dies it agrees with the survivors and the spares on the
next epoch, rolls every rank back to the latest snapshot they all hold, gives a spare that
took a dead rank's place that rank's state (from a data-parallel replica, or a buddy copy),
or shrinks the world when no spare is left. The state provider is the program's
``state_dict`` (serialized with ``torch.save``, restored with ``torch.load`` and the
program's ``load_state_dict``).

Each epoch's torch groups: the epoch's logical rank 0 serves a fresh ``torch.distributed.
TCPStore`` (a free port) and posts its address in the job's store under the epoch's key;
every rank of the epoch calls ``init_process_group("gloo")`` over it with its logical rank,
then creates one Gloo group per group of the kinds asked for (``kinds``, default tp, pp, dp)
from the layout's ranks (``commgrid.Layout``), every rank in the same order (a group of
every rank is the default group itself). The TCP connections those calls opened are armed
so that launch's SIGURG for the epoch's failure shuts them down (every collective blocked in
the epoch fails at once); on a failure the driver shuts them down itself, drops the
references to the groups, and aborts and destroys them (``distributed_c10d.
_abort_process_group``) before the next epoch's groups are made the same way.
docs/resilience.md, "torch programs".
"""

import datetime
import gc
import io
import weakref

import torch
import torch.distributed as dist

from .. import Layout
from .._commgrid import DEFAULT_ORDER
from . import _sockets
from ._version import _release
from .resilient_errors import (BackendError, FencedError, NoSpareError, PeerFailure,  # noqa: F401
                               RecoveryError, StateLostError, StateProviderError,
                               TorchTooOldError)

MIN_TORCH_ABORT = (2, 6)

# The text of torch's Gloo errors when a peer is gone or a collective timed out.
_GLOO_FAILURE_MARKS = ("gloo/transport", "Connection closed by peer", "Connection reset by peer",
                       "Timed out waiting", "Socket Timeout", "Broken pipe")


def check_torch_abort(torch_module=torch):
    """TorchTooOldError naming the version and what is missing when this torch cannot abort
    and destroy an epoch's process groups (torch >= 2.6: ``ProcessGroup.abort`` and
    ``distributed_c10d._abort_process_group``)."""
    version = getattr(torch_module, "__version__", "unknown")
    distributed = getattr(torch_module, "distributed", None)
    missing = []
    if distributed is None or not distributed.is_available():
        missing.append("torch.distributed")
    else:
        c10d = getattr(distributed, "distributed_c10d", None)
        for name in ("_abort_process_group", "destroy_process_group"):
            if not hasattr(c10d, name):
                missing.append(f"torch.distributed.distributed_c10d.{name}")
        if not hasattr(getattr(distributed, "ProcessGroup", None), "abort"):
            missing.append("torch.distributed.ProcessGroup.abort")
    too_old = _release(version) < MIN_TORCH_ABORT
    if too_old or missing:
        need = f"{MIN_TORCH_ABORT[0]}.{MIN_TORCH_ABORT[1]}"
        raise TorchTooOldError(
            f"commgrid.torch.ResilientDriver needs torch >= {need}, which can abort and destroy "
            f"an epoch's process groups; this is torch {version}"
            + (f" (missing: {', '.join(missing)})" if missing else ""))


def is_communication_failure(error):
    """Whether ``error`` is a collective's failure because a peer died or left: a torch
    ``DistError`` (DistBackendError, DistNetworkError, DistStoreError) or a RuntimeError
    from torch's Gloo transport."""
    if isinstance(error, PeerFailure):
        return True
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(error, dist_error):
        return True
    if isinstance(error, RuntimeError):
        text = str(error)
        return any(mark in text for mark in _GLOO_FAILURE_MARKS)
    return False


def _guarded(fn):
    """``fn`` with a communication failure re-raised as PeerFailure (the driver's recovery)."""
    def call(*args):
        try:
            return fn(*args)
        except PeerFailure:
            raise
        except Exception as error:  # noqa: BLE001 - sorted below, others re-raised
            if is_communication_failure(error):
                raise PeerFailure(f"{type(error).__name__}: {str(error).splitlines()[0]}") from error
            raise
    return call


class Epoch:
    """One epoch's view for the program: its number, this process's logical rank, the
    epoch's layout (after a shrink, the smaller one) and its torch groups.

    ``group(kind)`` is this rank's torch ProcessGroup of the kind (tp, pp, dp, ... as
    created), ``ranks(kind)`` its members (logical ranks), ``coordinates`` the rank's
    coordinates in the layout. The program must not keep references to the groups after
    ``stop_epoch``: the driver destroys them."""

    def __init__(self, config, groups, timeout):
        self.epoch = config["epoch"]
        self.rank = config["rank"]
        self.world_size = config["world_size"]
        self.tp, self.pp, self.cp, self.ep, self.dp = (config[k] for k in ("tp", "pp", "cp", "ep", "dp"))
        self.layout = _layout(config)
        self.coordinates = self.layout.coordinates(self.rank)
        self.timeout = timeout
        self._groups = groups

    def group(self, kind):
        if kind not in self._groups:
            raise KeyError(f"epoch {self.epoch}: no {kind} group was created (kinds: "
                           f"{sorted(self._groups)})")
        return self._groups[kind][0]

    def ranks(self, kind):
        return list(self._groups[kind][1])

    def kinds(self):
        return sorted(self._groups)

    def _release(self):
        self._groups = {}

    def __repr__(self):
        return (f"Epoch(epoch={self.epoch}, rank={self.rank}, world_size={self.world_size}, "
                f"tp={self.tp}, pp={self.pp}, dp={self.dp})")


def _layout(config):
    extra = {}
    if config.get("etp") is not None:
        extra["etp"] = config["etp"]
    return Layout(config["world_size"], tp=config["tp"], pp=config["pp"], cp=config["cp"],
                  ep=config["ep"], order=config["order"], **extra)


def _abort_groups(alive):
    """Aborts and destroys every torch group (the default one too); a full collection when
    one of ``alive`` (weak references) is still referenced."""
    if dist.is_initialized():
        try:
            dist.distributed_c10d._abort_process_group()
        except Exception:  # noqa: BLE001 - a backend without abort: destroy instead
            if dist.is_initialized():
                dist.destroy_process_group()
    if any(ref() is not None for ref in alive):
        gc.collect()


class ResilientDriver:
    """One process of a resilient torch job (run under ``commgrid launch --spares S``).

    ``tp, pp, cp, ep, etp, order``: epoch 0's layout over the launch's world (dp is the
    rest). ``snapshot_every``: K, a snapshot of the state at every K-th step.
    ``state_from``: "auto", "replica" or "buddy" (where a spare gets a dead rank's state).
    ``shrink``: when no spare is left, go on with fewer data-parallel replicas;
    ``global_batch``: then every smaller dp must divide it. ``kinds``: the group kinds to
    create as torch groups each epoch. Bad options raise ``commgrid.ConfigError``; a torch
    that cannot abort its groups raises ``TorchTooOldError``."""

    def __init__(self, *, tp=1, pp=1, cp=1, ep=1, etp=None, order=DEFAULT_ORDER,
                 snapshot_every=1, state_from="auto", shrink=True, global_batch=None,
                 snapshot_memory_limit=0, kinds=("tp", "pp", "dp"), backend="gloo"):
        check_torch_abort()
        if backend != "gloo":
            raise ValueError(f"backend: only \"gloo\" is supported, got {backend!r}")
        from .. import _resilience  # the compiled driver (built with the Gloo backend)

        self._resilience = _resilience

        self._kinds = tuple(kinds)
        self._backend = backend
        self._driver = _resilience.Driver(
            tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, order=order, snapshot_every=snapshot_every,
            state_from=state_from, shrink=shrink, global_batch=global_batch,
            snapshot_memory_limit=snapshot_memory_limit, failure_types=PeerFailure)
        self._epoch = None
        self._store = None
        self._deferred = None  # the last epoch's groups, to abort before the next ones
        self._user = {}

    # ---- what the launch said -------------------------------------------------------
    @property
    def process(self):
        """This process (0 ... W+S-1)."""
        return self._driver.process

    @property
    def incarnation(self):
        """Restarts of this process so far (commgrid launch --max-restarts)."""
        return self._driver.incarnation

    @property
    def world_size(self):
        """Epoch 0's world size W (the launch's processes less its spares)."""
        return self._driver.world_size

    @property
    def num_processes(self):
        return self._driver.num_processes

    @property
    def spares(self):
        return self._driver.spares

    @property
    def epoch(self):
        """The current Epoch (None on a spare or outside run)."""
        return self._epoch

    @property
    def timeout(self):
        """The job's timeout (COMMGRID_TIMEOUT) as a timedelta: every group's."""
        return datetime.timedelta(seconds=self._driver.timeout_s)

    # ---- the loop ---------------------------------------------------------------------
    def run(self, steps, *, start_epoch, step, state_dict, load_state_dict, stop_epoch=None,
            begin_step=None, recovered=None, warm_up=None):
        """Runs steps [0, steps), recovering from failures. A spare waits until it takes a
        rank or the job is done. Returns this process's logical rank at the end (None on a
        process that holds none).

        - ``start_epoch(epoch)``: builds the model and optimizer over ``epoch``'s groups in
          their initial state (the driver then loads the state to go on from).
        - ``step(n)``: one training step. A collective that fails because a peer died starts
          a recovery; any other exception ends this process.
        - ``state_dict()`` / ``load_state_dict(state)``: the state (a dict of tensors and
          numbers, e.g. the model's and the optimizer's state_dict), saved with torch.save.
        - ``stop_epoch()``: drop every reference to the epoch's groups.
        - ``begin_step(n)``: at the start of each step, before its snapshot.
        - ``recovered(record)``: after each recovery (a dict: epoch, resumed_at, dead,
          shrink, layout, the seconds of agreement_s, groups_s, model_s, state_s, cpu_s
          (this process's CPU time, every thread's, in the recovery), and
          ended_by_launch: how many failed epochs' collectives launch's signal has ended on
          this process so far).
        - ``warm_up()``: on a spare (or a restarted process), before it starts waiting:
          program code that runs once what start_epoch and a step will run (e.g. one step
          of a throwaway model), so that taking a rank does not first page it in. The
          driver itself warms what every program runs first (see ``_warm_up``).

        Raises RecoveryError (NoSpareError, StateLostError, StateProviderError) when the job
        cannot go on, with the same message on every process, FencedError when this process
        was declared dead."""
        self._user = {"start": start_epoch, "stop": stop_epoch}

        def save():
            buffer = io.BytesIO()
            torch.save(state_dict(), buffer)
            return buffer.getvalue()

        def load(data):
            load_state_dict(torch.load(io.BytesIO(data), weights_only=True))

        if self.process >= self.world_size or self.incarnation > 0:
            self._warm_up(warm_up)
        try:
            return self._driver.run(
                steps, save=save, load=load, start_epoch=_guarded(self._start),
                stop_epoch=lambda: self._stop(defer=True), step=_guarded(step),
                begin_step=None if begin_step is None else _guarded(begin_step),
                recovered=None if recovered is None else self._with_signal_count(recovered))
        finally:
            self._stop()

    def _with_signal_count(self, recovered):
        """recovered(record) with ``ended_by_launch``: how many times launch's signal for a
        failed epoch has ended this process's torch collectives so far."""
        def call(record):
            record["ended_by_launch"] = self._resilience.epoch_sockets_ended()
            recovered(record)
        return call

    def _warm_up(self, program):
        """What a spare runs before it waits: its first torch.save and torch.load (the state
        provider's), a one-rank Gloo group's all-reduce (a group's first collective), and one
        Adam step of a small linear layer (autograd and the optimizer), then the program's
        own ``warm_up``. Measured: a cold spare took 0.8-1.1 s for its model and as long for
        its state in its first recovery, a warmed one 0.01-0.02 s for each
        (docs/benchmarks.md, "Fault tolerance")."""
        t = torch.arange(16, dtype=torch.float32)
        buffer = io.BytesIO()
        torch.save({"t": t, "n": 1}, buffer)
        torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
        group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, self.timeout)
        group.allreduce([t]).wait()
        del group
        layer = torch.nn.Linear(16, 16)
        optim = torch.optim.Adam(layer.parameters())
        layer(t.unsqueeze(0)).square().sum().backward()
        optim.step()
        optim.load_state_dict(optim.state_dict())
        if program is not None:
            program()

    # ---- each epoch's torch groups -----------------------------------------------------
    def _start(self, config):
        self._stop()
        epoch, rank, world = config["epoch"], config["rank"], config["world_size"]
        timeout = self.timeout
        key = config["torch_store_key"]
        if rank == 0:
            host = self._driver.store_address()
            store = dist.TCPStore(host, 0, None, True, timeout=timeout, wait_for_workers=False)
            self._driver.store_set(key, f"{host}:{store.port}".encode())
        else:
            address = self._driver.store_wait(key, timeout.total_seconds())
            if address is None:
                raise PeerFailure(f"epoch {epoch}: logical rank 0 posted no torch store (the "
                                  f"epoch failed, or {timeout.total_seconds():g} s passed)")
            host, port = address.decode().rsplit(":", 1)
            store = dist.TCPStore(host, int(port), None, False, timeout=timeout)
        self._store = store
        before = _sockets.socket_inodes()
        dist.init_process_group(self._backend, store=store, rank=rank, world_size=world,
                                timeout=timeout)
        layout = _layout(config)
        groups = {}
        for kind in self._kinds:
            if not layout.has_kind(kind):
                continue
            for members in layout.groups(kind):
                # A group of every rank is the default group (one full mesh fewer); every
                # rank sees the same, so the new_group calls stay the same on every rank.
                if len(members) == world:
                    group = dist.group.WORLD
                else:
                    group = dist.new_group(members, timeout=timeout)
                if rank in members:
                    groups[kind] = (group, members)
        # launch's SIGURG for this epoch's failure ends its blocked collectives at once.
        ports = _sockets.ports_of(self._driver.store_uri) | {store.port}
        self._resilience.arm_epoch_sockets(epoch, _sockets.new_connections(before, ports))
        self._epoch = Epoch(config, groups, timeout)
        self._user["start"](self._epoch)

    def _stop(self, defer=False):
        """Ends the epoch: shuts its torch connections down (a peer blocked in a collective
        with this process fails at once), runs the program's ``stop_epoch``, drops the
        driver's references, then aborts and destroys the epoch's groups. With ``defer``
        (the C++ driver's stop_epoch, at a recovery or the end) that last part waits until
        the next epoch's torch groups are made, or ``run`` returns, so it is not on the
        agreement's path (a thread would not help: torch's abort holds the GIL). A group
        that outlives the references dropped here (a reference cycle in the program's
        model, the failure's traceback) has its connections shut down already; only where
        none were found to shut down (no /proc) is a full garbage collection run to close
        them (0.1-0.5 s with torch loaded)."""
        self._abort_deferred()
        # Before torch closes (and reuses) the descriptors.
        ended = self._resilience.end_epoch_sockets() > 0
        stop = self._user.get("stop")
        epoch, self._epoch = self._epoch, None
        if epoch is None and not dist.is_initialized():
            return  # nothing of an epoch is left (the start of every epoch calls this)
        alive = []  # weak references to the groups, for the fallback collection
        if dist.is_initialized() and not ended:
            alive = [weakref.ref(g) for g in list(dist.distributed_c10d._world.pg_map)]
        try:
            if epoch is not None and stop is not None:
                stop()
        finally:
            if epoch is not None:
                epoch._release()
            self._store = None
            if defer:
                self._deferred = alive
            else:
                _abort_groups(alive)

    def _abort_deferred(self):
        alive, self._deferred = self._deferred, None
        if alive is not None:
            _abort_groups(alive)
