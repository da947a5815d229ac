#!/usr/bin/env bash
# Builds scripts/attention_check.cpp for arm64 with the NEON kernels and runs it under
# qemu-aarch64 (Debian: g++-aarch64-linux-gnu, qemu-user). For x86 hosts without an arm64
# machine: the NEON attention kernels against the scalar reference, and their determinism.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"
# quant's dispatch table links every format's scalar and NEON kernels: all of csrc/quant
# but the x86 files.
quant=()
for f in csrc/quant/*.cpp; do [[ "$f" == *avx* ]] || quant+=("$f"); done
src=(scripts/attention_check.cpp csrc/attention/attention.cpp csrc/attention/attn_scalar.cpp
     csrc/attention/attn_neon.cpp csrc/attention/dispatch.cpp csrc/attention/reference.cpp
     "${quant[@]}" csrc/threadpool/threadpool.cpp)
aarch64-linux-gnu-g++ -std=c++17 -O2 -Wall -Wextra -DCOLIBRI_ARM=1 -Icsrc "${src[@]}" -static -pthread \
  -o "$out/attention_check"
qemu-aarch64 "$out/attention_check"
