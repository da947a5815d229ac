"""FP8 (e4m3) block-scaled weights, as DeepSeek-V3, GLM-4.5 and Qwen3 "-FP8" checkpoints
store them (``docs/format.md``, "FP8 checkpoints").

A weight ``W [rows, cols]`` is stored as one ``F8_E4M3`` byte per element plus a companion
``<name>_scale_inv`` tensor ``S [ceil(rows / b0), ceil(cols / b1)]`` (F32), where
``(b0, b1)`` is ``quantization_config.weight_block_size`` in ``config.json``::

    W[i, j] = e4m3(byte[i, j]) * S[i // b0, j // b1]        (computed in float32)

which is what DeepSeek's reference ``weight_dequant`` computes before casting. The e4m3
format (``torch.float8_e4m3fn``, OCP FP8): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa
bits, no infinities, ``S.1111.111`` is NaN, exponent 0 is subnormal (``m / 8 * 2**-6``).
Decoding is a 256-entry table lookup; every code is exact in float32.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def _e4m3_table() -> npt.NDArray[np.float32]:
    codes = np.arange(256, dtype=np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 0x7).astype(np.float64)
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7.0)
    subnormal = man / 8.0 * 2.0**-6
    value = sign * np.where(exp == 0, subnormal, normal)
    value[(codes & 0x7F) == 0x7F] = np.nan
    return value.astype(np.float32)


E4M3_TABLE: npt.NDArray[np.float32] = _e4m3_table()
E4M3_TABLE.flags.writeable = False


def decode_e4m3(codes: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """The float32 value of every e4m3 byte (same shape)."""
    return E4M3_TABLE[codes]


def dequantize_block_fp8(
    codes: npt.NDArray[np.uint8],
    scale_inv: npt.NDArray[np.float32],
    block: tuple[int, int],
) -> npt.NDArray[np.float32]:
    """``codes [r, cols]`` (a run of whole row blocks, or the last partial one) times their
    scales ``scale_inv [ceil(r / b0), ceil(cols / b1)]``, in float32."""
    rows, cols = codes.shape
    b0, b1 = block
    s = np.repeat(np.repeat(scale_inv.astype(np.float32, copy=False), b0, axis=0), b1, axis=1)
    out = decode_e4m3(codes)
    out *= s[:rows, :cols]
    return out
