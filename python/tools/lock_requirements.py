"""Writes the hash-pinned lock files of the Python environment from their inputs:

    python/requirements.in          -> python/requirements.txt
    python/requirements-megatron.in -> python/requirements-megatron.txt

Run with the environment's interpreter (it asks pip which files it would install, without
installing anything):

    .venv/bin/python python/tools/lock_requirements.py

pip resolves each input for this interpreter and platform (CPython 3.11, Linux x86_64);
every package is written as ``name==version --hash=sha256:...`` of the file pip chose, so
``pip install --require-hashes`` installs exactly these files. megatron-core is resolved
alone with --no-deps --ignore-requires-python (it declares Python >= 3.12; see
docs/python.md), its dependencies coming from the main lock.
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)


def resolve(input_file, extra_args):
    """[(name, version, sha256)] of what pip would install for ``input_file``."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run",
                        "--ignore-installed", "--report", report, "-r", input_file] + extra_args,
                       check=True)
        with open(report) as f:
            data = json.load(f)
    out = []
    for item in data["install"]:
        meta = item["metadata"]
        hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise SystemExit(f"error: no sha256 for {meta['name']} ({item['download_info']['url']})")
        out.append((meta["name"].lower(), meta["version"], hashes["sha256"]))
    return sorted(out)


def write(output_file, input_name, packages):
    with open(output_file, "w") as f:
        f.write(f"# Written by python/tools/lock_requirements.py from {input_name}: do not edit.\n")
        f.write("# CPython 3.11, Linux x86_64 (Debian 12).\n")
        for name, version, sha in packages:
            f.write(f"{name}=={version} --hash=sha256:{sha}\n")


def main():
    for stem, extra in (("requirements", []),
                        ("requirements-megatron", ["--no-deps", "--ignore-requires-python"])):
        packages = resolve(os.path.join(PYTHON_DIR, stem + ".in"), extra)
        write(os.path.join(PYTHON_DIR, stem + ".txt"), stem + ".in", packages)
        print(f"{stem}.txt: {len(packages)} packages")


if __name__ == "__main__":
    main()
