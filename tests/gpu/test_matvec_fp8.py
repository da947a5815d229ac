"""The GPU's F8_E4M3 kernel (csrc/gpu/matvec_wgsl_fp8.cpp): e4m3 codes with their F32
block scales, as DeepSeek-V3 / GLM checkpoints store them, against the CPU reference
(colibri._core.quant.fp8_dequantize) on lavapipe: every code under ordinary, subnormal,
zero, negative and huge scales dequantizes bit for bit (NaN codes too); y = W x within the
float32 summation bound; two runs and any split into bindings bit-identical."""

from __future__ import annotations

import numpy as np
import pytest

from colibri import errors
from colibri._core import gpu as core_gpu
from colibri._core import quant as q
from colibri.gpu import open_device
from colibri.settings.gpu import GPUConfig

ROWS, COLS = 67, 320
U = 2.0 ** -24  # float32 unit roundoff
# (block_rows, block_cols): DeepSeek's 128 x 128 (one scale row here, a partial last scale
# column), and small blocks whose scale rows change inside a chunk of a split upload
BLOCKS = ((128, 128), (5, 48))
NAN_CODES = (0x7F, 0xFF)


def scale_shape(rows: int, cols: int, block_rows: int, block_cols: int) -> tuple[int, int]:
    return -(-rows // block_rows), -(-cols // block_cols)


def sample(block_rows: int, block_cols: int, seed: int, nan: bool = True
           ) -> tuple[np.ndarray, np.ndarray]:
    """Codes [ROWS, COLS] (every byte; without the NaN codes unless `nan`) and scales of the
    size real checkpoints hold (weight_scale_inv is around 1e-4 .. 1e-2)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, size=(ROWS, COLS), dtype=np.uint8)
    if not nan:
        codes[np.isin(codes, NAN_CODES)] = 0x38  # 1.0
    shape = scale_shape(ROWS, COLS, block_rows, block_cols)
    scales = np.exp(rng.uniform(np.log(1e-4), np.log(1e-2), size=shape)).astype(np.float32)
    return codes, scales


def reference(codes: np.ndarray, scales: np.ndarray, block_rows: int, block_cols: int
              ) -> np.ndarray:
    rows, cols = codes.shape
    return q.fp8_dequantize(codes.reshape(-1), scales.reshape(-1), rows, cols, block_rows,
                            block_cols)


def upload(device: core_gpu.Device, codes: np.ndarray, scales: np.ndarray, block_rows: int,
           block_cols: int, split_bytes: int = 0) -> core_gpu.Matrix:
    rows, cols = codes.shape
    return device.upload_fp8(codes.reshape(-1), scales.reshape(-1), rows, cols, block_rows,
                             block_cols, split_bytes=split_bytes)


@pytest.mark.parametrize("blocks", BLOCKS)
def test_dequantization_is_exact(device: core_gpu.Device, blocks: tuple[int, int]) -> None:
    codes, scales = sample(*blocks, seed=0)
    got = device.dequantize(upload(device, codes, scales, *blocks))
    ref = reference(codes, scales, *blocks)
    assert got.shape == (ROWS, COLS) and np.isnan(ref).any()
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_every_code_under_edge_scales_dequantizes_exactly(device: core_gpu.Device) -> None:
    """All 256 codes (e4m3 subnormals, -0, the NaN codes) times scales whose products are
    float32 subnormals (which a GPU may flush; the kernel rounds those with integer
    operations), subnormal scales, zero, negative, and products that overflow to inf."""
    edge = np.array([1.0, -1.0, 0.0, 2.0 ** -120, 2.0 ** -126, 1.5 * 2.0 ** -133,
                     2.0 ** -149, 3e-39, -1e-40, 1.2e-38, 7.7e-36, 2.0 ** 100, 3.4e38, 1e-3],
                    dtype=np.float32)
    codes = np.tile(np.arange(256, dtype=np.uint8), (len(edge), 1))
    scales = edge.reshape(-1, 1)
    ref = reference(codes, scales, 1, 256)
    got = device.dequantize(upload(device, codes, scales, 1, 256))
    tiny = (ref != 0) & (np.abs(ref) < np.finfo(np.float32).tiny)
    assert tiny.sum() > 300 and np.isinf(ref).any()  # the cases the test is for are there
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("blocks", BLOCKS)
def test_matvec_within_the_float32_summation_bound(device: core_gpu.Device,
                                                   blocks: tuple[int, int]) -> None:
    codes, scales = sample(*blocks, seed=1, nan=False)
    x = np.random.default_rng(2).standard_normal(COLS).astype(np.float32)
    w = reference(codes, scales, *blocks).astype(np.float64)
    y = device.matvec(upload(device, codes, scales, *blocks), x)
    # the GPU sums COLS float32 products of the exactly dequantized weights in a fixed
    # order: |error| <= (cols + 2) u sum|w x|, as tests/gpu/test_matvec.py
    bound = (COLS + 2) * U * (np.abs(w) @ np.abs(x.astype(np.float64)))
    err = np.abs(y.astype(np.float64) - w @ x.astype(np.float64))
    assert np.all(err <= bound), f"worst excess {np.max(err - bound)}"
    # the CPU's FP8 matmul (column blocks summed, then scaled) is within the same bound
    cpu = q.fp8_matmul(codes.reshape(-1), scales.reshape(-1), ROWS, COLS, *blocks,
                       x.reshape(1, -1), isa="scalar")[0]
    assert np.all(np.abs(cpu.astype(np.float64) - w @ x.astype(np.float64)) <= bound)


@pytest.mark.parametrize("blocks", BLOCKS)
def test_two_runs_and_a_split_are_bit_identical(device: core_gpu.Device,
                                                blocks: tuple[int, int]) -> None:
    codes, scales = sample(*blocks, seed=3, nan=False)
    x = np.random.default_rng(4).standard_normal(COLS).astype(np.float32)
    whole = upload(device, codes, scales, *blocks)
    split = upload(device, codes, scales, *blocks, split_bytes=3 * COLS + 1)
    assert whole.chunks == 1 and split.chunks == -(-ROWS // 3)
    first = device.matvec(whole, x)
    np.testing.assert_array_equal(first.view(np.uint32), device.matvec(whole, x).view(np.uint32))
    np.testing.assert_array_equal(first.view(np.uint32), device.matvec(split, x).view(np.uint32))
    np.testing.assert_array_equal(device.dequantize(split).view(np.uint32),
                                  device.dequantize(whole).view(np.uint32))


def test_resident_bytes_count_the_scales(device: core_gpu.Device) -> None:
    codes, scales = sample(5, 48, seed=5)
    before = device.resident_bytes
    m = upload(device, codes, scales, 5, 48, split_bytes=3 * COLS + 1)
    # each chunk of 3 rows holds the one or two scale rows its rows use
    chunks = [(r0, min(r0 + 3, ROWS) - 1) for r0 in range(0, ROWS, 3)]
    scale_rows = sum(last // 5 - r0 // 5 + 1 for r0, last in chunks)
    assert device.resident_bytes - before == codes.size + scale_rows * scales.shape[1] * 4
    del m
    assert device.resident_bytes == before


def test_the_memory_budget_counts_the_scales(lavapipe: str) -> None:
    codes, scales = sample(5, 48, seed=7)
    small = open_device(GPUConfig(adapter="llvmpipe", memory_budget=codes.size + 8))
    with pytest.raises(errors.InvalidRequestError, match="would pass the GPU memory budget"):
        upload(small, codes, scales, 5, 48)
    enough = open_device(GPUConfig(adapter="llvmpipe", memory_budget=codes.size + scales.nbytes))
    m = upload(enough, codes, scales, 5, 48)
    assert m.chunks == 1 and enough.resident_bytes == codes.size + scales.nbytes


def test_bad_fp8_uploads_are_refused(device: core_gpu.Device) -> None:
    codes, scales = sample(128, 128, seed=6)
    flat = codes.reshape(-1)
    with pytest.raises(errors.InvalidRequestError, match="need their block scales"):
        device.upload("F8_E4M3", flat, ROWS, COLS)
    with pytest.raises(errors.InvalidRequestError, match=r"are 1 x 3 floats, got 2$"):
        device.upload_fp8(flat, scales.reshape(-1)[:2], ROWS, COLS, 128, 128)
    with pytest.raises(errors.InvalidRequestError, match=f"got {flat.size - 1}$"):
        device.upload_fp8(flat[:-1], scales.reshape(-1), ROWS, COLS, 128, 128)
    with pytest.raises(errors.InvalidRequestError, match="block sizes must be positive"):
        device.upload_fp8(flat, scales.reshape(-1), ROWS, COLS, 0, 128)
