"""The delta rule's kernels (csrc/model/linear_attn_kernels*): every ISA this CPU runs
against the scalar reference, and both forms against a float64 NumPy recurrence.

* Bit-identical across ISAs: the SIMD kernels vectorize over the state's columns only and
  keep the reference's multiply-then-add order per element (no FMA), so scalar, AVX2 and
  AVX-512 give the same bits, for both forms, both decay kinds (one per token: Gated
  DeltaNet; one per key channel: Kimi Delta Attention) and head sizes that leave column
  remainders for every vector width (13, 37, 129...), prompts of 1 to 131 tokens (a
  chunk and a short one).
* Against float64: the outputs within 2e-5 of the largest |output| (measured ~1e-6 over
  131 tokens; q and k L2-normed and beta < 1 as in the layers keep S bounded, so the error
  is float32 rounding of sums over dk terms, not growth).
* A tiny Qwen3-Next model gives the same logits bit for bit with each ISA's kernels
  selected (``linear_attn.set_isa``), chunked and recurrent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from colibri import _core

L = _core.linear_attn
ISAS = [i for i in _core.quant.available_isas() if i != "neon"]
SHAPES = [(16, 16), (13, 37), (128, 128), (5, 129), (64, 200), (33, 8)]
TOL = 2e-5


def _inputs(seed: int, n: int, dk: int, dv: int, channel: bool) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)

    def unit(x: np.ndarray) -> np.ndarray:
        return (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)).astype(np.float32)

    q = unit(rng.standard_normal((n, dk))) / np.float32(np.sqrt(dk))
    k = unit(rng.standard_normal((n, dk)))
    v = rng.standard_normal((n, dv)).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal(n)))).astype(np.float32)
    g = -np.exp(rng.uniform(-4, 0.5, (n, dk) if channel else n)).astype(np.float32)
    S = (0.1 * rng.standard_normal((dk, dv))).astype(np.float32)
    return q.astype(np.float32), k, v, beta, g, S


def _reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray, g: np.ndarray, S: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The recurrent form in float64."""
    S = S.astype(np.float64)
    out = np.zeros((q.shape[0], v.shape[1]))
    for t in range(q.shape[0]):
        decay = np.exp(g[t].astype(np.float64))
        S = S * (decay[:, None] if decay.ndim else decay)
        d = beta[t] * (v[t] - S.T @ k[t])
        S = S + np.outer(k[t], d)
        out[t] = S.T @ q[t]
    return out, S


@pytest.mark.parametrize("channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("chunked", [False, True], ids=["recurrent", "chunked"])
@pytest.mark.parametrize(("dk", "dv"), SHAPES)
def test_every_isa_gives_the_scalar_bits(dk: int, dv: int, chunked: bool, channel: bool) -> None:
    for n in (1, 7, 64, 131):
        args = _inputs(dk * 1000 + dv + n, n, dk, dv, channel)
        ref_out, ref_S = L.delta_rule(*args, chunked=chunked, isa="scalar")
        for isa in ISAS:
            out, S = L.delta_rule(*args, chunked=chunked, isa=isa)
            assert np.array_equal(out, ref_out), (isa, n)
            assert np.array_equal(S, ref_S), (isa, n)


@pytest.mark.parametrize("channel", [False, True], ids=["gdn", "kda"])
@pytest.mark.parametrize("chunked", [False, True], ids=["recurrent", "chunked"])
@pytest.mark.parametrize(("dk", "dv"), [(13, 37), (128, 128)])
def test_both_forms_match_float64(dk: int, dv: int, chunked: bool, channel: bool) -> None:
    args = _inputs(7, 131, dk, dv, channel)
    want_out, want_S = _reference(*args)
    out, S = L.delta_rule(*args, chunked=chunked)
    assert float(np.abs(out - want_out).max()) <= TOL * float(np.abs(want_out).max())
    assert float(np.abs(S - want_S).max()) <= TOL * float(np.abs(want_S).max())


def test_bad_shapes_and_isas_are_refused() -> None:
    q, k, v, beta, g, S = _inputs(0, 4, 8, 8, False)
    with pytest.raises(ValueError):
        L.delta_rule(q, k, v, beta, g, S[:4])
    with pytest.raises(ValueError):
        L.set_isa("sse9")


@pytest.fixture()
def restore_isa() -> Iterator[None]:
    was = L.active_isa()
    yield
    L.set_isa(was)


@pytest.mark.parametrize("chunked", [False, True], ids=["recurrent", "chunked"])
def test_a_model_gives_the_same_logits_on_every_isa(
    tmp_path: Path, chunked: bool, restore_isa: None
) -> None:
    from support.linear_attn_models import load
    from support.modelfactory import prompt_ids
    from support.qwen3_next_factory import VOCAB, build_qwen3_next

    d, _ = build_qwen3_next(tmp_path, seed=1)
    ids = prompt_ids(140, vocab=VOCAB)
    logits = {}
    for isa in ISAS:
        L.set_isa(isa)
        s = load(d, chunked=chunked).session()
        logits[isa] = np.concatenate(
            [s.forward(ids[:131], all_logits=True), s.forward(ids[131:], all_logits=True)]
        )
    for isa in ISAS:
        assert np.array_equal(logits[isa], logits["scalar"]), isa
