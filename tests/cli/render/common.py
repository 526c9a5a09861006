"""Helpers for the picture and topology tests: run the built commgrid, report failures."""
import json
import subprocess
import sys

FAILURES = []


def run(exe, *args, timeout=120):
    """Runs `commgrid plan ARGS`; returns the CompletedProcess (text mode)."""
    return subprocess.run([exe, "plan", *args], capture_output=True, text=True, timeout=timeout)


def plan_groups(exe, *layout):
    """The groups of every kind, from the JSON output (the reference the pictures must match)."""
    p = run(exe, *layout, "--format", "json")
    check(p.returncode == 0, f"plan json {layout}: exit {p.returncode}: {p.stderr}")
    return json.loads(p.stdout)["groups"]


def check(cond, message):
    if not cond:
        FAILURES.append(message)
        print("FAIL", message, file=sys.stderr)
    return cond


def finish(name):
    if FAILURES:
        print(f"{name}: {len(FAILURES)} failure(s)", file=sys.stderr)
        return 1
    print(f"{name}: ok")
    return 0
