#!/usr/bin/env bash
# Developer build: compiles colibri._core and colibri._bench (the benchmark harnesses)
# into build/dev/<name>/colibri/ so several checkouts or people can build side by side.
# Use with PYTHONPATH=python:build/dev/<name> (colibri/__init__.py extends its package
# path to find them there).
#
# Two names select sanitizer builds (scripts/sanitize.sh runs the tests under them),
# without colibri._bench (no sanitizer test set needs it; timings under a sanitizer mean
# nothing):
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer, every report fatal
#   tsan  ThreadSanitizer
# Python is not built with them, so the runtime library must be preloaded:
#   LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 ...
#   LD_PRELOAD=$(g++ -print-file-name=libtsan.so) ...
# Any other name is an ordinary Release build. COLIBRI_BENCH=OFF leaves colibri._bench
# out of any build (a quicker relink when only tests run, as for scripts/mutate.py).
set -euo pipefail
name="${1:-default}"
here="$(cd "$(dirname "$0")" && pwd)"
bdir="$here/build/dev/$name"
py="${PYTHON:-$here/.venv/bin/python}"
build_type=Release
sanitize=""
bench="${COLIBRI_BENCH:-ON}"
optimize="-O2 -g -DNDEBUG"  # RelWithDebInfo's flags (sanitizer builds only)
case "$name" in
  asan)
    # -O1 -g1 (line tables): ASan's recommended level, and the quickest build for CI.
    # GCC 12's -Wmaybe-uninitialized misfires inside std::function and the AVX-512
    # intrinsics headers once the code is instrumented; the Release build keeps it.
    build_type=RelWithDebInfo
    bench=OFF
    optimize="-O1 -g1 -DNDEBUG"
    sanitize="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
    sanitize="$sanitize -Wno-maybe-uninitialized" ;;
  tsan)
    # -O1 -g1 as for asan: TSan's overhead does not depend on it much, and the build is
    # the slow part of a TSan pass on a small machine.
    # GCC 12 reports -Wmaybe-uninitialized / -Wuninitialized inside avx512fintrin.h once
    # the code is instrumented (the intrinsics' deliberately undefined __m512 temporaries,
    # _mm512_undefined_*); the Release build keeps both warnings.
    build_type=RelWithDebInfo
    bench=OFF
    optimize="-O1 -g1 -DNDEBUG"
    sanitize="-fsanitize=thread -fno-omit-frame-pointer"
    sanitize="$sanitize -Wno-maybe-uninitialized -Wno-uninitialized" ;;
esac
cmake -S "$here" -B "$bdir/cmake" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" -DCOLIBRI_BENCH="$bench" \
  -DCMAKE_CXX_FLAGS="$sanitize" -DCMAKE_MODULE_LINKER_FLAGS="$sanitize" \
  -DCMAKE_SHARED_LINKER_FLAGS="$sanitize" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$optimize" \
  -DPython_EXECUTABLE="$py" -Dpybind11_DIR="$("$py" -c 'import pybind11;print(pybind11.get_cmake_dir())')" \
  -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$bdir/colibri" >/dev/null
cmake --build "$bdir/cmake" -j "${JOBS:-2}"
