"""I-quant and MXFP4 kernels (colibri._core.quant) against independent oracles.

* Tables: the compiled lattices and value tables equal the gguf package's.
* Dequantization: bit-identical with ``gguf.quants.dequantize`` on every ISA, for blocks of
  random bytes (every grid index, sign pattern and sub-scale occurs) with finite, zero,
  subnormal and extreme half scales.
* Quantizers: MXFP4 byte-identical with gguf's NumPy quantizer; IQ4_NL / IQ4_XS
  byte-identical with the bytes llama.cpp's own quantizer wrote (tests/oracle/test_iquants_real.py
  checks every row of a real model); Q8_K byte-identical with a NumPy transcription of
  ggml's quantize_row_q8_K_ref.
* Dot products: within a derived rounding bound of the exact (float64) dot product of the
  same quantized numbers; the Q8_K types compute one exact integer per super-block and the
  same float steps on every ISA, so SIMD equals scalar bit for bit; the Q8_0 types (IQ4_NL,
  MXFP4) add block terms in another order and agree within the bound.
* matmul: bit-identical across thread counts, row grouping and batching; row-group kernels
  equal the per-row kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq

from colibri import errors
from colibri._core import ThreadPool
from colibri._core import quant as q

ISAS = q.available_isas()
Q8K_TYPES = ["IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]
Q80_TYPES = ["IQ4_NL", "MXFP4"]
TYPES = Q80_TYPES + Q8K_TYPES
U = 2.0**-24


def info(dtype: str) -> tuple[int, int]:
    i = q.type_info(dtype)
    return int(i["block_size"]), int(i["type_size"])


# Offset of the half scale d in each block (IQ1_M spreads d over its scale words; MXFP4
# has an E8M0 byte).
HALF_AT = {t: 0 for t in TYPES if t not in ("IQ1_M", "MXFP4")}

SCALES = {
    "normal": lambda rng, n: rng.standard_normal(n).astype(np.float16),
    "zero": lambda rng, n: np.zeros(n, np.float16),
    "extreme": lambda rng, n: rng.choice(np.float16([65504, -65504, 6.1e-5, 6e-8, -6e-8, 1]), n),
}


def random_blocks(dtype: str, rows: int, cols: int, seed: int, scale: str = "normal") -> np.ndarray:
    """Rows of blocks of random bytes with a chosen half scale (where the type has one)."""
    rng = np.random.default_rng(seed)
    bs, ts = info(dtype)
    b = rng.integers(0, 256, size=(rows, cols // bs, ts), dtype=np.uint8)
    if dtype in HALF_AT:
        d = SCALES[scale](rng, rows * (cols // bs)).astype(np.float16)
        b[:, :, 0:2] = d.view(np.uint8).reshape(rows, -1, 2)
    elif dtype == "IQ1_M":  # the half lives in the top nibbles of the 4 scale words
        d = (
            SCALES[scale](rng, rows * (cols // bs))
            .astype(np.float16)
            .view(np.uint16)
            .reshape(rows, -1)
        )
        words = b[:, :, 48:56].copy().view(np.uint16)  # [rows, nb, 4]
        for k in range(4):
            words[:, :, k] = (words[:, :, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12).astype(
                np.uint16
            )
        b[:, :, 48:56] = words.view(np.uint8)
    elif dtype == "MXFP4" and scale != "extreme":  # moderate exponents
        b[:, :, 0] = rng.integers(110, 140, size=b.shape[:2])
    return b.reshape(rows, -1)


def gguf_dequantize(b: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(gq.dequantize(b, GT[dtype]), dtype=np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Identical float bits; NaNs only need to be NaN on both sides."""
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    m = ~np.isnan(a)
    return np.array_equal(a[m].view(np.uint32), b[m].view(np.uint32))


# ---- tables --------------------------------------------------------------------------------


def _gguf_grid(cls: type) -> np.ndarray:
    cls.init_grid()
    return np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)


@pytest.mark.parametrize(
    "name, cls, width",
    [("iq2xxs_grid", gq.IQ2_XXS, 8), ("iq2xs_grid", gq.IQ2_XS, 8), ("iq2s_grid", gq.IQ2_S, 8),
     ("iq3xxs_grid", gq.IQ3_XXS, 4), ("iq3s_grid", gq.IQ3_S, 4), ("iq1s_grid", gq.IQ1_S, 8)],
)  # fmt: skip
def test_grids_equal_gguf(name: str, cls: type, width: int) -> None:
    ours = q.iq_table(name).reshape(-1, width)
    ref = _gguf_grid(cls)
    assert ours.shape == ref.shape
    vals = ours.view(np.int8) if name == "iq1s_grid" else ours
    assert np.array_equal(vals.astype(np.float32), ref)


