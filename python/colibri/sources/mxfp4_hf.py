"""MXFP4 weights in the Hugging Face layout (gpt-oss) as GGUF MXFP4 blocks, without
requantizing.

gpt-oss checkpoints store an MXFP4 matrix ``W [..., rows, cols]`` as two uint8 tensors:
``<name>_blocks [..., rows, cols / 32, 16]`` (per 32-element block, 16 bytes of e2m1 codes,
element ``2k`` in the low nibble of byte ``k`` and ``2k + 1`` in its high nibble) and
``<name>_scales [..., rows, cols / 32]`` (the block's E8M0 exponent byte: value =
e2m1 * 2^(byte - 127)). GGUF's MXFP4 block (``csrc/quant/blocks_iq.hpp``, 17 bytes) is the
same exponent byte followed by 16 bytes whose low nibbles hold elements 0..15 and high
nibbles elements 16..31 (Q4_0's order), and it decodes ``byte`` as 2^(byte - 128) times
doubled e2m1 values: the same numbers. So the conversion is a permutation of the 4-bit
codes and a copy of the exponent bytes, exact by construction: every weight keeps its code
and its block's scale (tests/sources/test_mxfp4_hf.py checks it against a dequantization written
from the published layout and against transformers' own gpt-oss dequantization).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from ..errors import ModelFormatError
from .quant_types import BLOCK_SIZES

# Elements per MXFP4 block (32) and bytes per GGUF block (17), from the core's table.
BLOCK, GGUF_BLOCK_BYTES = BLOCK_SIZES["MXFP4"]
BLOCKS_SUFFIX, SCALES_SUFFIX = "_blocks", "_scales"


def mxfp4_pairs(names: Iterable[str]) -> dict[str, tuple[str, str]]:
    """``{base: (base_blocks, base_scales)}`` for every name pair in the HF MXFP4 layout
    (a ``_blocks`` tensor without its ``_scales`` is an error: the weight cannot be read)."""
    names = set(names)
    pairs: dict[str, tuple[str, str]] = {}
    for n in sorted(names):
        if not n.endswith(BLOCKS_SUFFIX):
            continue
        base = n[: -len(BLOCKS_SUFFIX)]
        scales = base + SCALES_SUFFIX
        if scales not in names:
            raise ModelFormatError(
                f"MXFP4 tensor {n!r} has no {scales!r} beside it (gpt-oss stores both); "
                "the checkpoint is incomplete: download it again"
            )
        pairs[base] = (n, scales)
    return pairs


def check_mxfp4_shapes(
    name: str, blocks_shape: tuple[int, ...], scales_shape: tuple[int, ...]
) -> tuple[int, ...]:
    """The weight's shape ``[..., rows, cols]`` from the two tensors' shapes, or a clear error."""
    if len(blocks_shape) < 3 or blocks_shape[-1] != BLOCK // 2:
        raise ModelFormatError(
            f"MXFP4 tensor {name!r}_blocks has shape {list(blocks_shape)}; expected "
            f"[..., rows, cols / 32, 16]"
        )
    if tuple(scales_shape) != tuple(blocks_shape[:-1]):
        raise ModelFormatError(
            f"MXFP4 tensor {name!r}: scales shape {list(scales_shape)} does not match blocks "
            f"shape {list(blocks_shape)} (expected {list(blocks_shape[:-1])})"
        )
    return (*blocks_shape[:-2], blocks_shape[-2] * BLOCK)


def relayout_mxfp4(
    blocks: npt.NDArray[np.uint8], scales: npt.NDArray[np.uint8]
) -> npt.NDArray[np.uint8]:
    """HF ``_blocks`` ``[..., n, 16]`` and ``_scales`` ``[..., n]`` as GGUF MXFP4 rows
    ``[..., n * 17]`` (uint8): per block the exponent byte, then the codes in GGUF's order."""
    check_mxfp4_shapes("<array>", tuple(blocks.shape), tuple(scales.shape))
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ModelFormatError(
            f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}"
        )
    lo, hi = blocks & 0x0F, blocks >> 4
    codes = np.empty((*blocks.shape[:-1], BLOCK), np.uint8)
    codes[..., 0::2], codes[..., 1::2] = lo, hi  # element j of the block
    out = np.empty((*blocks.shape[:-1], GGUF_BLOCK_BYTES), np.uint8)
    out[..., 0] = scales
    out[..., 1:] = codes[..., :16] | (codes[..., 16:] << 4)
    return out.reshape(*blocks.shape[:-2], blocks.shape[-2] * GGUF_BLOCK_BYTES)
