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


class WholeRunWithoutAGpu(unittest.TestCase):
    def test_ends_non_zero_counting_every_device_test(self):
        p, ok, bad = run([], env={"BUILD": BUILD, "CONFIGURE": "0", "COMPILE": "0"})
        if re.search(r"^-- ok: GPUs visible", p.stdout, re.M):
            raise unittest.SkipTest("a GPU is visible: run scripts/gpu-check itself")
        self.assertEqual(p.returncode, 1)
        self.assertIn("-- FAILED: GPUs visible: none", p.stdout)
        skipped = re.findall(r"^  tests-1-rank: NcclDevice\.\w+ \(SKIPPED\)$", p.stdout, re.M)
        self.assertGreaterEqual(len(skipped), 10)
        for name in ("verify-1-split", "verify-1-member", "verify-1-per-group"):
            self.assertRegex(p.stdout, r"(?m)^  " + name + "$")
        # the GPU failure, every skipped device test, verify and bench init
        self.assertGreaterEqual(bad, 1 + len(skipped) + 4)
        self.assertGreater(ok, 10)  # prerequisites and host-side tests


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