def test_value_tables_equal_gguf() -> None:
    assert np.array_equal(q.iq_table("ksigns_iq2xs"), np.frombuffer(gq.IQ2_XXS.ksigns, np.uint8))
    assert np.array_equal(q.iq_table("kvalues_iq4nl").view(np.int8), np.int8(gq.IQ4_NL.kvalues))
    assert np.array_equal(q.iq_table("kvalues_mxfp4").view(np.int8), np.int8(gq.MXFP4.kvalues))
    with pytest.raises(errors.InvalidRequestError, match="unknown i-quant table"):
        q.iq_table("nope")


def test_type_sizes_match_gguf() -> None:
    for t in [*TYPES, "Q8_K"]:
        bs, ts = gq.GGML_QUANT_SIZES[GT[t]]
        assert info(t) == (bs, ts), t
        assert q.type_info(t)["id"] == int(GT[t])


# ---- dequantize ----------------------------------------------------------------------------


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("scale", list(SCALES))
@pytest.mark.parametrize("dtype", TYPES)
def test_dequantize_bits_match_gguf(dtype: str, scale: str, isa: str) -> None:
    for rows, cols in [(1, 256), (7, 512), (3, 1280)]:
        b = random_blocks(dtype, rows, cols, seed=rows + cols, scale=scale)
        assert same_bits(q.dequantize(dtype, b, rows, cols, isa), gguf_dequantize(b, dtype)), (
            rows,
            cols,
        )


