"""Attention sinks and sliding windows in the attention kernels (csrc/attention; gpt-oss),
against a plain numpy reference and against themselves.

* The reference: per query head, the scores of the keys in the window (the query's own
  position and the window - 1 before it), the head's sink logit appended as one more
  column, a softmax in float64, the sink column dropped, the weighted sum of the values.
* Every ISA this CPU runs and the naive C++ reference match it within the float tolerance
  of tests/kernels/test_attention_kernels.py, for windows shorter than a block, than a
  chunk and longer than the context, sinks drawn from N(0, 2), GQA groups of 3 heads.
* The canonical order of attention.hpp holds with both: prefill, decode one query at a
  time, any cut of the prompt and any team size give the same bits.
"""

from __future__ import annotations

import numpy as np
import pytest

from colibri import _core
from colibri.errors import ColibriError

A = _core.attention
ISAS = list(_core.quant.available_isas())
TOL = 2e-5
N_KV, GROUP, DK = 2, 3, 64
SCALE = 1 / np.sqrt(DK)


def _data(seed: int, n_pos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_pos, N_KV * GROUP, DK)).astype(np.float32)
    k = rng.standard_normal((n_pos, N_KV, DK)).astype(np.float32)
    v = rng.standard_normal((n_pos, N_KV, DK)).astype(np.float32)
    sinks = (2.0 * rng.standard_normal(N_KV * GROUP)).astype(np.float32)  # N(0, 2)
    return q, k, v, sinks


def numpy_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int, scale: float,
                    window: int = 0, sinks: np.ndarray | None = None) -> np.ndarray:
    n_q, n_heads, _ = q.shape
    group = n_heads // k.shape[1]
    out = np.zeros((n_q, n_heads, v.shape[2]))
    for t in range(n_q):
        pos = pos0 + t
        j0 = max(0, pos + 1 - window) if window else 0
        for h in range(n_heads):
            g = h // group
            s = k[j0:pos + 1, g].astype(np.float64) @ q[t, h].astype(np.float64) * scale
            if sinks is not None:
                s = np.append(s, float(sinks[h]))  # the sink column ...
            p = np.exp(s - s.max())
            p /= p.sum()
            if sinks is not None:
                p = p[:-1]  # ... joins the denominator only
            out[t, h] = p @ v[j0:pos + 1, g].astype(np.float64)
    return out


def _close(got: np.ndarray, ref: np.ndarray, v: np.ndarray, what: str) -> None:
    assert got.shape == ref.shape
    err = float(np.abs(got - ref).max())
    assert err <= TOL * float(np.abs(v).max()), f"{what}: max |delta| {err:.3g}"


# (positions, queries at the end, window): windows of 1, inside a block, across block and
# chunk bounds (64 / 256 keys), and wider than the context (no window in effect).
CASES = [(40, 40, 1), (40, 40, 3), (300, 300, 70), (600, 5, 100), (600, 1, 256), (600, 1, 257),
         (600, 3, 300), (90, 90, 1000)]


@pytest.mark.parametrize("isa", [*ISAS, "reference"])
@pytest.mark.parametrize("sinks_on", [False, True], ids=["no_sinks", "sinks"])
def test_matches_numpy(isa: str, sinks_on: bool) -> None:
    for n_pos, n_q, window in CASES:
        q, k, v, sinks = _data(n_pos + window, n_pos)
        s = sinks if sinks_on else None
        pos0 = n_pos - n_q
        ref = numpy_attention(q[pos0:], k, v, pos0, SCALE, window, s)
        got = A.run(q[pos0:], k, v, dv=DK, pos0=pos0, scale=SCALE, isa=isa, threads=2,
                    window=window, sinks=s)
        _close(got, ref, v, f"{isa}: {n_pos} positions, {n_q} queries, window {window}")


@pytest.mark.parametrize("isa", ISAS)
def test_sinks_only_and_extremes(isa: str) -> None:
    q, k, v, sinks = _data(5, 200)
    args = dict(dv=DK, pos0=0, scale=SCALE, isa=isa, threads=2)
    ref = numpy_attention(q, k, v, 0, SCALE, 0, sinks)
    _close(A.run(q, k, v, sinks=sinks, **args), ref, v, f"{isa} sinks, full context")
    # A very negative sink is no sink; a very large one takes (almost) all the weight.
    plain = A.run(q, k, v, **args)
    _close(A.run(q, k, v, sinks=np.full(6, -1e4, np.float32), **args), plain, v, "sink -1e4")
    big = A.run(q, k, v, sinks=np.full(6, 60.0, np.float32), **args)
    assert np.all(np.isfinite(big)) and float(np.abs(big).max()) < 1e-12


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_type", ["F32", "F16", "Q8_0"])
def test_bit_identical_across_threads_batching_and_chunking(isa: str, kv_type: str) -> None:
    n_pos = 700  # three key chunks of 256
    q, k, v, sinks = _data(11, n_pos)
    for window in (3, 100, 300):
        args = dict(dv=DK, scale=SCALE, kv_type=kv_type, isa=isa, window=window, sinks=sinks)
        full = A.run(q, k, v, pos0=0, threads=1, **args)
        for threads in (2, 3):
            np.testing.assert_array_equal(A.run(q, k, v, pos0=0, threads=threads, **args), full)
        for t in (0, 2, 3, 63, 64, 255, 256, 299, 300, 511, 699):  # decode, one query
            one = A.run(q[t:t + 1], k, v, pos0=t, threads=2, **args)
            np.testing.assert_array_equal(one[0], full[t], err_msg=f"window {window}, pos {t}")
        for cut in (1, 100, 256, 333):  # a prompt in two pieces
            a = A.run(q[:cut], k, v, pos0=0, threads=2, **args)
            b = A.run(q[cut:], k, v, pos0=cut, threads=3, **args)
            np.testing.assert_array_equal(np.concatenate([a, b]), full,
                                          err_msg=f"window {window}, cut at {cut}")


def test_window_wider_than_the_context_changes_nothing() -> None:
    q, k, v, sinks = _data(7, 150)
    args = dict(dv=DK, pos0=0, scale=SCALE, threads=2, sinks=sinks)
    np.testing.assert_array_equal(A.run(q, k, v, window=150, **args), A.run(q, k, v, **args))


def test_bad_input_is_refused() -> None:
    q, k, v, sinks = _data(9, 10)
    with pytest.raises(ColibriError, match="sinks must be one value per query head"):
        A.run(q, k, v, dv=DK, sinks=sinks[:5])
    with pytest.raises(ColibriError, match="sinks must be one value per query head"):
        A.run(q, k, v, dv=DK, sinks=np.zeros((2, 3), np.float32))
    with pytest.raises(ColibriError, match="window must be >= 0"):
        A.run(q, k, v, dv=DK, window=-1)
    with pytest.raises(ColibriError, match="sliding window needs causal keys"):
        A.run(q[:1], k, v, dv=DK, window=4, key_index=np.array([1, 2], np.int32),
              key_offsets=np.array([0, 2]))
