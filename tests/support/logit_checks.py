"""Logits against an oracle's: every logit within RTOL of the largest, and greedy tokens
equal up to exact near-ties (the rationale for 1e-5 is in tests/oracle/test_oracle_hf.py's
docstring)."""

from __future__ import annotations

import numpy as np

RTOL = 1e-5  # of max |logit|; see the module docstring (measured <= 1.2e-6)


def assert_logits_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert got.dtype == np.float32
    err = float(np.abs(got - ref).max())
    tol = RTOL * float(np.abs(ref).max())
    assert err <= tol, f"{what}: max |delta| {err:.3g} > {tol:.3g}"


def assert_same_greedy(got: list[int], ref: list[int], ref_logits: np.ndarray, what: str) -> None:
    """Identical tokens, except that a divergence at an exact near-tie (top-2 logits closer
    than the tolerance) ends the comparison instead of failing it."""
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        if a == b:
            continue
        row = ref_logits[i]
        gap = abs(float(row[a] - row[b]))
        assert gap <= RTOL * float(np.abs(row).max()), (
            f"{what}: greedy token {i} is {a}, transformers chose {b} "
            f"(logit gap {gap:.3g}); colibri {got}, transformers {ref}"
        )
        return
