"""commgrid.torch.ResilientDriver with real processes: examples/python/resilient_train.py run
by the built `commgrid launch --spares S`, one process SIGKILLed at a chosen step, and its
per-step losses (float32, CPU) compared bit for bit with the same run without a failure.
Also: a torch that cannot abort its groups is a clear error at start, and a state provider
that raises ends the job with its message on every process."""
import functools
import os
import random
import re
import signal
import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch has no torch.distributed", allow_module_level=True)

import commgrid.torch as cgt  # noqa: E402
from commgrid.torch import resilient  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
EXAMPLE = os.path.join(ROOT, "examples", "python", "resilient_train.py")
HERE = os.path.dirname(os.path.abspath(__file__))
CLI = os.environ.get("COMMGRID_CLI")
# Every collective's and rendezvous's bound (COMMGRID_TIMEOUT): generous, since 5 torch
# processes import torch at once on a loaded 2-core machine before their first rendezvous.
OP_TIMEOUT = 180
JOB_TIMEOUT = 900  # the whole launch, killed (and failed) beyond it

needs_cli = pytest.mark.skipif(not CLI or not os.path.exists(CLI),
                               reason="COMMGRID_CLI (the built commgrid command) is not set")
needs_binding = pytest.mark.skipif(
    not os.path.exists(os.path.join(os.path.dirname(cgt.__file__), os.pardir,
                                    "_resilience" + __import__("sysconfig").get_config_var("EXT_SUFFIX"))),
    reason="commgrid._resilience (the resilient driver's binding) was not built")

LOSS = re.compile(r"step (\d+) loss (\S+)$")


def launch(n, spares, program_args, program=EXAMPLE):
    """Runs `commgrid launch -n N --spares S -- python PROGRAM ARGS`; (exit code, stdout,
    stderr). Kills the whole launch and fails when it outlasts JOB_TIMEOUT."""
    cmd = [CLI, "launch", "-n", str(n), "--spares", str(spares), "--timeout", str(OP_TIMEOUT),
           "--", sys.executable, program] + [str(a) for a in program_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"{' '.join(cmd)} did not end within {JOB_TIMEOUT} s\n{out}\n{err}")
    return proc.returncode, out, err


def losses(out):
    """Every printed (step, loss) in order."""
    found = []
    for line in out.splitlines():
        m = LOSS.search(line)
        if m:
            found.append((int(m.group(1)), m.group(2)))
    return found


def check_equal(reference, run, steps, what):
    """Every step of the reference printed once; every line of the run (a step repeated
    after a rollback prints again) equal to the reference's, as text (repr: bit for bit)."""
    ref = dict(reference)
    assert sorted(ref) == list(range(steps)) and len(reference) == steps, reference
    seen = set()
    for step, value in run:
        assert value == ref[step], f"{what}: step {step} loss {value} != {ref[step]} without the failure"
        seen.add(step)
    assert seen == set(range(steps)), f"{what}: steps printed {sorted(seen)}"


@functools.lru_cache(maxsize=None)
def _baseline(n, args):
    code, out, err = launch(n, 0, list(args))
    assert code == 0, f"the run without a failure failed ({code}):\n{out}\n{err}"
    return losses(out)


def baseline(n, args):
    """The losses of the run without a failure; tests of one pytest run that compare with
    the same run share it (the spare and the shrink of tp 2 x dp 2)."""
    return _baseline(n, tuple(args))


# ---- without processes ----------------------------------------------------------------------

def test_a_torch_too_old_to_abort_its_groups_is_a_clear_error():
    old = types.SimpleNamespace(__version__="2.5.1", distributed=torch.distributed)
    with pytest.raises(cgt.TorchTooOldError, match=r"needs torch >= 2\.6.*this is torch 2\.5\.1"):
        resilient.check_torch_abort(old)
    c10d = types.SimpleNamespace(destroy_process_group=None)  # no _abort_process_group
    dist = types.SimpleNamespace(is_available=lambda: True, distributed_c10d=c10d,
                                 ProcessGroup=torch.distributed.ProcessGroup)
    with pytest.raises(cgt.TorchTooOldError, match=r"missing: torch\.distributed\.distributed_c10d\._abort_process_group"):
        resilient.check_torch_abort(types.SimpleNamespace(__version__="2.15.0", distributed=dist))
    resilient.check_torch_abort(torch)  # this torch can


