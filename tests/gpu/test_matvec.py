"""The GPU matvec kernels (csrc/gpu/matvec_wgsl*.cpp, every type in TYPES) against
the CPU scalar reference, on lavapipe: dequantization bit for bit, y = W x within the
float32 summation bound, two runs bit-identical, and a weight split across several
bindings equal to the unsplit one."""

from __future__ import annotations

import numpy as np
import pytest

from colibri import errors
from colibri._core import gpu as core_gpu
from colibri._core import quant as q

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K",
         "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
         "IQ1_S", "IQ1_M", "MXFP4")
SUPER_BLOCK_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS",
                     "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")  # 256-element blocks
SCALED_TYPES = ("F8_E4M3",)  # with block scales: tests/gpu/test_matvec_fp8.py
ROWS = 67  # not a multiple of the workgroup
U = 2.0 ** -24  # float32 unit roundoff


def cols_of(dtype: str) -> int:
    """10 blocks of 32, or 3 super-blocks of 256 (24 sub-blocks: fewer than the 64 threads
    of a row, so some threads sum nothing)."""
    return 768 if dtype in SUPER_BLOCK_TYPES else 320


def weight_bytes(dtype: str, w: np.ndarray) -> np.ndarray:
    """`w` [rows, cols] float32 stored as `dtype`'s GGUF bytes."""
    if dtype == "F32":
        return w.astype(np.float32).view(np.uint8).reshape(-1)
    if dtype == "F16":
        return w.astype(np.float16).view(np.uint8).reshape(-1)
    if dtype == "BF16":  # truncated f32: the top 16 bits of each value
        top = (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return top.view(np.uint8).reshape(-1)
    return np.concatenate([q.quantize(dtype, row) for row in w])


def sample(dtype: str, rows: int = ROWS, cols: int | None = None, seed: int = 0) -> np.ndarray:
    cols = cols_of(dtype) if cols is None else cols
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if dtype == "F16":  # the decoder's edge cases: subnormals, -0, the largest half
        w[0, :4] = [6e-8, -3e-5, -0.0, 65504.0]
    return weight_bytes(dtype, w)


def test_the_kernel_types_are_the_ones_tested() -> None:
    assert core_gpu.compiled()
    assert sorted(core_gpu.kernel_types()) == sorted(TYPES + SCALED_TYPES)


def test_every_weight_type_of_the_cpu_has_a_gpu_kernel() -> None:
    """The CPU's weight types (GGUF's and the scaled FP8), all on the GPU: none left to
    fall back for (activation formats such as Q8_K are not weights)."""
    cpu = set(q.type_names("weight")) | set(q.type_names("scaled_weight"))
    assert cpu == set(TYPES + SCALED_TYPES)


@pytest.mark.parametrize("dtype", TYPES)
def test_dequantization_is_exact(device: core_gpu.Device, dtype: str) -> None:
    cols = cols_of(dtype)
    data = sample(dtype)
    m = device.upload(dtype, data, ROWS, cols)
    ref = q.dequantize(dtype, data, ROWS, cols, isa="scalar")
    got = device.dequantize(m)
    assert got.shape == (ROWS, cols)
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("dtype", TYPES)
def test_matvec_within_the_float32_summation_bound(device: core_gpu.Device, dtype: str) -> None:
    cols = cols_of(dtype)
    data = sample(dtype, seed=1)
    x = np.random.default_rng(2).standard_normal(cols).astype(np.float32)
    w = q.dequantize(dtype, data, ROWS, cols, isa="scalar").astype(np.float64)
    exact = w @ x.astype(np.float64)
    y = device.matvec(device.upload(dtype, data, ROWS, cols), x)
    # The GPU sums cols float32 products in some fixed order (plus one rounding for a
    # block's scale): |error| <= (cols + 2) * u * sum|w x| (the classic bound for a
    # recursive sum, u = 2^-24). The float64 reference's own error is far below it.
    bound = (cols + 2) * U * (np.abs(w) @ np.abs(x.astype(np.float64)))
    err = np.abs(y.astype(np.float64) - exact)
    assert np.all(err <= bound), f"worst excess {np.max(err - bound)}"
    # and it is a real product, not a lucky zero: the error is a small share of the bound
    assert np.linalg.norm(y) > 0.1 * np.linalg.norm(exact)


@pytest.mark.parametrize("dtype", TYPES)
def test_two_runs_are_bit_identical(device: core_gpu.Device, dtype: str) -> None:
    cols = cols_of(dtype)
    data = sample(dtype, seed=3)
    x = np.random.default_rng(4).standard_normal(cols).astype(np.float32)
    m = device.upload(dtype, data, ROWS, cols)
    first = device.matvec(m, x)
    again = device.matvec(device.upload(dtype, data, ROWS, cols), x)
    np.testing.assert_array_equal(first.view(np.uint32), device.matvec(m, x).view(np.uint32))
    np.testing.assert_array_equal(first.view(np.uint32), again.view(np.uint32))


@pytest.mark.parametrize("dtype", TYPES)
def test_a_weight_split_across_bindings_gives_the_same_bits(device: core_gpu.Device,
                                                            dtype: str) -> None:
    """A split size of a few rows forces many chunks (the path a tensor larger than the
    adapter's binding limit takes); each row is summed the same way in any chunk."""
    cols = cols_of(dtype)
    data = sample(dtype, seed=5)
    x = np.random.default_rng(6).standard_normal(cols).astype(np.float32)
    row_bytes = q.row_bytes(dtype, cols)
    whole = device.upload(dtype, data, ROWS, cols)
    split = device.upload(dtype, data, ROWS, cols, split_bytes=3 * row_bytes + 1)
    assert whole.chunks == 1 and split.chunks == -(-ROWS // 3)
    np.testing.assert_array_equal(device.matvec(split, x).view(np.uint32),
                                  device.matvec(whole, x).view(np.uint32))
    np.testing.assert_array_equal(device.dequantize(split), device.dequantize(whole))


def test_more_rows_than_one_dispatch_dimension(device: core_gpu.Device) -> None:
    """Rows beyond maxComputeWorkgroupsPerDimension (65535) go to a second grid row."""
    rows, cols = 70_000, 32
    data = sample("Q8_0", rows, cols, seed=7)
    x = np.random.default_rng(8).standard_normal(cols).astype(np.float32)
    w = q.dequantize("Q8_0", data, rows, cols, isa="scalar").astype(np.float64)
    y = device.matvec(device.upload("Q8_0", data, rows, cols), x)
    bound = (cols + 2) * U * (np.abs(w) @ np.abs(x.astype(np.float64)))
    assert np.all(np.abs(y - w @ x.astype(np.float64)) <= bound)


@pytest.mark.parametrize("dtype", TYPES)
def test_a_wrong_byte_count_is_refused(device: core_gpu.Device, dtype: str) -> None:
    cols = cols_of(dtype)
    data = sample(dtype, rows=2, seed=9).reshape(-1)
    with pytest.raises(errors.InvalidRequestError, match=f"got {data.size - 1}$"):
        device.upload(dtype, data[:-1], 2, cols)
    with pytest.raises(errors.InvalidRequestError, match=f"got {data.size + 1}$"):
        device.upload(dtype, np.concatenate([data, data[:1]]), 2, cols)


def test_mxfp4_scales_below_the_float32_normal_range_dequantize_exactly(
        device: core_gpu.Device) -> None:
    """E8M0 exponents 0 and 1 make the scale 2^(e-128) a float32 subnormal, which a GPU may
    flush; the kernel builds those values with integer operations. Every nibble under
    e = 0, 1, 2 and a large e, against the CPU reference."""
    nibbles = np.arange(16, dtype=np.uint8)
    qs = (nibbles | (nibbles[::-1] << 4)).astype(np.uint8)  # all 16 codes, low and high
    blocks = [np.concatenate([[e], qs]).astype(np.uint8) for e in (0, 1, 2, 3, 127, 200)]
    data = np.concatenate(blocks)
    cols = 32 * len(blocks)
    ref = q.dequantize("MXFP4", data, 1, cols, isa="scalar")
    got = device.dequantize(device.upload("MXFP4", data, 1, cols))
    assert np.count_nonzero(ref[0, :64]) == 56  # subnormals and the first normals, not zeros
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
