"""The attention kernels (csrc/attention) on random data, against the naive reference
(every score, a two-pass softmax, double accumulation) and against themselves.

* Every ISA this CPU runs (scalar, AVX2, AVX-512, NEON), every KV type, head dims of the
  families colibri runs (64, 80, 96, 128, MLA's 192/128 expanded and 576/512 absorbed with
  the values inside the key rows), GQA groups 1-8, 16 and 128 (MQA), odd context lengths.
  The reference reads the same stored keys and values (after their F16/BF16/Q8_0 rounding),
  so only the kernels' float arithmetic differs: the output is a convex combination of value
  rows, and its error stays within 2e-5 of the largest |value| (measured ~1e-6; float32
  softmax with a ~1 ulp exp and float sums over up to ~1000 keys).
* Determinism: bit-identical for 1, 2 and 3 threads, a batch of queries vs each query alone
  (decode) vs any split of the batch, and a sparse key list holding every causal key vs the
  causal path (the canonical order of attention.hpp does not depend on how work is cut).
"""

from __future__ import annotations

import numpy as np
import pytest

from colibri import _core
from colibri.engine.budget import attention_work_floats
from colibri.errors import ColibriError

A = _core.attention
ISAS = [i for i in _core.quant.available_isas()]
KV_TYPES = ["F32", "F16", "BF16", "Q8_0"]
TOL = 2e-5


def _data(seed: int, n_pos: int, n_kv: int, group: int, dk: int, dv: int,
          v_in_k: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_pos, n_kv * group, dk)).astype(np.float32)
    k = rng.standard_normal((n_pos, n_kv, dk)).astype(np.float32)
    v = None if v_in_k else rng.standard_normal((n_pos, n_kv, dv)).astype(np.float32)
    return q, k, v


def _close(got: np.ndarray, ref: np.ndarray, v: np.ndarray, what: str) -> None:
    assert got.shape == ref.shape and got.dtype == np.float32
    err = float(np.abs(got - ref).max())
    assert err <= TOL * float(np.abs(v).max()), f"{what}: max |delta| {err:.3g}"


# (n_kv_heads, group, dk, dv, values inside the key rows)
SHAPES = [
    (3, 3, 64, 64, False),     # SmolLM2
    (2, 4, 80, 80, False),     # an 80-wide head (not a multiple of 16 lanes x 2)
    (1, 1, 96, 96, False),     # multi-head, one head
    (2, 8, 128, 128, False),   # Llama-3 / Qwen3 style GQA
    (4, 2, 192, 128, False),   # MLA expanded prefill: 128 nope + 64 rope keys, 128 values
    (1, 16, 576, 512, True),   # MLA absorbed: latent 512 + rope 64, values = latent prefix
    (3, 5, 64, 64, False),     # an odd group
    (1, 3, 60, 60, False),     # tails of 4 lanes in the scores and the values
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"kv{s[0]}g{s[1]}d{s[2]}v{s[3]}")
def test_kernels_match_reference(isa: str, shape: tuple[int, int, int, int, bool]) -> None:
    n_kv, group, dk, dv, v_in_k = shape
    for kv_type, n_pos, n_q in [("F32", 1, 1), ("F16", 65, 65), ("BF16", 300, 37),
                                ("Q8_0", 1000, 3), ("F32", 257, 1)]:
        if kv_type == "Q8_0" and (dk % 32 or dv % 32):
            continue
        q, k, v = _data(n_pos + dk, n_pos, n_kv, group, dk, dv, v_in_k)
        q = q[n_pos - n_q:]
        args = dict(dv=dv, pos0=n_pos - n_q, scale=1 / np.sqrt(dk), kv_type=kv_type)
        ref = A.run(q, k, v, isa="reference", **args)
        got = A.run(q, k, v, isa=isa, threads=2, **args)
        _close(got, ref, k if v is None else v, f"{isa} {kv_type} {n_pos} positions")


@pytest.mark.parametrize("isa", ISAS)
def test_mqa_128_heads(isa: str) -> None:
    # DeepSeek-V3 absorbed decode shape: 128 query heads on one latent KV "head".
    q, k, _ = _data(5, 300, 1, 128, 576, 512, True)
    for n_q in (1, 3):
        args = dict(dv=512, pos0=300 - n_q, scale=0.07, kv_type="F16")
        ref = A.run(q[-n_q:], k, None, isa="reference", **args)
        got = A.run(q[-n_q:], k, None, isa=isa, threads=2, **args)
        _close(got, ref, k, f"{isa} MQA x128, {n_q} queries")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_bit_identical_across_threads_batching_and_chunking(isa: str, kv_type: str) -> None:
    n_pos = 700  # three key chunks of 256, the last partial; blocks of 64 with a tail
    q, k, v = _data(11, n_pos, 2, 3, 64, 64, False)
    args = dict(dv=64, scale=0.125, kv_type=kv_type, isa=isa)
    full = A.run(q, k, v, pos0=0, threads=1, **args)
    for threads in (2, 3):
        np.testing.assert_array_equal(A.run(q, k, v, pos0=0, threads=threads, **args), full)
    for t in (0, 63, 64, 255, 256, 257, 511, 699):  # decode: one query, chunk-parallel
        one = A.run(q[t:t + 1], k, v, pos0=t, threads=2, **args)
        np.testing.assert_array_equal(one[0], full[t], err_msg=f"position {t}")
    for cut in (1, 100, 256, 333):  # a prompt in two pieces
        a = A.run(q[:cut], k, v, pos0=0, threads=2, **args)
        b = A.run(q[cut:], k, v, pos0=cut, threads=2, **args)
        np.testing.assert_array_equal(np.concatenate([a, b]), full, err_msg=f"cut at {cut}")
    # A sparse key list holding exactly the causal keys follows the same canonical order.
    index = np.concatenate([np.arange(t + 1) for t in range(n_pos)]).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(np.arange(1, n_pos + 1))]).astype(np.int64)
    sparse = A.run(q, k, v, threads=2, key_index=index, key_offsets=offsets, **args)
    np.testing.assert_array_equal(sparse, full)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_long_decode_reads_the_cache_in_place(isa: str, kv_type: str) -> None:
    # Decode reads key / value rows straight from the cache (conversion fused into the
    # kernels' loads); with 9 chunks of 256 keys a team of 1 or 2 runs every KV head of a
    # chunk in one task, a team of 3 splits the heads. Prefill (9 query rows per task)
    # converts through an F32 tile. All must give the same bits, and match the reference.
    n_pos = 2100
    q, k, v = _data(21, n_pos, 3, 3, 64, 64, False)
    args = dict(dv=64, scale=0.125, kv_type=kv_type, isa=isa)
    batch = A.run(q[-3:], k, v, pos0=n_pos - 3, threads=2, **args)
    for threads in (1, 2, 3):
        one = A.run(q[-1:], k, v, pos0=n_pos - 1, threads=threads, **args)
        np.testing.assert_array_equal(one[0], batch[-1], err_msg=f"{threads} threads")
    ref = A.run(q[-1:], k, v, pos0=n_pos - 1, isa="reference", dv=64, scale=0.125, kv_type=kv_type)
    _close(one, ref, v, f"{isa} {kv_type} decode at {n_pos}")


