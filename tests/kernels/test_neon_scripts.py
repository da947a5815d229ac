"""The NEON kernels that test_quant.py and test_kquants.py do not reach, in every run: the
attention kernels (scripts/check_arm64_qemu.sh: scripts/attention_check.cpp, against the
scalar reference and across thread counts), the i-quant / MXFP4 dot kernels and the FP8 row
kernel (scripts/check_iquants_arm64_qemu.sh: scripts/iquant_neon_check.cpp and
fp8_neon_check.cpp, with and without the dot-product extension). Each script cross-builds
its check for AArch64 and runs it under qemu-aarch64 (scripts/test.sh installs both tools).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"attention": "check_arm64_qemu.sh", "iquants-mxfp4-fp8": "check_iquants_arm64_qemu.sh"}


@pytest.mark.parametrize("kernels", SCRIPTS)
def test_neon_kernels_under_qemu(tmp_path: Path, kernels: str) -> None:
    if not shutil.which("aarch64-linux-gnu-g++") or not shutil.which("qemu-aarch64"):
        pytest.fail("the NEON check needs aarch64-linux-gnu-g++ and qemu-aarch64: apt-get "
                    "install g++-aarch64-linux-gnu qemu-user (scripts/test.sh does)")
    out = subprocess.run(["bash", str(ROOT / "scripts" / SCRIPTS[kernels]), str(tmp_path)],
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
