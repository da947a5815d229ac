"""colibri._bench, the timing harnesses benchmarks/ runs (csrc/bench/), kept out of the
production extension colibri._core: each harness runs and returns its timings, bad input
maps to colibri.errors like _core's, and a pool of the other extension is refused (the
two extensions share no C++ objects)."""

from __future__ import annotations

import numpy as np
import pytest

from colibri import _bench, _core
from colibri.errors import InvalidRequestError

q = _core.quant
ROWS, COLS = 64, 256


def _weight(dtype: str = "Q4_1") -> np.ndarray:
    rng = np.random.default_rng(0)
    return q.quantize(dtype, rng.standard_normal((ROWS, COLS)).astype(np.float32))


def _ok(times: list[float], n: int) -> None:
    assert len(times) == n and all(t > 0 for t in times)


def test_matmul_harness_on_an_int_team_and_its_own_pool() -> None:
    w = _weight()
    x = np.ones((3, COLS), np.float32)
    _ok(_bench.bench_matmul("Q4_1", w, ROWS, COLS, x, threads=1, iters=3), 3)
    pool = _bench.ThreadPool(2)
    assert pool.size == 2
    _ok(_bench.bench_matmul("Q4_1", w, ROWS, COLS, x, pool, 2, q.best_isa()), 2)
    packed = q.pack_lanes("Q4_1", w, ROWS, COLS)
    _ok(_bench.bench_matmul("Q4_1", packed, ROWS, COLS, x, pool, 2, lanes=True), 2)


def test_sequence_and_read_bandwidth_harnesses() -> None:
    pool = _bench.ThreadPool(2)
    ws = [("Q4_1", _weight(), ROWS, COLS), ("Q8_0", _weight("Q8_0"), ROWS, COLS)]
    _ok(_bench.bench_sequence(ws, pool, 4), 4)
    _ok(_bench.read_bandwidth(np.ones(1 << 20, np.uint8), pool, 3), 3)
    _ok(_bench.read_bandwidth(np.ones(1 << 20, np.uint8), 1, 1, prefetch=True), 1)


def test_attention_harness() -> None:
    rng = np.random.default_rng(1)
    qs = rng.standard_normal((2, 4, 64)).astype(np.float32)
    k = rng.standard_normal((16, 2, 64)).astype(np.float32)
    assert _bench.bench_attention(qs, k, k, pos0=14, kv_type="F16", threads=2, iters=2) > 0
    with pytest.raises(InvalidRequestError, match="reference"):
        _bench.bench_attention(qs, k, k, pos0=14, isa="reference")


def test_bad_input_maps_to_colibri_errors() -> None:
    narrow = np.ones((1, COLS - 32), np.float32)
    with pytest.raises(InvalidRequestError, match="columns"):
        _bench.bench_matmul("Q4_1", _weight(), ROWS, COLS, narrow)
    x = np.ones((1, COLS), np.float32)
    with pytest.raises(InvalidRequestError, match="unknown ISA"):
        _bench.bench_matmul("Q4_1", _weight(), ROWS, COLS, x, isa="sse9")


def test_the_other_extensions_pool_is_refused() -> None:
    x = np.ones((1, COLS), np.float32)
    with pytest.raises(RuntimeError, match="colibri._core.ThreadPool"):
        _bench.bench_matmul("Q4_1", _weight(), ROWS, COLS, x, _core.ThreadPool(2))


def test_the_production_extension_has_no_harnesses() -> None:
    assert not any(hasattr(q, n) for n in ("bench_matmul", "bench_sequence", "read_bandwidth"))
    assert not hasattr(_core.attention, "bench")
