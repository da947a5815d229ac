"""Float activations against quantized weights (``act="float32"``, the exact path): a
prefill dequantizes each tile of weight rows once for all its tokens (quant/float_act.cpp),
and must give the bits of token-by-token products, within float rounding of the float64
product of gguf's own dequantization."""

from __future__ import annotations

import numpy as np
import pytest
from test_quant import U, gguf_dequantize, make

from colibri._core import quant as q

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL"]


@pytest.mark.parametrize("dtype", TYPES)
def test_prefill_tiles_equal_token_by_token(dtype: str) -> None:
    # 300 rows x 512 columns: several row tiles per thread (32 KiB of weight bytes each) and
    # a remainder; 70 tokens, so tiles see whole and partial token blocks.
    rows, cols, n = 300, 512, 70
    w = q.quantize(dtype, make("scaled", rows, cols, seed=31))
    x = make("normal", n, cols, seed=32)
    y = q.matmul(dtype, w, rows, cols, x, 2, act="float32")
    one_by_one = np.concatenate(
        [q.matmul(dtype, w, rows, cols, x[t : t + 1], 1, act="float32") for t in range(n)])
    assert y.tobytes() == one_by_one.tobytes()
    wf = gguf_dequantize(w, dtype).astype(np.float64)
    ref = x.astype(np.float64) @ wf.T
    mag = np.abs(x.astype(np.float64)) @ np.abs(wf).T
    k = cols // 8 + 8  # the F32 kernels' accumulation depth (tests/kernels/test_quant.py)
    assert np.all(np.abs(y - ref) <= (k + 8) * U * mag + 1e-38)
    # The int8 path really differs (the activation rounding), so this compared two paths.
    assert not np.array_equal(y, q.matmul(dtype, w, rows, cols, x, 2))


@pytest.mark.parametrize("isa", q.available_isas())
@pytest.mark.parametrize("cols", [7, 77, 300, 1000, 1088])
def test_f32_prefill_tile_equals_vec_dot(isa: str, cols: int) -> None:
    # F32 weights (and the float-activation path's dequantized rows) use the F32 tile:
    # rows x tokens a pass with vec_dot_f32's accumulators, its masked or 8-wide loop and
    # its scalar tail (the odd column counts), bit for bit, at every ISA.
    rows, n = 37, 11
    rng = np.random.default_rng(cols)
    wf = rng.standard_normal((rows, cols), dtype=np.float32)
    w = wf.view(np.uint8)
    x = rng.standard_normal((n, cols), dtype=np.float32)
    y = q.matmul("F32", w, rows, cols, x, 2, isa)
    dots = np.float32([[q.vec_dot("F32", w[r], x[t], isa) for r in range(rows)] for t in range(n)])
    assert y.tobytes() == dots.tobytes()
    ref = x.astype(np.float64) @ wf.astype(np.float64).T
    mag = np.abs(x.astype(np.float64)) @ np.abs(wf.astype(np.float64)).T
    assert np.all(np.abs(y - ref) <= (cols // 8 + 16) * U * mag)


@pytest.mark.parametrize("isa", [i for i in q.available_isas() if i != "scalar"])
@pytest.mark.parametrize("dtype", TYPES)
def test_one_token_dot_equals_f32_dot_of_the_dequantized_row(isa: str, dtype: str) -> None:
    # Decode's float-activation dot at each ISA (Q4_0, Q4_1 and Q8_0 dequantize in
    # registers, quant/float_act.hpp) equals that ISA's F32 dot of gguf's dequantized row.
    rows, cols = 9, 1024
    w = q.quantize(dtype, make("scaled", rows, cols, seed=41))
    wf = gguf_dequantize(w, dtype)
    x = make("normal", 1, cols, seed=42)[0]
    for r in range(rows):
        got = q.vec_dot(dtype, w[r], x, isa, act="float32")
        want = q.vec_dot("F32", wf[r].view(np.uint8), x, isa)
        assert np.float32(got).tobytes() == np.float32(want).tobytes(), r
