#!/usr/bin/env bash
# Builds the core with sanitizers and runs the tests of its concurrent parts under them
# (docs/reliability.md, "Sanitizers"):
#
#   scripts/sanitize.sh asan [pytest args]   AddressSanitizer + UBSan (build/dev/asan)
#   scripts/sanitize.sh tsan [pytest args]   ThreadSanitizer (build/dev/tsan)
#   scripts/sanitize.sh all  [pytest args]   both, one after the other
#   scripts/sanitize.sh ci                   ASan + UBSan on the subset scripts/test.sh runs
#                                            (sized to about 5 minutes on 2 cores)
#
# Without pytest args it runs the default set below (thread pool, read pool and I/O,
# expert cache and streaming, sessions under threads and interruption); with args, those
# (test files, -k expressions...). Python itself is not instrumented: the sanitizer's
# runtime is preloaded. ASan's leak check is off (CPython keeps objects alive at exit on
# purpose); every ASan/UBSan report is fatal. A TSan report makes the run exit 66.
# PYTHON selects the interpreter (default .venv/bin/python), CXX the compiler whose
# runtime libraries are preloaded (default g++).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
cxx="${CXX:-g++}"
mode="${1:-all}"
shift || true
DEFAULT_TESTS=(
  tests/kernels/test_threadpool.py
  tests/engine/test_io.py
  tests/engine/test_streaming.py
  tests/engine/test_streaming_faults.py
  tests/engine/test_streaming_stats.py
  tests/engine/test_streaming_layout.py
  tests/generate/test_session_safety.py
)
# Timing and memory figures measure the sanitizer, not the code: CPU used per wall second
# (wait policies, idle pools) and RSS (ASan's quarantine and shadow memory).
NOT_UNDER_SANITIZERS="not cpu and not caller_wait and not hybrid_spin and not peak_rss"
NOT_UNDER_SANITIZERS="$NOT_UNDER_SANITIZERS and not memory_of_weights"
if [ "$#" -gt 0 ]; then tests=("$@"); else tests=("${DEFAULT_TESTS[@]}" -k "$NOT_UNDER_SANITIZERS"); fi
# CI: the same parts without the slowest cases (the demo-MoE build, the full streaming
# grid: both exercise the same code as the cases kept, at 10x the time).
CI_TESTS=(
  tests/kernels/test_lane_pack.py
  tests/kernels/test_threadpool.py
  tests/engine/test_io.py
  tests/generate/test_session_safety.py
  tests/engine/test_streaming_faults.py
  tests/engine/test_streaming.py
  -k "$NOT_UNDER_SANITIZERS and not demo_moe and not grid"
)

run() {
  local name="$1" lib="$2"
  local runtime stdcxx
  runtime="$("$cxx" -print-file-name="$lib")"
  [ -f "$runtime" ] || { echo "sanitize.sh: $lib not found (install gcc's sanitizer runtime)" >&2; exit 2; }
  # libstdc++ too: the runtime's __cxa_throw interceptor must find the real one at start
  # (python itself does not link libstdc++), or the first C++ exception aborts.
  stdcxx="$("$cxx" -print-file-name=libstdc++.so)"
  echo "== $name: build" >&2
  ./dev-build.sh "$name" >/dev/null
  if [ "$name" = tsan ]; then  # the negative control: the setup must report a known race
    "$cxx" -O1 -g -fsanitize=thread -fPIC -shared scripts/tsan_canary.cpp \
      -o "build/dev/tsan/canary.so"
    local rc=0
    env LD_PRELOAD="$runtime $stdcxx" TSAN_OPTIONS="exitcode=66" "$py" -c \
      "import ctypes; ctypes.CDLL('build/dev/tsan/canary.so').colibri_tsan_canary()" \
      2>/dev/null || rc=$?
    [ "$rc" = 66 ] || { echo "sanitize.sh: TSan did not report the canary's race (exit $rc)" >&2; exit 2; }
    echo "== tsan: the canary's race was reported (the setup sees races)" >&2
  fi
  echo "== $name: ${tests[*]}" >&2
  env LD_PRELOAD="$runtime $stdcxx" PYTHONPATH="python:build/dev/$name" \
    ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0:${ASAN_OPTIONS:-}" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}" \
    TSAN_OPTIONS="exitcode=66:halt_on_error=0:second_deadlock_stack=1:${TSAN_OPTIONS:-}" \
    "$py" -m pytest -q -p no:cacheprovider "${tests[@]}"
}

case "$mode" in
  ci) tests=("${CI_TESTS[@]}"); run asan libasan.so ;;
  asan) run asan libasan.so ;;
  tsan) run tsan libtsan.so ;;
  all) run asan libasan.so; run tsan libtsan.so ;;
  *) echo "usage: scripts/sanitize.sh asan|tsan|all [pytest args] | ci" >&2; exit 2 ;;
esac
