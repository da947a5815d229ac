"""Logits against an oracle's: every logit within RTOL of the largest, and greedy tokens
equal up to exact near-ties (the rationale for 1e-5 is in tests/oracle/test_oracle_hf.py's
docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from colibri import Session

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


# ---------------------------------------------------------- the families' oracle checks
# The 2026 families' oracles (gpt-oss, MiniMax-M2, ...) use issue 33's bound, 1e-4 of the
# largest logit, through these three checks instead of each test file's own copy.

FAMILY_RTOL = 1e-4


def assert_within(got: np.ndarray, ref: np.ndarray, what: str, rtol: float = FAMILY_RTOL) -> None:
    """Every value within ``rtol`` of the reference's largest magnitude."""
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    err, tol = float(np.abs(got - ref).max()), rtol * float(np.abs(ref).max())
    assert err <= tol, f"{what}: max |delta| {err:.3g} > {tol:.3g}"


def assert_decode_matches(
    session: Session, ids: list[int], ref: np.ndarray, what: str, rtol: float = FAMILY_RTOL
) -> None:
    """A fresh session fed the first half of ``ids`` as one prefill (every position
    compared), then the rest a token at a time (each decode step compared)."""
    half = len(ids) // 2
    assert_within(session.forward(ids[:half], all_logits=True), ref[:half],
                  f"{what} prefill half", rtol)  # fmt: skip
    for pos in range(half, len(ids)):
        assert_within(session.forward([ids[pos]]), ref[pos], f"{what} decode position {pos}",
                      rtol)  # fmt: skip


def assert_greedy_matches(
    session: Session, ids: list[int], ref_tokens: list[int], ref_logits: np.ndarray,
    rtol: float = FAMILY_RTOL,
) -> None:  # fmt: skip
    """Greedy from a fresh session: each step's logits within the bound of the oracle's,
    and the very same tokens."""
    logits = session.forward(ids)
    got: list[int] = []
    for i in range(len(ref_tokens)):
        got.append(int(np.argmax(logits)))
        assert_within(logits, ref_logits[i], f"greedy step {i}", rtol)
        logits = session.forward([got[-1]])
    assert got == ref_tokens
