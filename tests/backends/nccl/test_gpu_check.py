"""scripts/gpu-check's own logic, on a machine without a GPU: how it counts a gtest run
(every skip is a failure), its prerequisite check, and a whole run against an existing
build, which must end non-zero with one `N passed, M failed` line. Where a GPU is visible
the whole-run case is skipped, saying so: gpu-check itself is the check there."""
import os
import re
import subprocess
import sys
import tempfile
import unittest

SCRIPT = sys.argv[1]
BUILD = sys.argv[2]
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed$")


def run(args, env=None, timeout=600):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([SCRIPT] + args, env=e, capture_output=True, text=True, timeout=timeout)
    lines = p.stdout.rstrip("\n").split("\n")
    m = SUMMARY.match(lines[-1])
    assert m, "no summary line at the end:\n" + p.stdout[-2000:] + p.stderr[-2000:]
    return p, int(m.group(1)), int(m.group(2))


def gtest_output(ok=(), failed=(), skipped=()):
    out = ["[==========] Running tests."]
    for t in ok:
        out += ["[ RUN      ] " + t, "[       OK ] %s (3 ms)" % t]
    for t in failed:
        out += ["[ RUN      ] " + t, "x.cpp:1: Failure", "[  FAILED  ] %s (4 ms)" % t]
    for t in skipped:
        out += ["[ RUN      ] " + t, "x.cpp:2: Skipped", "no CUDA device (test)",
                "[  SKIPPED ] %s (0 ms)" % t]
    # gtest's closing lists name each case again, without a time: not counted twice
    out += ["[  PASSED  ] %d tests." % len(ok)]
    out += ["[  SKIPPED ] " + t for t in skipped]
    out += ["[  FAILED  ] " + t for t in failed]
    return "\n".join(out) + "\n"


class CountGtest(unittest.TestCase):
    def count(self, text, rc):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        try:
            return run(["--count-gtest", f.name, "tests-1-rank", str(rc)])
        finally:
            os.unlink(f.name)

    def test_every_skip_counts_as_a_failure(self):
        p, ok, bad = self.count(gtest_output(ok=["A.a", "A.b", "A.c"], failed=["B.a"],
                                             skipped=["C.a", "C.b"]), 1)
        self.assertEqual((ok, bad), (3, 3))
        self.assertEqual(p.returncode, 1)
        self.assertIn("tests-1-rank: C.b (SKIPPED)", p.stdout)
        self.assertIn("tests-1-rank: B.a (FAILED)", p.stdout)

    def test_all_passed_is_exit_zero(self):
        p, ok, bad = self.count(gtest_output(ok=["A.a", "A.b"]), 0)
        self.assertEqual((ok, bad, p.returncode), (2, 0, 0))

    def test_only_skips_is_never_zero_failed(self):
        p, ok, bad = self.count(gtest_output(skipped=["D.a", "D.b", "D.c"]), 0)
        self.assertEqual((ok, bad, p.returncode), (0, 3, 1))

    def test_a_crash_after_passing_cases_fails(self):
        p, ok, bad = self.count(gtest_output(ok=["A.a"]) + "Segmentation fault\n", 139)
        self.assertEqual((ok, bad, p.returncode), (1, 1, 1))
        self.assertIn("exited 139 without a failed case", p.stdout)

    def test_a_run_of_no_test_fails(self):
        p, ok, bad = self.count("error while loading shared libraries: libnccl.so.2\n", 127)
        self.assertEqual((ok, bad, p.returncode), (0, 1, 1))
        self.assertIn("ran no test (exit 127)", p.stdout)


class Prerequisites(unittest.TestCase):
    def test_missing_headers_are_named_and_nothing_is_built(self):
        p, ok, bad = run([], env={"GPU_CHECK_INCLUDE_PATH": "/nonexistent", "BUILD": BUILD,
                                  "CONFIGURE": "0", "COMPILE": "0"})
        self.assertEqual(p.returncode, 1)
        self.assertIn("FAILED: Gloo, the NCCL tests' bootstrap: no gloo/allreduce.h under "
                      "/nonexistent (Debian: libgloo-dev)", p.stdout)
        self.assertIn("FAILED: NCCL headers: no nccl.h", p.stdout)
        self.assertIn("error: prerequisites missing", p.stdout)
        self.assertNotIn("== tests-1-rank", p.stdout)
        self.assertGreaterEqual(bad, 8)


