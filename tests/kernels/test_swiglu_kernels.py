"""The clamped SwiGLU kernels (csrc/model/act_*.cpp: gpt-oss's ``swiglu_oai``, DeepSeek-V4's
``swiglu_clamp``) at every ISA against the scalar reference (ops.cpp, std::exp).

Not bit-identical: the SIMD kernels compute e^x with a polynomial (Cephes' expf
coefficients, range-reduced by ln 2 in two parts) where the reference calls libm's exp.
Everything else is the reference's operations in its order, each an IEEE operation (the
clamps, 1 + e, the division, the products; no contraction), so only e differs. Its
relative error (about 1.5 x 2^-23 at most, libm's included) enters 1 + e scaled by
e / (1 + e) <= 1; the two sides then round 1 + e, the division and the product
separately, each adding at most 2^-24 of difference per rounding on either side: about
4.5 x 2^-23 relative in all. Bound: 6 x 2^-23 of the reference's magnitude (measured over
a million values: at most 2.75 x 2^-23; 96% of values are bit-identical), zeros exactly
zero, and the edges equal: the clamps, an exp argument past float's range (inf in both,
so a signed zero), infinities and NaN in.
"""

from __future__ import annotations

import numpy as np
import pytest

from colibri import _core
from colibri._core import quant as q

ISAS = [i for i in q.available_isas() if i != "neon"]  # NEON runs the scalar kernels
REL = 6 * 2.0**-23
LIMIT, ALPHA = 7.0, 1.702


def _inputs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gate and up ~N(0, 6) (both clamps act at 7) with the edges spread through them."""
    rng = np.random.default_rng(seed)
    gate = rng.normal(0, 6, n).astype(np.float32)
    up = rng.normal(0, 6, n).astype(np.float32)
    edges = np.float32([0.0, -0.0, LIMIT, -LIMIT, 1e-30, -1e-30, -60.0, -200.0, -1e30, 1e30,
                        np.inf, -np.inf, -1.0, 52.0, -52.0, 87.0, -87.0, 88.9])  # fmt: skip
    k = min(n, len(edges))
    gate[:k] = edges[:k]
    up[: k] = edges[::-1][:k]
    return gate, up


def _assert_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    both_nan = np.isnan(got) & np.isnan(ref)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), what
    g, r = got[~both_nan].astype(np.float64), ref[~both_nan].astype(np.float64)
    zero = r == 0
    assert np.all(got[~both_nan][zero] == 0), what
    assert np.array_equal(np.isinf(g), np.isinf(r)) and np.all(g[np.isinf(r)] == r[np.isinf(r)])
    fin = np.isfinite(r) & ~zero
    rel = np.abs(g[fin] - r[fin]) / np.abs(r[fin])
    assert rel.size == 0 or float(rel.max()) <= REL, (what, float(rel.max()) / 2**-23)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 17, 33, 4099])
def test_swiglu_oai_within_ulps_of_the_scalar_reference(isa: str, n: int) -> None:
    gate, up = _inputs(n, seed=n)
    ref = _core.swiglu_oai(gate, up, LIMIT, ALPHA, isa="scalar")
    _assert_close(_core.swiglu_oai(gate, up, LIMIT, ALPHA, isa=isa), ref, f"oai {isa} {n}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 17, 33, 4099])
def test_swiglu_clamp_within_ulps_of_the_scalar_reference(isa: str, n: int) -> None:
    gate, up = _inputs(n, seed=100 + n)
    ref = _core.swiglu_clamp(gate, up, LIMIT, isa="scalar")
    _assert_close(_core.swiglu_clamp(gate, up, LIMIT, isa=isa), ref, f"clamp {isa} {n}")


def test_the_scalar_reference_is_the_formula() -> None:
    rng = np.random.default_rng(7)
    gate, up = rng.normal(0, 6, (2, 4099)).astype(np.float32)
    g = np.minimum(gate.astype(np.float64), LIMIT)
    u = np.clip(up.astype(np.float64), -LIMIT, LIMIT)
    oai = (u + 1) * g / (1 + np.exp(-ALPHA * g))
    clamp = g / (1 + np.exp(-g)) * u
    got_oai = _core.swiglu_oai(gate, up, LIMIT, ALPHA, isa="scalar")
    got_clamp = _core.swiglu_clamp(gate, up, LIMIT, isa="scalar")
    np.testing.assert_allclose(got_oai, oai, rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(got_clamp, clamp, rtol=2e-6, atol=1e-30)


def test_the_ffn_blocks_run_the_best_isa() -> None:
    """isa=None is what the FFN blocks call: the best available ISA's kernels."""
    gate, up = _inputs(1000, seed=9)
    best = q.best_isa() if q.best_isa() in ISAS else "scalar"
    assert _core.swiglu_oai(gate, up, LIMIT, ALPHA).tobytes() == \
        _core.swiglu_oai(gate, up, LIMIT, ALPHA, isa=best).tobytes()  # fmt: skip
    assert _core.swiglu_clamp(gate, up, LIMIT).tobytes() == \
        _core.swiglu_clamp(gate, up, LIMIT, isa=best).tobytes()  # fmt: skip


def test_mismatched_vectors_are_refused() -> None:
    with pytest.raises(Exception, match="vectors of one length"):
        _core.swiglu_clamp(np.zeros(3, np.float32), np.zeros(4, np.float32), LIMIT)
