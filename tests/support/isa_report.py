"""Which kernel ISAs a test run exercised, for the terminal summary (tests/conftest.py).

The kernel tests take an ``isa`` parameter over ``_core.quant.available_isas()`` (the ISAs
compiled in and supported by this CPU), so a host without AVX-512 VNNI silently tests fewer
kernels; this tally makes that visible. The NEON kernels cannot run on an x86 host: the
``test_neon_kernels_under_qemu`` tests (test_quant.py, test_kquants.py, test_neon_scripts.py)
cross-build them for AArch64 and run them under qemu-aarch64. docs/testing.md says what a
host without AVX-512 does not cover and how that is covered.
"""

from __future__ import annotations

from collections import Counter

import pytest

LABELS = {
    "scalar": "scalar reference",
    "avx2": "AVX2 (+FMA, F16C, BMI2)",
    "avx512": "AVX-512 F/BW/VL/DQ + VNNI",
    "neon": "NEON",
}
QEMU_TEST = "test_neon_kernels_under_qemu"


class IsaTally:
    """Passed and failed test calls per ISA parameter, and the NEON-under-qemu runs."""

    def __init__(self) -> None:
        self.passed: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.qemu_passed: Counter[str] = Counter()  # "file[param]" -> passed calls
        self.qemu_failed: Counter[str] = Counter()

    def record(self, item: pytest.Item, rep: pytest.TestReport) -> None:
        """Counts a test's call phase (after the skip policy has judged it)."""
        if rep.when != "call" or rep.skipped:
            return
        callspec = getattr(item, "callspec", None)
        params = getattr(callspec, "params", {})
        if item.name.startswith(QEMU_TEST):
            tally = self.qemu_passed if rep.passed else self.qemu_failed
            tally[f"{item.path.stem}[{getattr(callspec, 'id', '')}]"] += 1
        elif isinstance(params.get("isa"), str):
            (self.passed if rep.passed else self.failed)[params["isa"]] += 1

    def lines(self, available: list[str], known: list[str]) -> list[str]:
        """The summary: each ISA with the tests that ran on it, or why none did."""
        if not (self.passed or self.failed or self.qemu_passed or self.qemu_failed):
            return [f"  no kernel test ran (ISAs on this CPU: {', '.join(available)})"]
        out = []
        for isa in known:
            label = f"{isa} ({LABELS.get(isa, isa)})"
            ran = self.passed[isa] + self.failed[isa]
            if ran:
                failed = f", {self.failed[isa]} failed" if self.failed[isa] else ""
                out.append(f"  {label}: {ran} kernel tests ran{failed}")
            elif isa in available:
                out.append(f"  {label}: available on this CPU, no kernel test ran on it")
            elif isa == "neon":
                out.append(self._neon_line(label))
            else:
                out.append(f"  {label}: NOT COVERED: this CPU lacks it (docs/testing.md)")
        return out

    def _neon_line(self, label: str) -> str:
        runs = sorted(set(self.qemu_passed) | set(self.qemu_failed))
        if not runs:
            return (f"  {label}: NOT COVERED: no native NEON on this host, and no qemu-aarch64 "
                    f"check ({QEMU_TEST}) ran")
        names = ", ".join(f"{r}{' FAILED' if self.qemu_failed[r] else ''}" for r in runs)
        return f"  {label}: under qemu-aarch64: {names}"