def probe(driver, runtime, rc, gpus, why=""):
    """A file of the CUDA probe's answers, as GPU_CHECK_PROBE reads them."""
    f = tempfile.NamedTemporaryFile("w", suffix=".probe", delete=False)
    f.write("COUNT_RC=%d\nDRIVER_CODE=%d\nRUNTIME_CODE=%d\nDRIVER=%d.%d\nRUNTIME=%d.%d\n"
            "GPUS=%d\nWHY=%s\n" % (rc, driver, runtime, driver // 1000, driver % 1000 // 10,
                                   runtime // 1000, runtime % 1000 // 10, gpus, why))
    f.close()
    return f.name


class DriverAndBudget(unittest.TestCase):
    # GPU_CHECK_BUDGET=5: too little left for any step, so the run ends right after the
    # driver check, every step counted as not run.
    def driver_line(self, driver, runtime, rc, gpus=1, why=""):
        path = probe(driver, runtime, rc, gpus, why)
        try:
            p, ok, bad = run([], env={"BUILD": BUILD, "CONFIGURE": "0", "COMPILE": "0",
                                      "GPU_CHECK_PROBE": path, "GPU_CHECK_BUDGET": "5"})
        finally:
            os.unlink(path)
        line = [l for l in p.stdout.split("\n") if l.startswith(("-- ok: CUDA driver", "-- FAILED: CUDA driver"))]
        self.assertEqual(len(line), 1, p.stdout)
        return p, line[0]

    def test_an_older_minor_version_of_the_same_major_runs(self):
        p, line = self.driver_line(13000, 13010, 0)
        self.assertEqual(line, "-- ok: CUDA driver 13.0 runs runtime 13.1 (minor version compatibility)")

    def test_an_older_major_version_or_insufficient_driver_fails(self):
        p, line = self.driver_line(12080, 13000, 0)
        self.assertTrue(line.startswith("-- FAILED: CUDA driver: driver 12.8 cannot run runtime 13.0"), line)
        p, line = self.driver_line(13000, 13000, 35, 0, "CUDA driver version is insufficient for CUDA runtime version")
        self.assertIn("cannot run runtime 13.0 (CUDA driver version is insufficient", line)

    def test_a_run_out_of_time_counts_every_step_it_did_not_run(self):
        p, line = self.driver_line(13000, 13000, 0, gpus=2)
        self.assertEqual(p.returncode, 1)
        for name in ("tests-1-rank", "verify-1-split", "bench-init-1", "tests-2-ranks", "bench-collectives-2"):
            self.assertRegex(p.stdout, r"(?m)^-- FAILED: " + name + r": not run: out of time \(GPU_CHECK_BUDGET=5 s\)$")
        self.assertNotIn("== tests-1-rank:", p.stdout)


class WholeRunWithoutAGpu(unittest.TestCase):
    def test_ends_non_zero_counting_every_device_test(self):
        p, ok, bad = run([], env={"BUILD": BUILD, "CONFIGURE": "0", "COMPILE": "0"})
        if re.search(r"^-- ok: GPUs visible", p.stdout, re.M):
            raise unittest.SkipTest("a GPU is visible: run scripts/gpu-check itself")
        self.assertEqual(p.returncode, 1)
        self.assertIn("-- FAILED: GPUs visible: none", p.stdout)
        skipped = re.findall(r"^  tests-1-rank: NcclDevice\.\w+ \(SKIPPED\)$", p.stdout, re.M)
        self.assertGreaterEqual(len(skipped), 10)
        # the recovery device tests run with one GPU too, so here they count as failed
        recovery = re.findall(r"^  tests-1-rank: NcclRecoveryDevice\.\w+ \(SKIPPED\)$", p.stdout, re.M)
        self.assertGreaterEqual(len(recovery), 3)
        self.assertNotRegex(p.stdout, r"(?m)^  tests-1-rank: NcclRecoveryDeviceMulti\.")
        skipped += recovery
        for name in ("verify-1-split", "verify-1-member", "verify-1-per-group"):
            self.assertRegex(p.stdout, r"(?m)^  " + name + "$")
        # the GPU failure, every skipped device test, verify and bench init
        self.assertGreaterEqual(bad, 1 + len(skipped) + 4)
        self.assertGreater(ok, 10)  # prerequisites and host-side tests


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
