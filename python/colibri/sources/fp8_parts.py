"""Block scales for a tensor cut from row ranges of a larger FP8 weight: MLA's ``kv_b_proj``
split into ``attn_k_b`` (each head's ``nope`` rows, transposed at load) and ``attn_v_b``
(each head's ``v`` rows), see :func:`.units.split_kv_b`.

The parts keep their FP8 codes; only the scale matrix changes shape. A head's rows start
at source row ``o_h = h * (nope + v)``, which need not be a multiple of the source block
``b0``, so the source's ``b0 x b1`` blocks do not tile the part. Both parts therefore get
one scale row per row of the part, which is exact (every element keeps the scale the source
gives it, ``S[src_row // b0, src_col // b1]``):

* ``attn_v_b`` ``[heads * v, kv_lora]``: block ``(1, b1)``; row ``k`` of a head's extent
  has scale row ``S[(o_h + k) // b0, :]``.
* ``attn_k_b`` ``[heads * kv_lora, nope]`` (each head's ``[nope, kv_lora]`` block transposed):
  row ``h * kv_lora + c`` holds source column ``c`` of rows ``o_h .. o_h + nope``. Its
  columns (source rows) change scale where ``o_h + j`` crosses a multiple of ``b0``; with
  ``g = gcd(b0, o_h mod b0 for every head)`` those crossings fall on multiples of ``g``, so
  block ``(1, g)`` is exact: column block ``j`` has scale ``S[(o_h + j g) // b0, c // b1]``.
  DeepSeek-V3 (``nope = v = 128``, ``b0 = 128``): ``g = 128``, one scale per row.

The scale matrix of the source is small (DeepSeek-V3: 256 x 4 floats per layer) and read
here; the parts' matrices (DeepSeek-V3: 1/32 of the codes' bytes) go to the core as
values (``TensorSpec.scale_values``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..errors import ModelFormatError, UnsupportedError
from .hf_source import Fp8TensorInfo
from .manifest import TensorInfo


def _read_scales(t: TensorInfo, files: Sequence[Path]) -> npt.NDArray[np.float32]:
    chunks = []
    for e in t.extents:
        with open(files[e.file], "rb") as f:
            f.seek(e.offset)
            chunks.append(f.read(e.length))
    raw = b"".join(chunks)
    rows, cols = t.shape
    if len(raw) != rows * cols * 4:
        raise ModelFormatError(f"FP8 scale {t.name!r}: {len(raw)} bytes for {rows}x{cols} F32")
    s = np.frombuffer(raw, dtype="<f4").reshape(rows, cols).astype(np.float32)
    if not np.all(np.isfinite(s)):
        raise ModelFormatError(f"FP8 scale {t.name!r} holds non-finite values; the file is corrupt")
    return s


def part_scales(
    t: Fp8TensorInfo, files: Sequence[Path]
) -> tuple[npt.NDArray[np.float32], tuple[int, int]]:
    """(scale matrix, block shape) of ``t``, a part of an FP8 weight (``t.row_origin``:
    the first source row of each extent), in the layout the core holds it in (transposed
    per head when ``t.transpose_heads``)."""
    name, shape, scale, transpose_heads = t.name, t.shape, t.scale, t.transpose_heads
    row_origin = t.row_origin
    src_cols = shape[0] // transpose_heads if transpose_heads else shape[1]  # kv_lora
    extents_rows = [e.length // max(src_cols, 1) for e in t.extents]  # one byte per element
    if scale.dtype != "F32":
        raise UnsupportedError(
            f"FP8 weight {name!r} has {scale.dtype} block scales; colibri runs F32 scales "
            f"directly (the DeepSeek-V3 layout). Convert it: colibri convert --quant q8_0."
        )
    b0, b1 = t.block
    src = _read_scales(scale, files)
    if not transpose_heads:
        rows = [src[(o + np.arange(n)) // b0]
                for o, n in zip(row_origin, extents_rows, strict=True)]
        out = np.concatenate(rows, axis=0)
        if out.shape[0] != shape[0]:
            raise ModelFormatError(f"FP8 weight {name!r}: its extents hold {out.shape[0]} rows")
        return np.ascontiguousarray(out, dtype=np.float32), (1, b1)
    rows_out, nope = shape  # [heads * kv_lora, nope]; each head's source block is [nope, kv_lora]
    if len(row_origin) != transpose_heads or any(n != nope for n in extents_rows):
        raise ModelFormatError(f"FP8 weight {name!r}: expected {transpose_heads} head blocks")
    kv_lora = rows_out // transpose_heads
    g = b0
    for o in row_origin:
        g = math.gcd(g, o % b0)
    j = np.arange(-(-nope // g)) * g  # first column of each column block
    col_blocks = np.arange(kv_lora) // b1
    heads = [src[(o + j) // b0][:, col_blocks].T for o in row_origin]  # [kv_lora, n_blocks]
    return np.ascontiguousarray(np.concatenate(heads, axis=0), dtype=np.float32), (1, g)