@pytest.mark.parametrize("dtype", TYPES)
def test_dequantize_raw_random_bytes(dtype: str) -> None:
    """Any byte pattern (NaN/inf scales included) dequantizes like gguf."""
    rng = np.random.default_rng(5)
    bs, ts = info(dtype)
    b = rng.integers(0, 256, size=(4, 2048 // bs * ts), dtype=np.uint8)
    for isa in ISAS:
        assert same_bits(q.dequantize(dtype, b, 4, 2048, isa), gguf_dequantize(b, dtype)), isa


# ---- quantizers ----------------------------------------------------------------------------


def make(case: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    if case == "scaled":
        s = 10.0 ** rng.uniform(-6, 4, size=(rows, cols // 32, 1))
        return (x.reshape(rows, -1, 32) * s).reshape(rows, cols).astype(np.float32)
    if case == "zeros":
        x = x.reshape(rows, -1, 32)
        x[:, ::2] = 0.0
        x[:, 1::4] = 0.75
        return x.reshape(rows, cols)
    if case == "huge":
        return (x * 1e30).astype(np.float32)
    if case == "tiny":
        return (x * np.float32(1e-20)).astype(np.float32)
    if case == "sparse":
        x = x * np.float32(1e-3)
        x.reshape(rows, -1, 32)[:, :, 5] = rng.choice([-3.0, 3.0], size=(rows, cols // 32))
        return x
    return x


CASES = ["normal", "scaled", "zeros", "huge", "tiny", "sparse"]


@pytest.mark.parametrize("case", CASES)
def test_mxfp4_quantize_bytes_match_gguf(case: str) -> None:
    x = make(case, 5, 320, seed=1)
    with np.errstate(all="ignore"):
        ref = np.asarray(gq.quantize(x, GT.MXFP4)).view(np.uint8).reshape(5, -1)
    assert np.array_equal(q.quantize("MXFP4", x), ref)


def q8_k_numpy(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_K_ref transcribed to NumPy (gguf has no Q8_K quantizer)."""
    out = []
    for blk in x.reshape(-1, 256):
        amax_i = int(np.argmax(np.abs(blk)))  # first of the largest magnitudes
        mx = blk[amax_i]
        d = np.zeros(1, np.float32)
        qs = np.zeros(256, np.int8)
        if mx != 0:
            iscale = np.float32(-127.0) / mx
            qv = np.rint((iscale * blk).astype(np.float32))  # nearest_int: ties to even
            qs = np.minimum(qv, 127).astype(np.int8)
            d[0] = np.float32(1.0) / iscale
        bs = qs.astype(np.int16).reshape(16, 16).sum(axis=1).astype(np.int16)
        out.append(np.concatenate([d.view(np.uint8), qs.view(np.uint8), bs.view(np.uint8)]))
    return np.concatenate(out).reshape(x.shape[0], -1)


@pytest.mark.parametrize("case", ["normal", "scaled", "zeros", "tiny", "sparse"])
def test_q8_k_quantizer_matches_ggml(case: str) -> None:
    x = make(case, 3, 768, seed=2)
    x[1, 256:512] = 0.0  # an all-zero block
    assert np.array_equal(q.quantize("Q8_K", x), q8_k_numpy(x))
    # ties of nearest_int go to even: 127 * k / 254 hits .5 exactly for odd k
    t = (np.arange(256, dtype=np.float32) - 128) / np.float32(2)
    t[0] = -127.0  # max magnitude: iscale = 1
    assert np.array_equal(q.quantize("Q8_K", t[None, :]), q8_k_numpy(t[None, :]))


@pytest.mark.parametrize("dtype", ["IQ4_NL", "IQ4_XS"])
def test_iq4_quantizers_round_trip(dtype: str) -> None:
    """Quantize -> dequantize stays close (the bytes themselves are compared with llama.cpp's
    in test_iquants_real.py); zero blocks stay zero."""
    x = make("zeros", 4, 512, seed=3)
    b = q.quantize(dtype, x)
    y = gguf_dequantize(b, dtype)
    assert np.all(y.reshape(4, -1, 32)[:, ::2] == 0)
    err = float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)))
    assert err < 0.12, err


def test_low_bit_types_all_have_a_quantizer() -> None:
    """colibri's own quantizers (tests/kernels/test_iquant_quantizer.py checks them in depth)."""
    x = make("normal", 2, 512, seed=4)
    for t in ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]:
        y = gguf_dequantize(q.quantize(t, x), t)
        assert float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2))) < 0.6, t


# ---- dot products --------------------------------------------------------------------------
#
# Tolerance. Every kernel computes exact integer sums (per 32-block for the Q8_0 types, per
# 256 super-block for the Q8_K types) and then K float terms t_k = (d_w d_a) * isum_k added
# one after the other (or in 8 lanes + a horizontal sum for IQ4_NL/MXFP4 SIMD). Each term
# carries <= 3 roundings (the scale product, the product with isum, IQ1's delta add), and a
# recursive float sum of K terms adds gamma_K. gguf's float32 dequantization of the weights
# and our float64 reading of the activation's exact values add <= 2u per element. So
#     |got - E| <= (K + 8) u S,   S = sum_j |w_j a_j|,
# with E the float64 dot of the gguf-dequantized weights and the exact activation values.


def act_values(dtype: str, x: np.ndarray) -> np.ndarray:
    """Exact values (float64) of x quantized to the dtype's activation format."""
    act = q.act_type(dtype)
    b = q.quantize(act, x[None, :])[0]
    if act == "Q8_0":
        blk = b.reshape(-1, 34)
        d = blk[:, :2].copy().view(np.float16).astype(np.float64)
        return (d * blk[:, 2:].copy().view(np.int8).astype(np.float64)).ravel()
    assert act == "Q8_K"
    blk = b.reshape(-1, 292)
    d = blk[:, :4].copy().view(np.float32).astype(np.float64)
    return (d * blk[:, 4:260].copy().view(np.int8).astype(np.float64)).ravel()


def check_dot(dtype: str, w_row: np.ndarray, x: np.ndarray, got: float) -> None:
    wf = gguf_dequantize(w_row[None, :], dtype)[0].astype(np.float64)
    a = act_values(dtype, x)
    with np.errstate(all="ignore"):
        p = wf * a
        e, s = float(p.sum()), float(np.abs(p).sum())
    if not np.isfinite(s):  # weights beyond float32 (MXFP4 exponents near 255): no bound
        return
    k = x.size // (32 if dtype in Q80_TYPES else 256)
    assert abs(got - e) <= (k + 8) * U * s + 1e-30, (dtype, got, e, s)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("scale", ["normal", "zero", "extreme"])
@pytest.mark.parametrize("dtype", TYPES)
def test_vec_dot_vs_exact_and_scalar(dtype: str, scale: str, isa: str) -> None:
    rng = np.random.default_rng(7)
    for rows, cols in [(3, 256), (5, 1280), (2, 4096)]:
        w = random_blocks(dtype, rows, cols, seed=cols, scale=scale)
        x = rng.standard_normal(cols).astype(np.float32)
        x[: min(256, cols) // 2] = 0.0  # activation blocks of zeros
        for r in range(rows):
            got = q.vec_dot(dtype, w[r], x, isa)
            ref = q.vec_dot(dtype, w[r], x, "scalar")
            if np.isfinite(ref):
                check_dot(dtype, w[r], x, got)
            if dtype in Q8K_TYPES:
                assert np.float32(got).tobytes() == np.float32(ref).tobytes(), (r, got, ref)


def test_vec_dot_extreme_activations() -> None:
    """Activations at float extremes: still within the bound (or both non-finite)."""
    x = np.float32([3e38, -3e38, 1e-38, 0.0] * 256)
    for dtype in TYPES:
        w = random_blocks(dtype, 1, 1024, seed=9)[0]
        for isa in ISAS:
            got, ref = q.vec_dot(dtype, w, x, isa), q.vec_dot(dtype, w, x, "scalar")
            if np.isfinite(ref) and np.isfinite(got):
                check_dot(dtype, w, x, got)
            else:
                assert np.isfinite(got) == np.isfinite(ref), (dtype, isa, got, ref)


# ---- matmul --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", TYPES)
def test_matmul_bit_identical_across_threads_grouping_and_batch(dtype: str) -> None:
    rows, cols = 203, 768
    w = random_blocks(dtype, rows, cols, seed=11)
    x = np.random.default_rng(12).standard_normal((5, cols)).astype(np.float32)
    pools = [ThreadPool(n) for n in (1, 2, 3)]
    ys = [q.matmul(dtype, w, rows, cols, x, p) for p in pools]
    for y in ys[1:]:
        assert y.tobytes() == ys[0].tobytes()
    for t in range(x.shape[0]):
        assert (
            q.matmul(dtype, w, rows, cols, x[t : t + 1], pools[1]).tobytes()
            == ys[0][t : t + 1].tobytes()
        )
    for isa in ISAS:
        y1 = q.matmul(dtype, w, rows, cols, x[:1], 2, isa)[0]
        dots = np.float32([q.vec_dot(dtype, w[r], x[0], isa) for r in range(rows)])
        assert y1.tobytes() == dots.tobytes(), isa


def test_matmul_multi_mixes_types() -> None:
    cols = 512
    x = np.random.default_rng(13).standard_normal((3, cols)).astype(np.float32)
    specs = [
        ("IQ4_NL", 33),
        ("IQ2_XXS", 17),
        ("Q4_0", 8),
        ("IQ4_XS", 40),
        ("MXFP4", 5),
        ("IQ1_M", 9),
    ]
    ws = []
    for i, (dt, rows) in enumerate(specs):
        b = (
            random_blocks(dt, rows, cols, seed=20 + i)
            if dt != "Q4_0"
            else q.quantize(dt, make("normal", rows, cols))
        )
        ws.append((dt, b, rows))
    for threads in (1, 2):
        outs = q.matmul_multi(ws, cols, x, threads)
        for (dt, b, rows), y in zip(ws, outs, strict=True):
            assert y.tobytes() == q.matmul(dt, b, rows, cols, x, 1).tobytes(), dt


def test_get_rows_equals_gguf() -> None:
    for dtype in TYPES:
        w = random_blocks(dtype, 20, 512, seed=30)
        ids = np.array([3, 0, 19, 3], dtype=np.int32)
        assert same_bits(q.get_rows(dtype, w, 20, 512, ids), gguf_dequantize(w, dtype)[ids]), dtype


def test_bad_sizes() -> None:
    with pytest.raises(errors.InvalidRequestError, match="multiple of 256"):
        q.dequantize("IQ2_XXS", np.zeros(66, np.uint8), 1, 128)
    with pytest.raises(errors.InvalidRequestError, match="needs 132 bytes"):
        q.dequantize("IQ2_XXS", np.zeros(131, np.uint8), 1, 512)
    with pytest.raises(errors.UnsupportedError, match="activation format"):
        q.vec_dot("Q8_K", np.zeros(292, np.uint8), np.zeros(256, np.float32))
