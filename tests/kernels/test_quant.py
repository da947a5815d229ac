"""Block kernels and matmul (colibri._core.quant) against two oracles.

* gguf's NumPy reference (``gguf.quants``): our scalar quantizers must produce the same
  bytes, and every ISA's dequantization the same float bits.
* Exact arithmetic: dot products are checked against the float64 value of the very same
  quantized numbers, within a rounding bound derived below; every SIMD path is also
  compared with the scalar reference of this library.

The matmul must equal its own per-row kernel bit for bit, whatever the thread count, the
row grouping or the number of tokens (the project's determinism principle).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq

from colibri import errors
from colibri._core import ThreadPool
from colibri._core import quant as q

ISAS = q.available_isas()
SIMD_ISAS = [i for i in ISAS if i != "scalar"]
WEIGHT_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"]
BLOCK_TYPES = ["Q4_0", "Q4_1", "Q8_0"]
U = 2.0**-24  # unit roundoff of float32


# ---- data ----------------------------------------------------------------------------------


def make(case: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """float32 [rows, cols] test matrices; cols is a multiple of 32."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    if case == "normal":
        return x
    if case == "scaled":  # every 32-block at its own scale, 1e-6 .. 1e4
        scale = 10.0 ** rng.uniform(-6, 4, size=(rows, cols // 32, 1))
        return (x.reshape(rows, -1, 32) * scale).reshape(rows, cols).astype(np.float32)
    if case == "zeros":  # all-zero blocks next to normal ones, and constant blocks
        x = x.reshape(rows, -1, 32)
        x[:, ::2] = 0.0
        x[:, 1::4] = 0.75
        return x.reshape(rows, cols)
    if case == "f16_range":  # magnitudes up to about 65504 (the largest finite half)
        return (np.tanh(x) * 65504.0).astype(np.float32)
    if case == "huge":  # block scales overflow half: d becomes inf
        return (x * 1e30).astype(np.float32)
    if case == "tiny":  # block scales underflow half: d becomes 0 (or a half subnormal)
        return (x * np.float32(1e-20)).astype(np.float32)
    if case == "sparse":  # one large value per block among small ones (sign of max matters)
        x = x * np.float32(1e-3)
        x.reshape(rows, -1, 32)[:, :, 5] = rng.choice([-3.0, 3.0], size=(rows, cols // 32))
        return x
    raise ValueError(case)


CASES = ["normal", "scaled", "zeros", "f16_range", "huge", "tiny", "sparse"]
SHAPES = [(1, 32), (7, 96), (13, 288)]


def gguf_quantize(x: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        out = gq.quantize(x, GT[dtype])
    return np.ascontiguousarray(out).view(np.uint8).reshape(x.shape[0], -1)


def gguf_dequantize(b: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(gq.dequantize(b, GT[dtype]), dtype=np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(
        np.ascontiguousarray(a, np.float32).view(np.uint32), np.ascontiguousarray(b, np.float32).view(np.uint32)
    )


# ---- quantize / dequantize vs gguf ---------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", WEIGHT_TYPES)
def test_quantize_bytes_match_gguf(dtype: str, case: str) -> None:
    for rows, cols in SHAPES:
        x = make(case, rows, cols)
        ours = q.quantize(dtype, x)
        assert ours.shape == (rows, q.row_bytes(dtype, cols))
        assert np.array_equal(ours, gguf_quantize(x, dtype)), (dtype, case, rows, cols)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", WEIGHT_TYPES)
def test_dequantize_bits_match_gguf(dtype: str, case: str, isa: str) -> None:
    for rows, cols in SHAPES:
        b = gguf_quantize(make(case, rows, cols, seed=1), dtype)
        assert same_bits(q.dequantize(dtype, b, rows, cols, isa), gguf_dequantize(b, dtype)), (rows, cols)


def test_fp16_conversions_exhaustive() -> None:
    # Every half bit pattern to float (scalar and SIMD) vs NumPy; NaNs only need to stay NaN.
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ref = h.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    for isa in ISAS:
        got = q.dequantize("F16", h.view(np.uint8), 1, 65536, isa)[0]
        assert same_bits(got[~nan], ref[~nan]) and np.isnan(got[nan]).all(), isa
    # Floats to half: random bit patterns (all exponents) plus every rounding tie near the
    # subnormal/normal boundary and around 65504/65520.
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 2**32, size=1 << 16, dtype=np.uint64).astype(np.uint32)
    special = np.float32([65504, 65519.996, 65520, 65536, 6.1035156e-05, 5.9604645e-08, 2.9802322e-08,
                          2.9802326e-08, 8.940697e-08, -0.0, np.inf, -np.inf])
    halfway = (np.arange(1, 2048, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-24)
    x = np.concatenate([bits.view(np.float32), special, halfway, -halfway])
    x = x[~np.isnan(x)][: (x.size // 32) * 32 - 64]
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(q.quantize("F16", x[None, :])[0].view(np.uint16), want)


def test_bf16_nan_and_rounding() -> None:
    x = np.float32([1.0, 1.00390625, 1.01171875, -3.3e38, 3.4e38, np.inf, -np.inf, np.nan] * 4)
    assert np.array_equal(q.quantize("BF16", x[None, :]), gguf_quantize(x[None, :], "BF16"))


# ---- activation quantizers -----------------------------------------------------------------


def np_roundf(v: np.ndarray) -> np.ndarray:
    a = np.abs(v)
    f = np.floor(a)
    return np.sign(v) * (f + np.floor(2 * (a - f)))


def q8_1_numpy(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_1_ref in NumPy (gguf has no Q8_1 quantizer)."""
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
    qs = np_roundf(blocks * inv).astype(np.int8)
    with np.errstate(over="ignore"):  # d * sum(q) beyond the half range becomes inf, as in C
        s = (qs.astype(np.int32).sum(axis=1).astype(np.float32) * d[:, 0]).astype(np.float16)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), s[:, None].view(np.uint8), qs.view(np.uint8)], axis=1)
    return out.reshape(x.shape[0], -1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", ["normal", "scaled", "zeros", "f16_range", "tiny", "sparse"])
def test_activation_quantizers_identical_on_every_isa(case: str, isa: str) -> None:
    x = make(case, 5, 288, seed=2)
    assert np.array_equal(q.quantize("Q8_0", x, isa), gguf_quantize(x, "Q8_0"))
    assert np.array_equal(q.quantize("Q8_1", x, isa), q8_1_numpy(x))
    # ties of roundf (half away from zero) must not round to even
    t = (np.arange(-64, 64, dtype=np.float32) + np.float32(0.5))[None, :]
    t[0, 0] = 127.0  # amax 127 -> d = 1, id = 1: the scaled values are the ties themselves
    assert np.array_equal(q.quantize("Q8_0", t, isa), gguf_quantize(t, "Q8_0"))


# ---- dot products --------------------------------------------------------------------------
#
# Tolerance. Both our kernels compute the integer sum of each block exactly (or, for float
# weights, each product w_i * x_i exactly up to one rounding) and then add float terms
# t_k, K at a time along the longest dependency chain (blocks one after the other in the
# scalar reference; 8 or 16 lanes, several accumulators and a final horizontal sum in SIMD).
# The classic bound for a recursive float sum is |fl(sum t_k) - sum t_k| <= gamma_K * sum |t_k|
# with gamma_K = K u / (1 - K u), u = 2^-24; the block scale products d_w * d_a and the
# conversions add a few more roundings. So every implementation lies within
#     tol = (K + 8) * u * S,   S = sum over blocks of |d_w d_a| sum_j |q_j a_j| + |m s|
# of the exact value E of the same quantized numbers (computed here in float64), with
# K = number of blocks for block types and K = n / 8 + 8 for float weights.


def split_blocks(b: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    """Scales (float64) and integer quants of a row's blocks (GGUF layouts)."""
    sz = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34, "Q8_1": 36}[dtype]
    blk = b.reshape(-1, sz)
    out = {"d": blk[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float64)}
    if dtype in ("Q4_1", "Q8_1"):
        out["m" if dtype == "Q4_1" else "s"] = blk[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float64)
    qs = blk[:, sz - (16 if dtype.startswith("Q4") else 32):]
    if dtype.startswith("Q4"):
        nib = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int64)
        out["q"] = nib - 8 if dtype == "Q4_0" else nib
    else:
        out["q"] = qs.copy().view(np.int8).astype(np.int64)
    return out


def exact_dot(dtype: str, w_row: np.ndarray, x: np.ndarray) -> tuple[float, float, int]:
    """(E, S, K) for one weight row (bytes) and one float activation row."""
    if dtype in ("F32", "F16", "BF16"):
        wf = gguf_dequantize(w_row[None, :], dtype)[0].astype(np.float64)
        p = wf * x.astype(np.float64)
        return float(p.sum()), float(np.abs(p).sum()), x.size // 8 + 8
    act = q.act_type(dtype)
    a = split_blocks(q.quantize(act, x[None, :])[0], act)
    w = split_blocks(w_row, dtype)
    isum = (w["q"] * a["q"]).sum(axis=1)
    asum = np.abs(w["q"] * a["q"]).sum(axis=1)
    dd = w["d"] * a["d"]
    e = float((dd * isum).sum())
    s = float((np.abs(dd) * asum).sum())
    if dtype == "Q4_1":
        e += float((w["m"] * a["s"]).sum())
        s += float(np.abs(w["m"] * a["s"]).sum())
    return e, s, w["q"].shape[0]


def within(v: float, e: float, s: float, k: int) -> bool:
    return abs(v - e) <= (k + 8) * U * s + 1e-38


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", ["normal", "scaled", "zeros", "f16_range", "tiny", "sparse"])
@pytest.mark.parametrize("dtype", WEIGHT_TYPES)
def test_vec_dot_vs_exact_and_scalar(dtype: str, case: str, isa: str) -> None:
    for rows, cols in [(3, 32), (7, 96), (5, 1056)]:
        w = q.quantize(dtype, make(case, rows, cols, seed=4))
        x = make("normal" if case == "f16_range" else case, 1, cols, seed=5)[0]
        for r in range(rows):
            e, s, k = exact_dot(dtype, w[r], x)
            got = q.vec_dot(dtype, w[r], x, isa)
            ref = q.vec_dot(dtype, w[r], x, "scalar")
            assert within(got, e, s, k), (r, got, e, s)
            assert abs(got - ref) <= 2 * (k + 8) * U * s + 1e-38, (r, got, ref)


# ---- matmul --------------------------------------------------------------------------------


def act_quant_bound(act: str, wf: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Bound on |W (x - deq(quant(x)))| per output: the 8-bit rounding of an activation of
    type `act` (Q8_0 / Q8_1 blocks of 32, Q8_K of 256; zero for float activations)."""
    if act == "F32":
        return np.zeros((x.shape[0], wf.shape[0]))
    blk = 256 if act == "Q8_K" else 32
    amax = np.abs(x.reshape(x.shape[0], -1, blk)).max(axis=2).astype(np.float64)  # [n, nb]
    d = amax / 127
    # rounding to an integer, plus d stored as a half (Q8_0 / Q8_1; Q8_K's float d: 2^-23)
    err = d / 2 + 127 * d * (2.0**-22 if act == "Q8_K" else 2.0**-11)
    wabs = np.abs(wf.astype(np.float64)).reshape(wf.shape[0], -1, blk).sum(axis=2)  # [rows, nb]
    bound = err @ wabs.T
    if act == "Q8_1":  # s = d * sum(q) (|s| <= 32 amax) rounded to half, times m (|m| <= max |w|)
        wmax = np.abs(wf.astype(np.float64)).reshape(wf.shape[0], -1, 32).max(axis=2)
        bound += (amax * 32 * 2.0**-11) @ wmax.T
    return bound


ExactDot = Callable[[str, np.ndarray, np.ndarray], "tuple[float, float, int]"]


def check_matmul_vs_numpy(dtype: str, isa: str, cols: int, seed: int, exact: ExactDot) -> None:
    """q.matmul of a 37-row weight and 5 tokens: each output is the exact value of its
    quantized product (`exact`, within that sum's rounding bound), and against plain float
    math only the activation's quantization error remains. Shared with test_kquants.py."""
    rows, n = 37, 5
    w = q.quantize(dtype, make("scaled", rows, cols, seed=seed))
    wf = gguf_dequantize(w, dtype)
    x = make("normal", n, cols, seed=seed + 1)
    y = q.matmul(dtype, w, rows, cols, x, 2, isa)
    assert y.shape == (n, rows) and y.dtype == np.float32
    for t in range(n):
        for r in range(rows):
            e, s, k = exact(dtype, w[r], x[t])
            assert within(float(y[t, r]), e, s, k), (t, r)
    ref = x.astype(np.float64) @ wf.astype(np.float64).T
    slack = act_quant_bound(q.act_type(dtype), wf, x) + 1e-5 * (np.abs(x) @ np.abs(wf).T)
    assert np.all(np.abs(y - ref) <= slack)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", WEIGHT_TYPES)
def test_matmul_vs_numpy(dtype: str, isa: str) -> None:
    check_matmul_vs_numpy(dtype, isa, cols=320, seed=6, exact=exact_dot)


@pytest.mark.parametrize("dtype", WEIGHT_TYPES)
def test_matmul_bit_identical_across_threads_grouping_and_batch(dtype: str) -> None:
    rows, cols = 203, 576  # odd row count: groups of 4/8 rows plus leftovers
    w = q.quantize(dtype, make("scaled", rows, cols, seed=8))
    x = make("normal", 9, cols, seed=9)
    pools = [ThreadPool(n) for n in (1, 2, 3)]
    ys = [q.matmul(dtype, w, rows, cols, x, p) for p in pools]
    for y in ys[1:]:
        assert y.tobytes() == ys[0].tobytes()
    # decode one token at a time == prefill of all tokens, bit for bit
    for t in range(x.shape[0]):
        assert q.matmul(dtype, w, rows, cols, x[t : t + 1], pools[1]).tobytes() == ys[0][t : t + 1].tobytes()
    # the per-row kernel (vec_dot) == the row-group kernel inside matmul
    for isa in ISAS:
        y1 = q.matmul(dtype, w, rows, cols, x[:1], 2, isa)[0]
        dots = np.float32([q.vec_dot(dtype, w[r], x[0], isa) for r in range(rows)])
        assert y1.tobytes() == dots.tobytes(), isa


@pytest.mark.parametrize("isa", SIMD_ISAS)
@pytest.mark.parametrize("dtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_prefill_tiles_equal_one_token_per_isa(dtype: str, isa: str) -> None:
    """Every batch size a verify or a prefill chunk uses (the prefill tiles' full tiles and
    every edge: 4x4 / 2x4 tiles, AVX-512 Q4_1's passes of 8 tokens with 4- or 2-row tiles
    and a lone last token through the one-token kernel, rows and tokens left over) gives each token the bits of a one-token
    matmul on that ISA: the tiles reproduce vec_dot bit for bit."""
    rows, cols = 71, 1024  # rows: full tiles plus 3 (4-row) or 1 (2-row) left; 32 blocks a row
    w = q.quantize(dtype, make("scaled", rows, cols, seed=21))
    x = make("normal", 17, cols, seed=22)
    one = np.concatenate([q.matmul(dtype, w, rows, cols, x[t:t + 1], 2, isa) for t in range(17)])
    for n in (2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 17):
        y = q.matmul(dtype, w, rows, cols, x[:n], 2, isa)
        assert y.tobytes() == one[:n].tobytes(), (n, isa)


@pytest.mark.skipif("avx512" not in ISAS, reason="needs AVX-512 VNNI")
@pytest.mark.parametrize("case", ["normal", "scaled", "zeros", "f16_range", "tiny", "sparse"])
@pytest.mark.parametrize("dtype", ["Q4_1", "Q8_0"])
def test_avx512_row_lanes_equal_scalar_reference(dtype: str, case: str) -> None:
    """AVX-512 Q4_1 / Q8_0 (the row-lane kernels: 8 rows in the lanes of a vector, the
    reference's float operations in its order) equal the scalar reference bit for bit:
    vec_dot, the one-token row groups (full groups of 8 and a short last group) and every
    batch size of the verify / prefill tiles (passes of up to 16 tokens and the rest)."""
    rows, cols = 21, 576  # 2 groups of 8 and one of 5
    w = q.quantize(dtype, make(case, rows, cols, seed=31))
    x = make("normal" if case == "f16_range" else case, 19, cols, seed=32)
    ref = np.float32([[q.vec_dot(dtype, w[r], x[t], "scalar") for r in range(rows)] for t in range(19)])
    got = np.float32([[q.vec_dot(dtype, w[r], x[t], "avx512") for r in range(rows)] for t in range(19)])
    assert got.tobytes() == ref.tobytes()
    for n in (1, 2, 3, 8, 9, 16, 17, 19):
        y = q.matmul(dtype, w, rows, cols, x[:n], 2, "avx512")
        assert y.tobytes() == ref[:n].tobytes(), n


def test_matmul_multi_equals_separate_calls() -> None:
    cols = 256
    x = make("normal", 3, cols, seed=10)
    specs = [("Q4_1", 64), ("Q8_0", 33), ("F16", 17), ("Q4_0", 128), ("BF16", 5)]
    ws = [(dt, q.quantize(dt, make("scaled", rows, cols, seed=11 + i)), rows) for i, (dt, rows) in enumerate(specs)]
    for threads in (1, 2):
        outs = q.matmul_multi(ws, cols, x, threads)
        for (dt, b, rows), y in zip(ws, outs, strict=True):
            assert y.tobytes() == q.matmul(dt, b, rows, cols, x, 1).tobytes()


def test_get_rows() -> None:
    rows, cols = 50, 96
    for dtype in WEIGHT_TYPES:
        w = q.quantize(dtype, make("normal", rows, cols, seed=12))
        ids = np.array([3, 0, 49, 3], dtype=np.int32)
        assert same_bits(q.get_rows(dtype, w, rows, cols, ids), gguf_dequantize(w, dtype)[ids])
        with pytest.raises(errors.TokenOutOfRangeError):
            q.get_rows(dtype, w, rows, cols, np.array([1, 50], dtype=np.int32))
        with pytest.raises(errors.TokenOutOfRangeError):
            q.get_rows(dtype, w, rows, cols, np.array([-1], dtype=np.int32))


# ---- errors --------------------------------------------------------------------------------


def test_bad_sizes_raise_clear_errors() -> None:
    x = np.zeros((2, 64), np.float32)
    w = q.quantize("Q4_0", x)
    with pytest.raises(errors.InvalidRequestError, match="multiple of 32"):
        q.quantize("Q4_0", np.zeros((2, 40), np.float32))
    with pytest.raises(errors.InvalidRequestError, match="needs 36 bytes, got 35"):
        q.dequantize("Q4_0", w.ravel()[:35], 1, 64)
    with pytest.raises(errors.InvalidRequestError, match="bytes"):
        q.matmul("Q4_0", w, 3, 64, x)
    with pytest.raises(errors.InvalidRequestError, match="columns"):
        q.matmul("Q4_0", w, 2, 64, np.zeros((1, 32), np.float32))
    with pytest.raises(errors.InvalidRequestError, match="bytes"):
        q.vec_dot("Q4_0", w[0], np.zeros(96, np.float32))
    with pytest.raises(errors.InvalidRequestError, match="unknown tensor type"):
        q.quantize("Q3_X", x)
    with pytest.raises(errors.InvalidRequestError, match="unknown ISA"):
        q.dequantize("Q4_0", w, 2, 64, "sse9")
    with pytest.raises(errors.InvalidRequestError, match="unknown tensor type 'TQ1_0' .*Q4_K"):
        q.matmul("TQ1_0", np.zeros(54, np.uint8), 1, 256, np.zeros((1, 256), np.float32))
    with pytest.raises(errors.UnsupportedError, match="activation format"):
        q.vec_dot("Q8_1", np.zeros(36, np.uint8), np.zeros(32, np.float32))
    assert issubclass(errors.InvalidRequestError, ValueError)


def test_isa_listing() -> None:
    assert ISAS[0] == "scalar" and set(ISAS) <= set(q.isa_names())
    assert q.best_isa() in ISAS
    for dtype in WEIGHT_TYPES:
        assert q.has_kernels(dtype, "scalar")
    assert q.type_info("Q4_K") == {"name": "Q4_K", "id": 12, "block_size": 256, "type_size": 144,
                                   "implemented": True}


# ---- NEON under emulation ------------------------------------------------------------------
# The arm64 kernels cannot run on an x86 host natively. Where a cross compiler and
# qemu-user are installed (Debian: g++-aarch64-linux-gnu, qemu-user), the quant core is
# built for AArch64, with and without the dot-product extension, and checked against the
# scalar reference: identical quantizer bytes and dequantized bits, vec_dot_rows identical
# to vec_dot, dot products within the rounding bound above.

NEON_DRIVER = r"""
// Cross-check NEON kernels vs the scalar reference under qemu.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "quant/kernels.hpp"
#include "quant/dtype.hpp"
using namespace colibri;
int main() {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  int fails = 0;
  printf("best isa %s neon=%d\n", isa_name(best_isa()), (int)isa_available(Isa::NEON));
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q8_0, DType::Q8_1,
                  DType::Q8_K}) {
    const TypeKernels* s = kernels_for(t, Isa::Scalar);
    const TypeKernels* v = kernels_for(t, Isa::NEON);
    for (int64_t n : {32, 96, 1056, 4096}) {
      if (n % type_traits(t).block_size) continue;
      int rows = 7;
      std::vector<float> x(rows * n), xa(n);
      for (auto& f : x) f = nd(rng) * std::pow(10.f, (float)(rng() % 6) - 3);
      for (int i = 0; i < n; i += 64) for (int j = 0; j < 32 && i + j < n; ++j) x[i + j] = 0;  // zero blocks
      for (auto& f : xa) f = nd(rng);
      size_t rb = row_bytes(t, n);
      std::vector<unsigned char> w(rows * rb), w2(rows * rb);
      for (int r = 0; r < rows; ++r) { s->quantize_row(&x[r*n], &w[r*rb], n); v->quantize_row(&x[r*n], &w2[r*rb], n); }
      if (w != w2) { printf("quantize_row differs %s n=%ld\n", dtype_name(t).c_str(), (long)n); fails++; }
      std::vector<float> d1(n), d2(n);
      for (int r = 0; r < rows; ++r) {
        s->dequantize_row(&w[r*rb], d1.data(), n); v->dequantize_row(&w[r*rb], d2.data(), n);
        if (memcmp(d1.data(), d2.data(), n * 4)) { printf("dequant differs %s\n", dtype_name(t).c_str()); fails++; break; }
      }
      // act quantizers
      size_t ab = row_bytes(s->act_type, n);
      std::vector<unsigned char> a1(ab), a2(ab);
      s->quantize_act(xa.data(), a1.data(), n); v->quantize_act(xa.data(), a2.data(), n);
      if (a1 != a2) { printf("quantize_act differs %s\n", dtype_name(t).c_str()); fails++; }
      if (!s->vec_dot) continue;
      std::vector<float> out(rows);
      v->vec_dot_rows(n, w.data(), rb, rows, a1.data(), out.data());
      double maxrel = 0;
      for (int r = 0; r < rows; ++r) {
        float rs = s->vec_dot(n, &w[r*rb], a1.data()), rv = v->vec_dot(n, &w[r*rb], a1.data());
        if (memcmp(&rv, &out[r], 4)) { printf("rows != vec_dot %s r=%d\n", dtype_name(t).c_str(), r); fails++; }
        // scale: sum |w_i a_i| over dequantized values
        s->dequantize_row(&w[r*rb], d1.data(), n);
        std::vector<float> ad(n);
        kernels_for(s->act_type, Isa::Scalar)->dequantize_row(a1.data(), ad.data(), n);
        double S = 0; for (int i = 0; i < n; ++i) S += std::fabs((double)d1[i] * ad[i]);
        double rel = std::fabs((double)rs - rv) / (S + 1e-30);
        if (rel > maxrel) maxrel = rel;
      }
      printf("%-5s n=%-5ld max |neon-scalar|/S = %.2e (u*(n/32+8) = %.2e)\n", dtype_name(t).c_str(), (long)n, maxrel, 5.96e-8 * (n / 32 + 8));
      if (maxrel > 2 * 5.96e-8 * (n / 8 + 16)) { printf("  TOO LARGE\n"); fails++; }
    }
  }
  printf(fails ? "FAILURES: %d\n" : "ALL OK\n", fails);
  return fails != 0;
}
"""


@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+dotprod"])
def test_neon_kernels_under_qemu(tmp_path: Path, march: str) -> None:
    cxx, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if not cxx or not qemu:  # scripts/test.sh installs them (Debian packages)
        pytest.fail("the NEON check needs aarch64-linux-gnu-g++ and qemu-aarch64: apt-get "
                    "install g++-aarch64-linux-gnu qemu-user (scripts/test.sh does)")
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "main.cpp").write_text(NEON_DRIVER)
    # Every quant source except the x86 kernels (the core's CMake selects the same way).
    srcs = sorted(p for p in (root / "csrc/quant").glob("*.cpp") if not p.stem.endswith(("_avx2", "_avx512")))
    exe = tmp_path / "neon_check"
    cmd = [cxx, "-O2", "-std=gnu++17", "-Wall", "-Wextra", "-Werror", f"-march={march}", "-static",
           "-DCOLIBRI_ARM=1", f"-I{root / 'csrc'}", *map(str, srcs), str(tmp_path / "main.cpp"), "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True)
    out = subprocess.run([qemu, str(exe)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ALL OK" in out.stdout, out.stdout[-3000:]
