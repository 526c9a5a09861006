"""The build backend of ``pip install .`` (pyproject.toml): scikit-build-core, after a check
that what it cannot fetch itself is there. Without CMake >= 3.25 or a C++20 compiler, pip
stops at once with one line saying which is missing (scikit-build-core alone would try to
fetch CMake from the package index, and a missing compiler fails deep in CMake's output)."""

import os
import re
import shutil
import subprocess
import sys

from scikit_build_core import build as _backend
from scikit_build_core.build import (build_sdist, get_requires_for_build_sdist,  # noqa: F401
                                     prepare_metadata_for_build_wheel)

CMAKE_MIN = (3, 25)
COMPILERS = ("c++", "g++", "clang++")


def _cmake_problem():
    cmake = shutil.which("cmake")
    if cmake is None:
        return (f"CMake >= {CMAKE_MIN[0]}.{CMAKE_MIN[1]} is not on PATH "
                "(Debian: apt-get install cmake)")
    out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"(\d+)\.(\d+)", out)
    if found is None or tuple(int(x) for x in found.groups()) < CMAKE_MIN:
        return (f"{cmake} is CMake {found.group(0) if found else '(unknown version)'}, "
                f"commgrid needs >= {CMAKE_MIN[0]}.{CMAKE_MIN[1]}")
    return None


def _compiler_problem():
    cxx = os.environ.get("CXX")
    if cxx:
        if shutil.which(cxx.split()[0]) is None:
            return f"no C++ compiler: CXX={cxx} is not found"
        return None
    if not any(shutil.which(c) for c in COMPILERS):
        return ("no C++ compiler: none of " + ", ".join(COMPILERS) + " is on PATH and CXX is not "
                "set (Debian: apt-get install g++; commgrid needs C++20: GCC >= 11 or Clang >= 14)")
    return None


def _check():
    problems = [p for p in (_cmake_problem(), _compiler_problem()) if p]
    if problems:
        for p in problems:
            sys.stderr.write(f"error: pip install commgrid: {p}\n")
        raise SystemExit(1)


def get_requires_for_build_wheel(config_settings=None):
    _check()
    return _backend.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings=None):
    _check()
    return _backend.get_requires_for_build_editable(config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _check()
    return _backend.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _check()
    return _backend.build_editable(wheel_directory, config_settings, metadata_directory)
