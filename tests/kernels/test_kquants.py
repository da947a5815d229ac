"""K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K against Q8_K) and Q5_0 / Q5_1 (against Q8_0 /
Q8_1): the core's kernels (colibri._core.quant) against independent oracles.

* Quantize: byte-identical to llama.cpp's own reference quantizers (libggml's
  ``quantize_row_*_ref`` through ctypes, tests/support/ggml_oracle.py; skipped without
  llama-cpp-python) and, for Q5_0 / Q5_1 which it implements, to ``gguf.quants.quantize``.
* Dequantize: every ISA bit-identical to ``gguf.quants.dequantize``, on our blocks and on
  random bytes (every scale, min and high-bit pattern).
* Dot products: the float64 value of the very same quantized numbers, decoded here from the
  GGUF layout in NumPy, within the rounding bound of tests/kernels/test_quant.py (derived there:
  (K + 8) u S, K terms accumulated, S the sum of the terms' magnitudes). The K-quant SIMD
  kernels keep each super-block's integer sums exact and then use the reference's own float
  expression, so they must equal the scalar reference BIT FOR BIT; Q5_0 / Q5_1 accumulate in
  float vectors like Q4_0 / Q4_1 and must agree to that bound.
* Matmul: the per-row kernel, any thread count, row grouping or token batch, bit for bit; the
  float32-activation path within float rounding of the float64 product of the dequantized
  weights.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GT
from test_quant import (
    U,
    check_matmul_vs_numpy,
    gguf_dequantize,
    gguf_quantize,
    make,
    same_bits,
    within,
)

from colibri import errors
from colibri._core import ThreadPool
from colibri._core import quant as q
from support import ggml_oracle

ISAS = q.available_isas()
KQUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
Q5 = ["Q5_0", "Q5_1"]
TYPES = KQUANTS + Q5
CASES = ["normal", "scaled", "zeros", "f16_range", "huge", "tiny", "sparse"]
DOT_CASES = ["normal", "scaled", "zeros", "f16_range", "tiny", "sparse"]


def shapes(dtype: str) -> list[tuple[int, int]]:
    """Odd row counts; several blocks per row."""
    if dtype in KQUANTS:
        return [(1, 256), (7, 512), (13, 1280)]
    return [(1, 32), (7, 96), (13, 288)]


# ---- layout decoding (NumPy, from the GGUF block layouts) ---------------------------------


def _half(b: np.ndarray) -> np.ndarray:
    return b.copy().view(np.float16)[:, 0].astype(np.float64)


def decode(dtype: str, row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One weight row's bytes -> (dsc, dm, q) per element, value = dsc * q - dm, with dsc the
    float64 product of the super-block scale and the sub-block scale, dm the same for the
    min, and q the integer quant."""
    block, size = GGML_QUANT_SIZES[GT[dtype]]
    b = row.reshape(-1, size)
    nb = b.shape[0]
    e = np.arange(block)
    zeros = np.zeros((nb, block))
    if dtype == "Q2_K":
        sc, qs, d, dmin = b[:, :16], b[:, 16:80], _half(b[:, 80:82]), _half(b[:, 82:84])
        qv = (qs[:, 32 * (e // 128) + e % 32] >> (2 * ((e % 128) // 32))) & 3
        g = sc[:, e // 16].astype(np.int64)
        return d[:, None] * (g & 15), dmin[:, None] * (g >> 4), qv.astype(np.int64)
    if dtype == "Q3_K":
        hm, qs, s, d = b[:, :32], b[:, 32:96], b[:, 96:108].astype(np.int64), _half(b[:, 108:110])
        j = np.arange(16)
        lo = np.where(j < 8, s[:, np.minimum(j, 7)] & 15, s[:, np.maximum(j - 8, 0)] >> 4)
        hi = (s[:, 8 + j % 4] >> (2 * (j // 4))) & 3
        scales = (lo | (hi << 4)) - 32
        low = (qs[:, 32 * (e // 128) + e % 32] >> (2 * ((e % 128) // 32))) & 3
        hbit = (hm[:, e % 32] >> (4 * (e // 128) + (e % 128) // 32)) & 1
        qv = low.astype(np.int64) - 4 * (1 - hbit.astype(np.int64))
        return d[:, None] * scales[:, e // 16], zeros, qv
    if dtype in ("Q4_K", "Q5_K"):
        d, dmin, s = _half(b[:, 0:2]), _half(b[:, 2:4]), b[:, 4:16].astype(np.int64)
        qs = b[:, 48:176] if dtype == "Q5_K" else b[:, 16:144]
        j = np.arange(8)
        jl, jh = np.minimum(j, 3), np.maximum(j - 4, 0)
        sc = np.where(j < 4, s[:, jl] & 63, (s[:, jh + 8] & 15) | ((s[:, jh] >> 6) << 4))
        mn = np.where(j < 4, s[:, jl + 4] & 63, (s[:, jh + 8] >> 4) | ((s[:, jh + 4] >> 6) << 4))
        byte = qs[:, 32 * (e // 64) + e % 32]
        qv = np.where(e % 64 < 32, byte & 15, byte >> 4).astype(np.int64)
        if dtype == "Q5_K":
            qh = b[:, 16:48]
            qv |= ((qh[:, e % 32] >> (2 * (e // 64) + (e % 64) // 32)) & 1).astype(np.int64) << 4
        return d[:, None] * sc[:, e // 32], dmin[:, None] * mn[:, e // 32], qv
    if dtype == "Q6_K":
        ql, qh, d = b[:, :128], b[:, 128:192], _half(b[:, 208:210])
        sc = b[:, 192:208].copy().view(np.int8).astype(np.int64)
        h, k, lane = e // 128, (e % 128) // 32, e % 32
        v = ql[:, 64 * h + lane + 32 * (k & 1)]
        lo = np.where(k < 2, v & 15, v >> 4).astype(np.int64)
        hi = ((qh[:, 32 * h + lane] >> (2 * k)) & 3).astype(np.int64)
        return d[:, None] * sc[:, e // 16], zeros, (lo | (hi << 4)) - 32
    if dtype in ("Q5_0", "Q5_1"):
        off = 4 if dtype == "Q5_1" else 2
        d = _half(b[:, 0:2])
        qh = b[:, off : off + 4].copy().view("<u4")[:, 0].astype(np.int64)
        qs = b[:, off + 4 :].astype(np.int64)
        nib = np.where(e < 16, qs[:, e % 16] & 15, qs[:, e % 16] >> 4)
        qv = nib | (((qh[:, None] >> e) & 1) << 4)
        if dtype == "Q5_0":
            return np.repeat(d[:, None], block, axis=1), zeros, qv - 16
        m = _half(b[:, 2:4])
        return np.repeat(d[:, None], block, axis=1), -np.repeat(m[:, None], block, axis=1), qv
    raise ValueError(dtype)


def decode_act(act: str, row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(d per element (float64), q per element, Q8_1's stored s per block or None)."""
    if act == "Q8_K":
        b = row.reshape(-1, 292)
        d = b[:, :4].copy().view(np.float32)[:, 0].astype(np.float64)
        return np.repeat(d, 256), b[:, 4:260].copy().view(np.int8).astype(np.int64).ravel(), None
    size = 34 if act == "Q8_0" else 36
    b = row.reshape(-1, size)
    s = _half(b[:, 2:4]) if act == "Q8_1" else None
    return (
        np.repeat(_half(b[:, 0:2]), 32),
        b[:, size - 32 :].copy().view(np.int8).astype(np.int64).ravel(),
        s,
    )


def exact_dot(dtype: str, w_row: np.ndarray, x: np.ndarray) -> tuple[float, float, int]:
    """(E, S, K): the float64 value of the quantized dot product the kernels compute, the
    sum of its terms' magnitudes, and the number of accumulated block terms."""
    dsc, dm, qv = (a.ravel() for a in decode(dtype, w_row))
    da, qa, s = decode_act(q.act_type(dtype), q.quantize(q.act_type(dtype), x[None, :])[0])
    main = dsc * qv * da * qa
    if s is not None:  # Q5_1: + m * s per block, s = d_a * sum(q_a) as stored (a half)
        mterm = dm.reshape(-1, 32)[:, 0] * s  # dm = -m
    else:
        mterm = dm * da * qa
    e = float(main.sum() - mterm.sum())
    sabs = float(np.abs(main).sum() + np.abs(mterm).sum())
    return e, sabs, x.size // GGML_QUANT_SIZES[GT[dtype]][0]


# ---- layouts, quantize, dequantize ---------------------------------------------------------


@pytest.mark.parametrize("dtype", TYPES)
def test_layout_matches_gguf(dtype: str) -> None:
    block, size = GGML_QUANT_SIZES[GT[dtype]]
    info = q.type_info(dtype)
    assert (info["id"], info["block_size"], info["type_size"], info["implemented"]) == (
        int(GT[dtype]),
        block,
        size,
        True,
    )
    assert q.act_type(dtype) == {"Q5_0": "Q8_0", "Q5_1": "Q8_1"}.get(dtype, "Q8_K")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", TYPES)
def test_quantize_bytes_match_llama_cpp(dtype: str, case: str) -> None:
    have_ggml = ggml_oracle._lib() is not None
    if dtype in KQUANTS and not have_ggml:
        pytest.skip("gguf.quants has no K-quant quantizer; needs llama-cpp-python's libggml")
    for rows, cols in shapes(dtype):
        x = make(case, rows, cols, seed=11)
        ours = q.quantize(dtype, x)
        assert ours.shape == (rows, q.row_bytes(dtype, cols))
        if dtype in Q5:
            assert np.array_equal(ours, gguf_quantize(x, dtype)), (case, rows, cols)
        if have_ggml:
            assert np.array_equal(ours, ggml_oracle.quantize(dtype, x)), (case, rows, cols)
        for isa in ISAS:
            assert np.array_equal(q.quantize(dtype, x, isa), ours), isa


def random_blocks(dtype: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random bytes with finite, moderate half scales (every quant and scale bit pattern)."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[GT[dtype]]
    b = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    halves = {"Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
              "Q5_0": [0], "Q5_1": [0, 2]}[dtype]  # fmt: skip
    for off in halves:
        b[:, off : off + 2] = (
            (rng.standard_normal(b.shape[0]) * 0.01)
            .astype(np.float16)
            .view(np.uint8)
            .reshape(-1, 2)
        )
    return b.reshape(rows, -1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", TYPES)
def test_dequantize_bits_match_gguf(dtype: str, isa: str) -> None:
    for case in CASES:
        for rows, cols in shapes(dtype):
            b = q.quantize(dtype, make(case, rows, cols, seed=12))
            assert same_bits(q.dequantize(dtype, b, rows, cols, isa), gguf_dequantize(b, dtype)), (
                case,
                rows,
            )
    for rows, cols in shapes(dtype):
        b = random_blocks(dtype, rows, cols, seed=13)
        assert same_bits(q.dequantize(dtype, b, rows, cols, isa), gguf_dequantize(b, dtype)), (
            "random",
            rows,
        )


@pytest.mark.parametrize("dtype", TYPES)
def test_numpy_decoder_matches_gguf(dtype: str) -> None:
    # the decoder behind the exact dot products agrees with gguf's dequantization
    rows, cols = shapes(dtype)[1]
    for b in (
        q.quantize(dtype, make("scaled", rows, cols, seed=14)),
        random_blocks(dtype, rows, cols, 15),
    ):
        for r in range(rows):
            dsc, dm, qv = decode(dtype, b[r])
            got = (dsc * qv - dm).ravel()
            want = gguf_dequantize(b[r : r + 1], dtype)[0].astype(np.float64)
            assert np.allclose(got, want, rtol=4 * U, atol=0), r


def test_quantization_error_is_small() -> None:
    # Sanity of the quantizers themselves: relative RMS error on Gaussian rows, ordered by bits.
    x = make("normal", 16, 2048, seed=16)
    err = {}
    for dtype in TYPES:
        y = gguf_dequantize(q.quantize(dtype, x), dtype)
        err[dtype] = float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)))
    assert err["Q6_K"] < err["Q5_K"] < err["Q4_K"] < err["Q3_K"] < err["Q2_K"] < 0.5
    assert err["Q5_1"] < 0.06 and err["Q5_0"] < 0.06 and err["Q6_K"] < 0.025, err


# ---- dot products --------------------------------------------------------------------------


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("case", DOT_CASES)
@pytest.mark.parametrize("dtype", TYPES)
def test_vec_dot_vs_exact_and_scalar(dtype: str, case: str, isa: str) -> None:
    for rows, cols in shapes(dtype):
        w = q.quantize(dtype, make(case, rows, cols, seed=17))
        x = make("normal" if case == "f16_range" else case, 1, cols, seed=18)[0]
        for r in range(rows):
            e, s, k = exact_dot(dtype, w[r], x)
            got = q.vec_dot(dtype, w[r], x, isa)
            ref = q.vec_dot(dtype, w[r], x, "scalar")
            assert within(ref, e, s, k), (r, ref, e, s)
            if dtype in KQUANTS:
                assert np.float32(got).tobytes() == np.float32(ref).tobytes(), (r, got, ref)
            else:
                assert within(got, e, s, k), (r, got, e, s)


@pytest.mark.parametrize("dtype", KQUANTS)
def test_vec_dot_random_blocks_every_isa_identical(dtype: str) -> None:
    # Random bytes reach the extreme quants and scales (Q6_K's -128 scale, Q3_K's -4 quants)
    # that quantized Gaussians rarely do.
    cols = 1536
    w = random_blocks(dtype, 9, cols, seed=19)
    for case in ("normal", "sparse", "scaled"):
        x = make(case, 1, cols, seed=20)[0]
        for r in range(9):
            e, s, k = exact_dot(dtype, w[r], x)
            ref = q.vec_dot(dtype, w[r], x, "scalar")
            assert within(ref, e, s, k)
            for isa in ISAS:
                assert (
                    np.float32(q.vec_dot(dtype, w[r], x, isa)).tobytes()
                    == np.float32(ref).tobytes()
                ), isa


# ---- matmul --------------------------------------------------------------------------------


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", TYPES)
def test_matmul_vs_numpy(dtype: str, isa: str) -> None:
    check_matmul_vs_numpy(dtype, isa, cols=512, seed=21, exact=exact_dot)


@pytest.mark.parametrize("dtype", TYPES)
def test_matmul_bit_identical_across_threads_grouping_and_batch(dtype: str) -> None:
    rows, cols = 203, 768  # odd row count: groups of 4/8 rows plus leftovers
    w = q.quantize(dtype, make("scaled", rows, cols, seed=23))
    x = make("normal", 9, cols, seed=24)
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
        if dtype in KQUANTS:  # every ISA computes the scalar reference's bits
            assert y1.tobytes() == ys[0][0].tobytes(), isa


@pytest.mark.parametrize("dtype", TYPES)
def test_float32_activations_are_the_exact_path(dtype: str) -> None:
    rows, cols, n = 29, 768, 3
    w = q.quantize(dtype, make("scaled", rows, cols, seed=25))
    wf = gguf_dequantize(w, dtype).astype(np.float64)
    x = make("normal", n, cols, seed=26)
    y = q.matmul(dtype, w, rows, cols, x, 2, act="float32")
    ref = x.astype(np.float64) @ wf.T
    mag = np.abs(x.astype(np.float64)) @ np.abs(wf).T
    k = cols // 8 + 8  # the F32 kernels' accumulation depth (tests/kernels/test_quant.py)
    assert np.all(np.abs(y - ref) <= (k + 8) * U * mag + 1e-38)
    assert q.matmul(dtype, w, rows, cols, x, 1, act="float32").tobytes() == y.tobytes()
    assert q.matmul(dtype, w, rows, cols, x[1:2], 3, act="float32").tobytes() == y[1:2].tobytes()


def test_matmul_multi_mixed_types_equals_separate_calls() -> None:
    # a K-quant mix: every weight of one input in its own type and activation format
    cols = 512
    x = make("normal", 3, cols, seed=27)
    specs = [
        ("Q4_K", 64),
        ("Q6_K", 33),
        ("Q5_0", 17),
        ("Q8_0", 9),
        ("Q5_1", 12),
        ("Q3_K", 5),
        ("Q2_K", 8),
        ("Q5_K", 40),
        ("Q4_1", 7),
    ]
    ws = [
        (dt, q.quantize(dt, make("scaled", rows, cols, seed=28 + i)), rows)
        for i, (dt, rows) in enumerate(specs)
    ]
    for threads in (1, 2):
        outs = q.matmul_multi(ws, cols, x, threads)
        for (dt, b, rows), y in zip(ws, outs, strict=True):
            assert y.tobytes() == q.matmul(dt, b, rows, cols, x, 1).tobytes(), dt


def test_get_rows() -> None:
    for dtype in TYPES:
        rows, cols = 50, shapes(dtype)[1][1]
        w = q.quantize(dtype, make("normal", rows, cols, seed=29))
        ids = np.array([3, 0, 49, 3], dtype=np.int32)
        assert same_bits(q.get_rows(dtype, w, rows, cols, ids), gguf_dequantize(w, dtype)[ids])
        with pytest.raises(errors.TokenOutOfRangeError):
            q.get_rows(dtype, w, rows, cols, np.array([50], dtype=np.int32))


def test_bad_sizes_raise_clear_errors() -> None:
    with pytest.raises(errors.InvalidRequestError, match="multiple of 256"):
        q.quantize("Q4_K", np.zeros((2, 288), np.float32))
    with pytest.raises(errors.InvalidRequestError, match="needs 144 bytes, got 143"):
        q.dequantize("Q4_K", np.zeros(143, np.uint8), 1, 256)
    with pytest.raises(errors.UnsupportedError, match="activation format"):
        q.vec_dot("Q8_K", np.zeros(292, np.uint8), np.zeros(256, np.float32))
    with pytest.raises(errors.InvalidRequestError, match="unknown activation precision"):
        q.matmul(
            "Q4_K", np.zeros(144, np.uint8), 1, 256, np.zeros((1, 256), np.float32), act="int4"
        )


# ---- NEON under emulation ------------------------------------------------------------------
# As in tests/kernels/test_quant.py: where a cross compiler and qemu-user are installed, the quant
# core is built for AArch64 (with and without the dot-product extension) and each type's
# NEON kernels are checked against the scalar reference on random data, zero blocks, extreme
# scales and random bytes: identical quantizer bytes and dequantized bits, vec_dot_rows equal
# to vec_dot, and K-quant dots bit-identical to the scalar ones (Q5_0 / Q5_1 within the
# rounding bound).

NEON_DRIVER = r"""
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "quant/kernels.hpp"
#include "quant/dtype.hpp"
using namespace colibri;
int main() {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  int fails = 0;
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q5_0, DType::Q5_1,
                  DType::Q8_K}) {
    const TypeKernels* s = kernels_for(t, Isa::Scalar);
    const TypeKernels* v = kernels_for(t, Isa::NEON);
    if (!s || !v) { printf("missing kernels %s\n", dtype_name(t).c_str()); fails++; continue; }
    const bool kq = type_traits(t).block_size == 256;
    for (int64_t n : {256, 768, 4096}) {
      for (int mode = 0; mode < 3; ++mode) {  // 0 normal, 1 scaled with zero blocks, 2 random bytes
        const int rows = 7;
        std::vector<float> x(rows * n), xa(n);
        for (auto& f : x) f = nd(rng) * (mode == 1 ? std::pow(10.f, (float)(rng() % 10) - 6) : 1.f);
        if (mode == 1) for (int64_t i = 0; i < rows * n; i += 512) for (int j = 0; j < 256 && i + j < rows * n; ++j) x[i + j] = 0;
        for (auto& f : xa) f = nd(rng);
        const size_t rb = row_bytes(t, n);
        std::vector<unsigned char> w(rows * rb), w2(rows * rb);
        for (int r = 0; r < rows; ++r) { s->quantize_row(&x[r*n], &w[r*rb], n); v->quantize_row(&x[r*n], &w2[r*rb], n); }
        if (w != w2) { printf("quantize_row differs %s\n", dtype_name(t).c_str()); fails++; }
        if (mode == 2 && t != DType::Q8_K) {  // random bytes, then sane scales via a requantize of half of them
          for (auto& b : w) b = (unsigned char)rng();
          std::vector<unsigned char> tmp(rb);
          for (int r = 0; r < rows; r += 2) { s->quantize_row(&x[r*n], tmp.data(), n); memcpy(&w[r*rb], tmp.data(), rb); }
        }
        std::vector<float> d1(n), d2(n);
        for (int r = 0; r < rows; ++r) {
          s->dequantize_row(&w[r*rb], d1.data(), n); v->dequantize_row(&w[r*rb], d2.data(), n);
          if (memcmp(d1.data(), d2.data(), n * 4)) { printf("dequant differs %s\n", dtype_name(t).c_str()); fails++; break; }
        }
        const size_t ab = row_bytes(s->act_type, n);
        std::vector<unsigned char> a1(ab), a2(ab);
        s->quantize_act(xa.data(), a1.data(), n); v->quantize_act(xa.data(), a2.data(), n);
        if (a1 != a2) { printf("quantize_act differs %s\n", dtype_name(t).c_str()); fails++; }
        if (!s->vec_dot) continue;
        std::vector<float> out(rows);
        v->vec_dot_rows(n, w.data(), rb, rows, a1.data(), out.data());
        for (int r = 0; r < rows; ++r) {
          const float rs = s->vec_dot(n, &w[r*rb], a1.data()), rv = v->vec_dot(n, &w[r*rb], a1.data());
          // (random bytes can make inf/NaN scales: any NaN equals any NaN here)
          if (memcmp(&rv, &out[r], 4) && !(std::isnan(rv) && std::isnan(out[r]))) {
            printf("rows != vec_dot %s r=%d\n", dtype_name(t).c_str(), r); fails++;
          }
          if (kq) {
            if (memcmp(&rs, &rv, 4) && !(std::isnan(rs) && std::isnan(rv))) {
              printf("%s n=%ld mode=%d r=%d: neon %.9g != scalar %.9g\n", dtype_name(t).c_str(), (long)n, mode, r, rv, rs);
              fails++;
            }
            continue;
          }
          s->dequantize_row(&w[r*rb], d1.data(), n);
          std::vector<float> ad(n);
          kernels_for(s->act_type, Isa::Scalar)->dequantize_row(a1.data(), ad.data(), n);
          double S = 0; for (int i = 0; i < n; ++i) S += std::fabs((double)d1[i] * ad[i]);
          if (std::fabs((double)rs - rv) > 2 * 5.96e-8 * (n / 32 + 16) * S + 1e-30) {
            printf("%s n=%ld: |neon - scalar| too large\n", dtype_name(t).c_str(), (long)n); fails++;
          }
        }
      }
    }
  }
  printf(fails ? "FAILURES: %d\n" : "ALL OK\n", fails);
  return fails != 0;
}
"""


@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+dotprod"])
def test_neon_kernels_under_qemu(tmp_path: Path, march: str) -> None:
    cxx, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if not cxx or not qemu:
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64")
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "main.cpp").write_text(NEON_DRIVER)
    srcs = sorted(
        p for p in (root / "csrc/quant").glob("*.cpp") if not p.stem.endswith(("_avx2", "_avx512"))
    )
    exe = tmp_path / "neon_check"
    cmd = [cxx, "-O2", "-std=gnu++17", "-Wall", "-Wextra", "-Werror", f"-march={march}", "-static",
           "-DCOLIBRI_ARM=1", f"-I{root / 'csrc'}", *map(str, srcs), str(tmp_path / "main.cpp"), "-o", str(exe)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True)
    out = subprocess.run([qemu, str(exe)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ALL OK" in out.stdout, out.stdout[-3000:]
