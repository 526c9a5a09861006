"""python/bench/bench_torchft.py's command line: bad flags exit 2 with one `error:` line
naming the flag, before any process starts (the benchmark itself runs in docs/benchmarks.md,
not here: it takes minutes)."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_torchft.py"


def run(*args):
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                          timeout=60)


def test_help_exits_0_and_names_the_flags():
    p = run("--help")
    assert p.returncode == 0, p.stderr
    for flag in ("--procs", "--steps", "--repeats", "--timeout", "--heartbeat-ms", "--sides", "--kill-point"):
        assert flag in p.stdout
    assert "--worker" not in p.stdout  # internal


@pytest.mark.parametrize("args, names", [
    (["--procs", "1"], "--procs"),
    (["--procs", "4", "x"], "--procs"),
    (["--steps", "0"], "--steps"),
    (["--repeats", "-1"], "--repeats"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "60", "10", "--heartbeat-ms", "5000"], "--heartbeat-ms"),
    (["--timeout", "5", "--heartbeat-ms", "5000"], "--heartbeat-ms 5000"),
    (["--commgrid", "/nonexistent/commgrid"], "--commgrid"),
    (["--lighthouse", "/nonexistent/torchft_lighthouse", "--commgrid", sys.executable],
     "--lighthouse"),
    (["--format", "xml"], "--format"),
    (["--sides", "mpi"], "--sides"),
    (["--kill-point", "middle"], "--kill-point"),
])
def test_bad_flags_exit_2_naming_them(args, names):
    p = run(*args)
    assert p.returncode == 2, (args, p.returncode, p.stderr)
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, p.stderr
    assert names in errors[0], (names, errors[0])
    assert p.stdout == ""
