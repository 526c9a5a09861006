"""`pip install .` of the repository into a fresh virtual environment, offline: the build
dependencies (scikit-build-core, pybind11, numpy) come from the wheelhouse that
scripts/install-venv fills (COMMGRID_WHEELHOUSE), CMake and the compiler from the machine.
The installed package imports outside the source tree and computes a layout. Without CMake,
or without a C++ compiler, pip stops with a line naming which."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
WHEELHOUSE = os.environ.get("COMMGRID_WHEELHOUSE", "")
NEEDED = ("scikit_build_core-", "pybind11-", "numpy-", "packaging-", "pathspec-")


def _wheelhouse_or_skip():
    if not WHEELHOUSE or not os.path.isdir(WHEELHOUSE):
        pytest.skip(f"no wheelhouse at {WHEELHOUSE!r} (scripts/install-venv fills it; ctest sets "
                    "COMMGRID_WHEELHOUSE)")
    have = os.listdir(WHEELHOUSE)
    missing = [n for n in NEEDED if not any(h.startswith(n) for h in have)]
    if missing:
        pytest.skip(f"the wheelhouse {WHEELHOUSE} lacks {missing} (run scripts/install-venv)")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    _wheelhouse_or_skip()
    base = os.environ.get("COMMGRID_BASE_PYTHON", "/usr/bin/python3")
    path = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([base, "-m", "venv", str(path)], check=True, timeout=120)
    return path


def pip_install(venv, env, timeout):
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
           "--no-index", "--find-links", WHEELHOUSE, ROOT]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def bin_dir_with(tmp_path, names):
    """A PATH folder holding links to just the named programs (those found)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in names:
        found = shutil.which(name)
        if found:
            os.symlink(found, folder / name)
    return str(folder)


def test_without_cmake_pip_says_so(venv, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CMAKE_CXX_COMPILER_LAUNCHER")}
    env["PATH"] = bin_dir_with(tmp_path, ["c++", "g++", "cc", "gcc", "ninja"])
    result = pip_install(venv, env, timeout=300)
    assert result.returncode != 0
    assert "error: pip install commgrid: CMake >= 3.25 is not on PATH" in result.stdout + result.stderr


def test_without_compiler_pip_says_so(venv, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CMAKE_CXX_COMPILER_LAUNCHER")}
    env["PATH"] = bin_dir_with(tmp_path, ["cmake", "ninja"])
    result = pip_install(venv, env, timeout=300)
    assert result.returncode != 0
    assert "error: pip install commgrid: no C++ compiler" in result.stdout + result.stderr
    env["CXX"] = "/nonexistent/c++"
    result = pip_install(venv, env, timeout=300)
    assert result.returncode != 0
    assert "no C++ compiler: CXX=/nonexistent/c++ is not found" in result.stdout + result.stderr


def test_install_and_import_in_a_fresh_venv(venv, tmp_path):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if shutil.which("ccache"):
        env.setdefault("CMAKE_CXX_COMPILER_LAUNCHER", "ccache")
    result = pip_install(venv, env, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    code = ("import commgrid, os; print(os.path.dirname(commgrid.__file__)); "
            "print(commgrid.Layout(8, tp=2, pp=2).groups('tp')); print(commgrid.__version__)")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    where, groups, version = out.stdout.split("\n")[:3]
    assert where.startswith(str(venv)), where  # the installed copy, not the source tree
    assert groups == "[[0, 1], [2, 3], [4, 5], [6, 7]]"
    assert version == "0.1.0"
    # The compiled module and the pure-Python subpackage were both installed.
    files = os.listdir(where)
    assert any(f.startswith("_commgrid") and f.endswith(".so") for f in files), files
    assert os.path.isfile(os.path.join(where, "torch", "_mesh.py"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