def test_communication_failures_are_told_from_other_errors():
    gloo = RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:1")
    assert resilient.is_communication_failure(gloo)
    assert resilient.is_communication_failure(torch.distributed.DistBackendError("x"))
    assert not resilient.is_communication_failure(RuntimeError("shape mismatch"))
    assert not resilient.is_communication_failure(ValueError("Connection closed by peer"))


@needs_binding
def test_outside_commgrid_launch_the_driver_says_so(monkeypatch):
    monkeypatch.delenv("COMMGRID_PROCESS", raising=False)
    import commgrid
    with pytest.raises(commgrid.ConfigError, match=r"commgrid launch --spares"):
        cgt.ResilientDriver(tp=1)


# ---- real processes under commgrid launch --spares ------------------------------------------

@needs_cli
@needs_binding
def test_a_spare_takes_a_killed_ranks_place_and_the_losses_are_bitwise_equal():
    steps = 7
    args = ["--steps", steps, "--tp", 2, "--dp", 2, "--snapshot-every", 2]
    reference = baseline(4, args)
    # A process of tp 2 x dp 2, at a step chosen at random (printed: rerun with it).
    process, step = random.choice([0, 1, 2, 3]), random.randint(1, steps - 2)
    print(f"killing process {process} at step {step}")
    code, out, err = launch(5, 1, args + ["--fault-kill", f"{process}:{step}"])
    assert code == 0, f"exit {code}\n{out}\n{err}"
    assert f"process {process} (rank {process}) killed by signal 9" in err, err
    assert "recovered into epoch 1" in err, err
    check_equal(reference, losses(out), steps, f"process {process} killed at step {step}")


@needs_cli
@needs_binding
def test_data_parallel_rank_zero_killed_the_spare_takes_it_over():
    steps = 6
    args = ["--steps", steps, "--tp", 1, "--dp", 2, "--snapshot-every", 3]
    reference = baseline(2, args)
    code, out, err = launch(3, 1, args + ["--fault-kill", "0:4"])
    assert code == 0, f"exit {code}\n{out}\n{err}"
    assert "process 0 (rank 0) killed by signal 9" in err, err
    check_equal(reference, losses(out), steps, "process 0 killed at step 4")


@needs_cli
@needs_binding
def test_tensor_parallel_without_replicas_the_spare_gets_the_state_from_the_buddy_copy():
    # tp 2 x dp 1: no data-parallel replica, so every snapshot is shipped to the buddy rank
    # (the driver's C++ world) and the spare gets the dead rank's state from there.
    steps = 6
    args = ["--steps", steps, "--tp", 2, "--dp", 1, "--snapshot-every", 2]
    reference = baseline(2, args)
    code, out, err = launch(3, 1, args + ["--fault-kill", "1:5"])
    assert code == 0, f"exit {code}\n{out}\n{err}"
    assert "process 1 (rank 1) killed by signal 9" in err, err
    check_equal(reference, losses(out), steps, "process 1 killed at step 5, buddy copy")


@needs_cli
@needs_binding
def test_without_a_spare_the_world_shrinks_to_one_replica_and_the_losses_are_bitwise_equal():
    # dp 2 -> 1: the kept replica takes both micro-batches; its local sum of the two
    # gradients is the same two-term sum the all-reduce made. The same run as the spare's
    # above, so one reference serves both.
    steps = 7
    args = ["--steps", steps, "--tp", 2, "--dp", 2, "--snapshot-every", 2]
    reference = baseline(4, args)
    code, out, err = launch(4, 0, args + ["--fault-kill", "3:3"])
    assert code == 0, f"exit {code}\n{out}\n{err}"
    assert "shrink: True" in err, err
    check_equal(reference, losses(out), steps, "process 3 killed at step 3, no spare")


@needs_cli
@needs_binding
def test_a_state_provider_that_raises_ends_the_job_with_its_message():
    code, out, err = launch(3, 1, ["--steps", 4, "--fail-save-at", 2],
                            program=os.path.join(HERE, "resilient_worker.py"))
    assert code != 0 and code != 2, f"exit {code}\n{out}\n{err}"
    assert re.search(r"the state provider's save failed at step 2: ValueError: no state today", err), err
    # Every process of the world ends with the same line (the job's end), the spare too.
    assert err.count("error: ") >= 3, err
