"""Q8_K, the activation format of the 256-element super-block types.

Oracles: llama.cpp's own ``quantize_row_q8_K_ref`` (through ctypes, tests/support/ggml_oracle.py)
and a NumPy transcription of the same arithmetic written here; every SIMD quantizer must
give the scalar reference's bytes, on ordinary data and on inf/NaN/huge/tiny input.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_quant import make, same_bits

from colibri._core import quant as q
from support import ggml_oracle

ISAS = q.available_isas()
CASES = ["normal", "scaled", "zeros", "f16_range", "huge", "tiny", "sparse", "nan_inf", "ties"]


def data(case: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    if case == "nan_inf":  # NaNs never win the max; inf and NaN products still get bytes
        x = make("normal", rows, cols, seed)
        x.reshape(-1)[3::97] = np.nan
        x.reshape(-1)[50::211] = np.inf
        x.reshape(-1)[70::307] = -np.inf
        x[0, :256] = np.nan  # an all-NaN block is a zero block
        return x
    if case == "ties":  # iscale = 1: the scaled values are exact halves (ties to even)
        x = np.tile(np.arange(-63.5, 64.5, 0.5, dtype=np.float32)[:256], (rows, cols // 256))
        x[:, ::256] = -127.0  # max = -127 -> iscale = 1
        return x.astype(np.float32)
    return make(case, rows, cols, seed)


def q8_k_numpy(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_K_ref in NumPy (float32 throughout)."""
    rows = x.shape[0]
    b = x.reshape(-1, 256).astype(np.float32)
    a = np.abs(b)
    a = np.where(np.isnan(a), np.float32(-1), a)
    idx = np.argmax(a, axis=1)  # the first of the largest magnitude
    amax = a[np.arange(b.shape[0]), idx]
    mx = b[np.arange(b.shape[0]), idx]
    with np.errstate(all="ignore"):
        iscale = (np.float32(-127) / mx).astype(np.float32)
        p = (iscale[:, None] * b).astype(np.float32)
        t = (p + np.float32(12582912.0)).astype(np.float32)
        d = (np.float32(1) / iscale).astype(np.float32)
    v = (t.view(np.int32) & 0x7FFFFF) - 0x400000
    qs = (np.minimum(v, 127) & 0xFF).astype(np.uint8).view(np.int8)
    bsums = qs.reshape(-1, 16, 16).astype(np.int32).sum(axis=2).astype(np.int16)
    zero = amax <= 0
    qs[zero] = 0
    bsums[zero] = 0
    d[zero] = 0
    out = np.concatenate(
        [d[:, None].view(np.uint8), qs.view(np.uint8), bsums.view(np.uint8)], axis=1
    )
    return out.reshape(rows, -1)


def test_q8_k_layout() -> None:
    assert q.type_info("Q8_K") == {
        "name": "Q8_K",
        "id": 15,
        "block_size": 256,
        "type_size": 292,
        "implemented": True,
    }
    assert q.row_bytes("Q8_K", 512) == 584


@pytest.mark.parametrize("case", CASES)
def test_q8_k_scalar_matches_numpy_and_ggml(case: str) -> None:
    x = data(case, 5, 768, seed=1)
    ours = q.quantize("Q8_K", x)
    assert np.array_equal(ours, q8_k_numpy(x)), case
    if ggml_oracle._lib() is not None:
        assert np.array_equal(ours, ggml_oracle.quantize("Q8_K", x)), case


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", CASES)
def test_q8_k_every_isa_byte_identical(case: str, isa: str) -> None:
    for rows, cols in [(1, 256), (3, 512), (7, 1536)]:
        x = data(case, rows, cols, seed=2)
        assert np.array_equal(q.quantize("Q8_K", x, isa), q.quantize("Q8_K", x)), (case, rows, cols)


def test_q8_k_dequantize() -> None:
    x = data("scaled", 3, 512, seed=3)
    b = q.quantize("Q8_K", x)
    blk = b.reshape(-1, 292)
    d = blk[:, :4].copy().view(np.float32)
    qs = blk[:, 4:260].copy().view(np.int8).astype(np.float32)
    want = (d * qs).reshape(3, 512)
    for isa in ISAS:
        assert same_bits(q.dequantize("Q8_K", b, 3, 512, isa), want)
    if ggml_oracle._lib() is not None:
        assert same_bits(ggml_oracle.dequantize("Q8_K", b, 3, 512), want)
    # within half a step of the input (the step is amax / 127)
    amax = np.abs(x.reshape(-1, 256)).max(axis=1, keepdims=True)
    err = np.abs(want.reshape(-1, 256) - x.reshape(-1, 256))
    assert np.all(err <= amax / 127 * 0.5 * (1 + 1e-5))
