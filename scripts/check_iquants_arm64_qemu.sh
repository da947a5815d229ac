#!/usr/bin/env bash
# Builds scripts/iquant_neon_check.cpp for arm64 with the NEON kernels and runs it under
# qemu-aarch64 (Debian: g++-aarch64-linux-gnu, qemu-user): the NEON i-quant / MXFP4 dot
# kernels against the scalar reference, bit for bit (and scripts/fp8_neon_check.cpp: the FP8
# row kernel within its rounding bound), on an x86 host without an arm64
# machine. Twice: plain ARMv8-A (widening-multiply path) and ARMv8.2-A with the dot-product
# extension (SDOT path; qemu's default CPU model, max, has it).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"
# quant's dispatch table links every format's scalar and NEON kernels: all of csrc/quant
# but the x86 files.
quant=()
for f in csrc/quant/*.cpp; do [[ "$f" == *avx* ]] || quant+=("$f"); done
for arch in armv8-a armv8.2-a+dotprod; do
  aarch64-linux-gnu-g++ -std=c++17 -O2 -Wall -Wextra -Werror -march="$arch" -DCOLIBRI_ARM=1 -Icsrc \
    scripts/iquant_neon_check.cpp "${quant[@]}" -static -pthread -o "$out/iquant_check_${arch//[.+]/_}"
  aarch64-linux-gnu-g++ -std=c++17 -O2 -Wall -Wextra -Werror -march="$arch" -DCOLIBRI_ARM=1 -Icsrc \
    scripts/fp8_neon_check.cpp "${quant[@]}" -static -pthread -o "$out/fp8_check_${arch//[.+]/_}"
  echo "== -march=$arch"
  qemu-aarch64 "$out/iquant_check_${arch//[.+]/_}"
  qemu-aarch64 "$out/fp8_check_${arch//[.+]/_}"
done
