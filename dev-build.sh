#!/usr/bin/env bash
# Developer build: compiles colibri._core into build/dev/<name>/colibri/ so several
# checkouts or people can build side by side. Use with PYTHONPATH=python:build/dev/<name>
# (colibri/__init__.py extends its package path to find _core there).
set -euo pipefail
name="${1:-default}"
here="$(cd "$(dirname "$0")" && pwd)"
bdir="$here/build/dev/$name"
py="${PYTHON:-$here/.venv/bin/python}"
cmake -S "$here" -B "$bdir/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$py" -Dpybind11_DIR="$("$py" -c 'import pybind11;print(pybind11.get_cmake_dir())')" \
  -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$bdir/colibri" >/dev/null
cmake --build "$bdir/cmake" -j "${JOBS:-2}"
