"""Runs a worker script as N rank processes and reads each rank's last stdout line as its
JSON report: the one way the Python tests start torch.distributed ranks."""

import json
import subprocess
import sys
import time


def run_ranks(tmp_path, worker, world, extra_args, timeout=240):
    """Starts ``python worker RANK WORLD *extra_args`` for every rank, each writing to its own
    files (no pipe can fill up and block it). The first rank that fails ends the wait at once
    (the others would wait for it in a collective); every rank still running at the end,
    also after ``timeout`` seconds, is killed. Asserts that every rank exited 0 and returns
    their reports in rank order."""
    files = [(tmp_path / f"rank{r}.out", tmp_path / f"rank{r}.err") for r in range(world)]
    procs = []
    for r, (out_file, err_file) in enumerate(files):
        with open(out_file, "w") as out, open(err_file, "w") as err:
            procs.append(subprocess.Popen([sys.executable, worker, str(r), str(world),
                                           *[str(a) for a in extra_args]],
                                          stdout=out, stderr=err))
    deadline = time.monotonic() + timeout
    failed = None
    try:
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
            if failed is not None or all(c == 0 for c in codes):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = [(o.read_text(), e.read_text()) for o, e in files]
    assert failed is None, f"rank {failed} failed: {outputs[failed][1][-3000:]}"
    assert all(p.returncode == 0 for p in procs), f"ranks still running after {timeout} s"
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [r["rank"] for r in reports] == list(range(world))
    return reports