@pytest.mark.parametrize("isa", ISAS)
def test_sparse_keys_match_reference(isa: str) -> None:
    # DSA: each query attends to its own ascending subset of the positions.
    rng = np.random.default_rng(3)
    n_pos, n_q = 900, 5
    q, k, _ = _data(4, n_pos, 1, 8, 576, 512, True)
    lists = [np.sort(rng.choice(n_pos, size=int(n), replace=False)) for n in (1, 64, 65, 300, 700)]
    index = np.concatenate(lists).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    args = dict(dv=512, scale=0.05, kv_type="BF16", key_index=index, key_offsets=offsets)
    ref = A.run(q[:n_q], k, None, isa="reference", **args)
    got = A.run(q[:n_q], k, None, isa=isa, threads=2, **args)
    _close(got, ref, k, f"{isa} sparse")
    one = A.run(q[3:4], k, None, isa=isa, threads=2, dv=512, scale=0.05, kv_type="BF16",
                key_index=lists[3].astype(np.int32), key_offsets=np.array([0, 300]))
    np.testing.assert_array_equal(one[0], got[3])  # decode of one query == its batch row


def test_softmax_is_stable_for_large_scores() -> None:
    # Scores of several hundred would overflow exp without the running maximum.
    q, k, v = _data(8, 200, 1, 2, 64, 64, False)
    args = dict(dv=64, pos0=0, scale=30.0)
    ref = A.run(q, k, v, isa="reference", **args)
    got = A.run(q, k, v, threads=2, **args)
    assert np.all(np.isfinite(got))
    _close(got, ref, v, "large scores")  # type: ignore[arg-type]


def test_bad_input_is_refused() -> None:
    q, k, v = _data(9, 10, 1, 2, 64, 64, False)
    with pytest.raises(ColibriError, match="pos0"):
        A.run(q, k, v, pos0=5)  # 10 queries from position 5 need 15 positions
    with pytest.raises(ColibriError, match="ascending"):
        A.run(q[:1], k, v, key_index=np.array([3, 2], np.int32), key_offsets=np.array([0, 2]))
    with pytest.raises(ColibriError, match="ascending"):
        A.run(q[:1], k, v, key_index=np.array([10], np.int32), key_offsets=np.array([0, 1]))
    with pytest.raises(ColibriError, match="no keys"):
        A.run(q[:1], k, v, key_index=np.array([1], np.int32), key_offsets=np.array([0, 0]))
    q80, k80, v80 = _data(9, 10, 1, 2, 80, 80, False)
    with pytest.raises(ColibriError):
        A.run(q80, k80, v80, kv_type="Q8_0")  # 80 values are not whole blocks of 32
    with pytest.raises(ColibriError, match="ISA"):
        A.run(q, k, v, isa="sse9")


@pytest.mark.parametrize("heads,dk,dv,threads",
                         [(9, 64, 64, 2), (128, 576, 512, 16), (1, 80, 80, 1)])
def test_workspace_mirror(heads: int, dk: int, dv: int, threads: int) -> None:
    want = A.workspace_floats(heads, dk, dv, threads)
    assert attention_work_floats(heads, dk, dv, threads) == want


@pytest.mark.parametrize("isa", ISAS)
def test_verify_batches_split_into_small_tasks_keep_the_bits(isa: str) -> None:
    # A speculative verify forwards 2-17 queries after a long context; they are cut into
    # query blocks small enough for several tasks per thread (one task per KV head would
    # leave a thread idle). Every query must still get the bits of its one-query decode.
    n_pos = 600
    q, k, v = _data(31, n_pos, 3, 3, 64, 64, False)
    args = dict(dv=64, scale=0.125, kv_type="F16", isa=isa)
    single = {t: A.run(q[t:t + 1], k, v, pos0=t, threads=1, **args)[0]
              for t in range(n_pos - 17, n_pos)}
    for n in (2, 3, 5, 9, 17):
        for threads in (1, 2, 3):
            got = A.run(q[n_pos - n:], k, v, pos0=n_pos - n, threads=threads, **args)
            for i in range(n):
                np.testing.assert_array_equal(got[i], single[n_pos - n + i],
                                              err_msg=f"{n} queries, {threads} threads, row {i}")
