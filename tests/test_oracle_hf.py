"""The forward pass against transformers, on each family's tiny F32 checkpoint.

Same weights, same F32 arithmetic up to summation order: every logit at every position must
agree to 1e-4 of the largest logit, whether the sequence is prefilled at once or decoded one
token at a time, and the greedy continuation must be the same tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

import colibri
from modelfactory import (
    FAMILIES,
    TinyModel,
    build_tiny_model,
    prompt_ids,
    reference_greedy,
    reference_logits,
    transformers_model,
)

RTOL = 1e-5  # of max |logit|; see the module docstring (measured <= 1.2e-6)
N_PROMPT = 32
N_GREEDY = 20
VARIANTS = [(f, small) for small in (False, True) for f in FAMILIES]


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


def load(path: object) -> colibri.Model:
    return colibri.Model.load(path, engine=colibri.EngineConfig(context_length=128))


@pytest.fixture(scope="module", params=VARIANTS,
                ids=[f"{f}-small" if small else f for f, small in VARIANTS])
def tiny_model(request: pytest.FixtureRequest) -> TinyModel:
    """Each family's model, and its small-residual variant (hidden states ~1e-3)."""
    family, small = request.param
    return build_tiny_model(family, small=small)


@pytest.fixture(scope="module")
def reference(tiny_model: TinyModel) -> tuple[list[int], np.ndarray]:
    ids = prompt_ids(N_PROMPT)
    return ids, reference_logits(transformers_model(str(tiny_model.hf_dir)), ids)


def test_prefill_matches_transformers(
    tiny_model: TinyModel, reference: tuple[list[int], np.ndarray]
) -> None:
    ids, ref = reference
    s = load(tiny_model.hf_dir).session()
    got = s.forward(ids, all_logits=True)
    assert s.n_tokens == N_PROMPT
    assert_logits_close(got, ref, f"{tiny_model.family} prefill")


def test_last_position_and_numpy_input(
    tiny_model: TinyModel, reference: tuple[list[int], np.ndarray]
) -> None:
    ids, ref = reference
    s = load(tiny_model.hf_dir).session()
    last = s.forward(np.asarray(ids, dtype=np.int64))
    assert last.shape == (ref.shape[1],)
    assert_logits_close(last, ref[-1], f"{tiny_model.family} last position")


def test_prefill_then_decode_matches_transformers(
    tiny_model: TinyModel, reference: tuple[list[int], np.ndarray]
) -> None:
    ids, ref = reference
    half = N_PROMPT // 2
    s = load(tiny_model.hf_dir).session()
    assert_logits_close(
        s.forward(ids[:half], all_logits=True), ref[:half], f"{tiny_model.family} prefill"
    )
    for pos in range(half, N_PROMPT):
        got = s.forward([ids[pos]])
        assert_logits_close(got, ref[pos], f"{tiny_model.family} decode position {pos}")
    assert s.n_tokens == N_PROMPT


def test_reset_gives_the_same_logits(
    tiny_model: TinyModel, reference: tuple[list[int], np.ndarray]
) -> None:
    ids, _ = reference
    s = load(tiny_model.hf_dir).session()
    first = s.forward(ids, all_logits=True)
    s.reset()
    assert s.n_tokens == 0
    np.testing.assert_array_equal(s.forward(ids, all_logits=True), first)


def test_greedy_continuation_matches_transformers(tiny_model: TinyModel) -> None:
    ids = prompt_ids(N_PROMPT)
    ref_tokens, ref_logits = reference_greedy(
        transformers_model(str(tiny_model.hf_dir)), ids, N_GREEDY
    )
    s = load(tiny_model.hf_dir).session()
    logits = s.forward(ids)
    got: list[int] = []
    for _ in range(N_GREEDY):
        got.append(int(np.argmax(logits)))
        logits = s.forward([got[-1]])
    assert_same_greedy(got, ref_tokens, ref_logits, tiny_model.family)
