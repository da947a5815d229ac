"""The row-lane weight layout (csrc/quant/lane_pack.hpp): Q4_1 / Q8_0 matrices stored in
groups of 8 rows with each block's quant dwords and scales interleaved across the rows, as
the AVX-512 row-lane kernels read them.

The layout is checked byte for byte against a NumPy construction of it written from the
header's description, and every product on a packed weight (each ISA: AVX-512 reads the
layout, the others unpack it) must give exactly the bits of the same weight in the file's
layout, for any token count, thread count and row grouping.
"""

from __future__ import annotations

import numpy as np
import pytest

from colibri import errors
from colibri._core import quant as q

ISAS = q.available_isas()
SCALE_HALVES = {"Q4_1": 2, "Q8_0": 1}  # 16-bit fields before the quants in a block
ROWS_PER_GROUP = 8


def numpy_lanes(b: np.ndarray, dtype: str, rows: int) -> np.ndarray:
    """The layout from its description: per (group of 8 rows, block), dword k of the quants
    of rows 0..7 for each k, then scale field h of rows 0..7 for each h."""
    block = q.type_info(dtype)["type_size"]
    h = SCALE_HALVES[dtype]
    nb = b.shape[1] // block
    x = b.reshape(rows // ROWS_PER_GROUP, ROWS_PER_GROUP, nb, block)
    quants = x[..., 2 * h:].reshape(*x.shape[:3], -1, 4)      # (g, row, block, dword, byte)
    halves = x[..., :2 * h].reshape(*x.shape[:3], h, 2)        # (g, row, block, field, byte)
    packed = np.concatenate([
        quants.transpose(0, 2, 3, 1, 4).reshape(x.shape[0], nb, -1),
        halves.transpose(0, 2, 3, 1, 4).reshape(x.shape[0], nb, -1)], axis=2)
    return packed.reshape(rows, -1)


def weights(dtype: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return q.quantize(dtype, (rng.standard_normal((rows, cols)) * rng.uniform(0.1, 3, (rows, 1)))
                      .astype(np.float32))


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("dtype", ["Q4_1", "Q8_0"])
def test_layout_matches_its_description_and_round_trips(dtype: str) -> None:
    rows, cols = 24, 96
    b = weights(dtype, rows, cols)
    packed = q.pack_lanes(dtype, b, rows, cols)
    assert np.array_equal(packed, numpy_lanes(b, dtype, rows))
    assert not np.array_equal(packed, b)
    assert np.array_equal(q.pack_lanes(dtype, packed, rows, cols, unpack=True), b)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["Q4_1", "Q8_0"])
def test_products_on_packed_weights_keep_the_bits(dtype: str, isa: str) -> None:
    rows, cols = 200, 576
    b = weights(dtype, rows, cols, seed=1)
    packed = q.pack_lanes(dtype, b, rows, cols)
    rng = np.random.default_rng(2)
    for n in (1, 2, 5, 9, 16, 17, 40):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        for threads in (1, 2, 3):
            want = q.matmul(dtype, b, rows, cols, x, threads=threads, isa=isa)
            got = q.matmul(dtype, packed, rows, cols, x, threads=threads, isa=isa, lanes=True)
            assert np.array_equal(bits(got), bits(want)), (n, threads)


@pytest.mark.parametrize("dtype", ["Q4_1", "Q8_0"])
def test_float_activations_and_lookups_read_packed_weights(dtype: str) -> None:
    rows, cols = 64, 128
    b = weights(dtype, rows, cols, seed=3)
    packed = q.pack_lanes(dtype, b, rows, cols)
    x = np.random.default_rng(4).standard_normal((3, cols)).astype(np.float32)
    assert np.array_equal(bits(q.matmul(dtype, packed, rows, cols, x, act="float32", lanes=True)),
                          bits(q.matmul(dtype, b, rows, cols, x, act="float32")))
    ids = np.array([0, 7, 8, 63, 5, 5], np.int32)
    assert np.array_equal(bits(q.get_rows(dtype, packed, rows, cols, ids, lanes=True)),
                          bits(q.get_rows(dtype, b, rows, cols, ids)))


def test_a_packed_weight_after_an_odd_sized_one_in_one_region() -> None:
    """matmul_multi lays the weights' rows end to end; a packed weight after 13 rows must
    still be cut at its own groups (the threads' chunks are multiples of 8 rows)."""
    cols = 256
    odd = weights("Q8_0", 13, cols, seed=5)
    b = weights("Q4_1", 96, cols, seed=6)
    packed = q.pack_lanes("Q4_1", b, 96, cols)
    x = np.random.default_rng(7).standard_normal((4, cols)).astype(np.float32)
    for threads in (1, 2, 3):
        want = q.matmul_multi([("Q8_0", odd, 13), ("Q4_1", b, 96)], cols, x, threads=threads)
        got = q.matmul_multi([("Q8_0", odd, 13), ("Q4_1", packed, 96)], cols, x, threads=threads,
                             lanes=[False, True])
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(bits(g), bits(w))


def test_shapes_without_a_layout_are_refused() -> None:
    b = weights("Q4_1", 12, 64)
    with pytest.raises(errors.ColibriError, match="multiple of 8"):
        q.pack_lanes("Q4_1", b, 12, 64)
    with pytest.raises(errors.ColibriError, match="row-lane"):
        q.matmul("Q4_1", b, 12, 64, np.zeros((1, 64), np.float32), lanes=True)
    with pytest.raises(errors.ColibriError, match="row-lane layout"):
        q.pack_lanes("Q4_0", weights("Q4_0", 8, 64), 8, 64)


def test_a_model_on_an_avx512_host_keeps_its_matrices_in_the_layout() -> None:
    """Where the AVX-512 kernels exist the engine rewrites SmolLM2's resident Q4_1 / Q8_0
    matrices at load (all of them: every row count is a multiple of 8); elsewhere none.
    That its outputs are unchanged is tests/oracle/test_smollm2.py's business (both activation
    precisions: float32's kernels read the layout through the unpacking path)."""
    import colibri
    from support.realmodel import smollm2_gguf

    model = colibri.Model.load(smollm2_gguf(), engine=colibri.EngineConfig(threads={"n": 1}))
    try:
        core = model._require_core()
        assert core is not None
        if "avx512" in ISAS:
            # everything but the F32 norm vectors
            assert core.lane_weight_bytes > 0.99 * core.weight_bytes
        else:
            assert core.lane_weight_bytes == 0
    finally:
        model.close()
