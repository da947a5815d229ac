"""``colibri convert --quant``: each tensor's output type, and its bytes converted row
chunk by row chunk (``docs/format.md``, "Quantization").

Which tensors a ``--quant`` type applies to follows llama.cpp's ``convert_hf_to_gguf.py``
(and ``tests/modelfactory.write_gguf``): every 2-D weight (attention projections, dense
FFN, routed and shared experts, ``token_embd`` and ``output``) takes the requested type;
norms, biases, ``rope_freqs``, the router ``ffn_gate_inp`` and the shared-expert gate
``ffn_gate_inp_shexp`` are written F32. A matrix whose rows are not a whole number of the
type's blocks falls back to F16, as llama.cpp's converter does; for the 256-element
K-quants first to a 32-element type (Q4_K -> Q5_0, Q6_K -> Q8_0, ...), and for the
i-quants (``iq4_xs``; ``iq3_s``, ``iq3_xxs``, ``iq2_s``, ``iq2_xs``, ``iq2_xxs``, ``iq1_m``,
``iq1_s``: colibri's own quantizers, no importance matrix) first to IQ4_NL, as llama.cpp's
quantizer does. ``q4_k_m`` / ``q5_k_m`` are llama.cpp's mixes (:mod:`.kquant_mix`).
``keep`` copies every matrix's bytes unchanged, except FP8 weights (which the core cannot
read): those become BF16, as DeepSeek's own ``fp8_cast_bf16.py`` does; vectors (norms,
biases) in F16 or BF16 are widened to F32 (exactly), the only type the core reads them in.

Converting means decoding to float32 and encoding again: F32/F16/BF16 and GGUF block types
are decoded by the core (``colibri._core.quant.dequantize``, scalar kernels so the result
does not depend on the CPU), FP8 by :mod:`.fp8`; encoding uses the core's reference
quantizer (``colibri._core.quant.quantize``, byte-identical to ``gguf.quants.quantize``).
So requantizing an already-quantized tensor (Q8_0 -> Q4_0) is dequantize -> quantize, with
both rounding errors. At most :data:`CHUNK_ELEMENTS` values are in flight, whatever the
tensor's size: quantization is by rows, so a chunk is a run of whole rows (of whole FP8
row blocks for FP8 weights).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt

from ..errors import ConfigError, ModelFormatError, UnsupportedError
from ..sources.hf_source import Fp8TensorInfo
from ..sources.manifest import ModelConfig, TensorInfo

# The --quant choices are the container format's "quant" values (re-exported: the CLI).
from ..sources.native_format import QUANT_CHOICES as QUANT_CHOICES
from ..sources.quant_types import BLOCK_SIZES, WEIGHT_TYPES, tensor_nbytes
from ..sources.safetensors_files import FP8_DTYPE
from .fp8 import decode_e4m3, dequantize_block_fp8
from .kquant_mix import K_FALLBACK, MIX_BASE, mix_dtype

CHUNK_ELEMENTS = 1 << 22  # values converted at a time: 16 MiB as float32
FALLBACK = "F16"  # a matrix whose row length is not a multiple of the block size
# Super-block types fall back to a 32-element type first, as llama.cpp's quantizer does
# (IQ4_XS -> IQ4_NL for rows that are not a multiple of 256), then to FALLBACK.
IQ_TYPES = ("IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_M", "IQ1_S")
SUPER_BLOCK_FALLBACK = dict.fromkeys(IQ_TYPES, "IQ4_NL")
KEEP_FP8_AS = "BF16"

# (tensor, byte offset inside the tensor, length) -> those bytes of the source
Reader = Callable[[TensorInfo, int, int], bytes | bytearray]


def check_quant(quant: str) -> str:
    if quant not in QUANT_CHOICES:
        raise ConfigError(
            f"unknown quantization {quant!r}; choose one of {', '.join(QUANT_CHOICES)}"
        )
    return quant


# DeepSeek-V4's 2-D tensors the core reads as F32 only: the hyper-connections' projections,
# the hash layers' expert-id tables and the compressors' position biases (sources/v4_units.py).
_F32_MATRICES = ("hc_fn", "hc_attn_fn", "hc_ffn_fn", "ffn_hash_eid", "compressor_ape")


def is_matrix(t: TensorInfo) -> bool:
    """Whether ``--quant`` applies to ``t``: a 2-D weight that is not a norm, the router,
    the shared-expert gate or one of DeepSeek-V4's F32 matrices."""
    return (len(t.shape) == 2 and not t.name.endswith(("_norm", *_F32_MATRICES))
            and "ffn_gate_inp" not in t.name)  # fmt: skip


def target_dtype(t: TensorInfo, quant: str, config: ModelConfig | None = None) -> str:
    """The type ``t`` is written in for ``--quant quant`` (``config``: the model's, for the
    layer-dependent rules of the q4_k_m / q5_k_m mixes)."""
    if quant == "keep":
        if t.dtype == FP8_DTYPE:
            return KEEP_FP8_AS
        if len(t.shape) < 2:
            return "F32"  # the core reads norms and biases as F32 only: widen (exact)
        if t.dtype not in WEIGHT_TYPES:
            raise UnsupportedError(f"tensor {t.name!r}: element type {t.dtype} cannot be kept")
        return t.dtype
    if not is_matrix(t):
        return "F32"
    check_quant(quant)
    want = mix_dtype(t.name, quant, config) if quant in MIX_BASE else quant.upper()
    cols = t.shape[-1]
    if cols % BLOCK_SIZES[want][0] == 0:
        return want
    # A super-block type falls back to a 32-element type first, as llama.cpp's quantizer.
    fallback = K_FALLBACK.get(want) or SUPER_BLOCK_FALLBACK.get(want)
    if fallback is not None and cols % BLOCK_SIZES[fallback][0] == 0:
        return fallback
    return FALLBACK


def _rows_cols(shape: tuple[int, ...]) -> tuple[int, int]:
    cols = int(shape[-1]) if shape else 1
    rows = 1
    for d in shape[:-1]:
        rows *= int(d)
    return rows, cols


def decode(dtype: str, raw: npt.NDArray[np.uint8], rows: int, cols: int) -> npt.NDArray[np.float32]:
    """``rows`` rows of ``dtype`` bytes as float32 ``[rows, cols]``."""
    if dtype == "F32":
        return raw.view("<f4").reshape(rows, cols)
    from .._core import quant

    return quant.dequantize(dtype, raw, rows, cols, isa="scalar")


def encode(dtype: str, x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """float32 ``[rows, cols]`` as ``dtype`` bytes (GGUF's block layout)."""
    if dtype == "F32":
        return np.ascontiguousarray(x, dtype="<f4").view(np.uint8)
    from .._core import quant

    return quant.quantize(dtype, x)


def _per_extent_chunks(t: TensorInfo, dtype: str, read: Reader) -> Iterator[npt.NDArray[np.uint8]]:
    """MLA's kv_b_proj parts: one extent per head, each a run of the source weight's rows,
    decoded (FP8 with the scales of the source rows), transposed when the loader would
    (``transpose_heads``) and encoded: the tensor in its final layout."""
    heads = len(t.extents)
    if t.transpose_heads:
        rows_h, cols = t.shape[1], t.shape[0] // heads  # stored [cols, rows / heads] blocks
    else:
        rows_h, cols = t.shape[0] // heads, t.shape[1]
    scale: npt.NDArray[np.float32] | None = None
    if isinstance(t, Fp8TensorInfo):
        s = t.scale
        srows, scols = _rows_cols(s.shape)
        scale = decode(s.dtype, np.frombuffer(read(s, 0, s.nbytes), dtype=np.uint8), srows, scols)
    row_bytes = cols if scale is not None else tensor_nbytes(t.dtype, (1, cols), t.name)
    at = 0
    for h, e in enumerate(t.extents):
        raw = np.frombuffer(read(t, at, e.length), dtype=np.uint8)
        at += e.length
        if len(raw) != rows_h * row_bytes:
            raise ModelFormatError(f"tensor {t.name!r}: extent {h} is not {rows_h} rows")
        if isinstance(t, Fp8TensorInfo) and scale is not None:
            r0 = t.row_origin[h] if t.row_origin else h * rows_h
            b0, b1 = t.block
            srow = scale[(r0 + np.arange(rows_h)) // b0]  # [rows_h, scale cols]
            x = decode_e4m3(raw.reshape(rows_h, cols))
            x *= np.repeat(srow, b1, axis=1)[:, :cols]
        else:
            x = decode(t.dtype, raw, rows_h, cols)
        yield encode(dtype, np.ascontiguousarray(x.T) if t.transpose_heads else x)


def converted_chunks(t: TensorInfo, dtype: str, read: Reader) -> Iterator[npt.NDArray[np.uint8]]:
    """The bytes of ``t`` converted to ``dtype``, a run of whole rows at a time."""
    if t.transpose_heads or (isinstance(t, Fp8TensorInfo) and t.row_origin):
        yield from _per_extent_chunks(t, dtype, read)
        return
    rows, cols = _rows_cols(t.shape)
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    scale: npt.NDArray[np.float32] | None = None
    if isinstance(t, Fp8TensorInfo):
        b0 = t.block[0]
        step = max(b0, step // b0 * b0)
        s = t.scale
        srows, scols = _rows_cols(s.shape)
        sraw = np.frombuffer(read(s, 0, s.nbytes), dtype=np.uint8)
        scale = decode(s.dtype, sraw, srows, scols)
        row_bytes = cols
    else:
        row_bytes = tensor_nbytes(t.dtype, (1, cols), t.name)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        raw = np.frombuffer(read(t, r0 * row_bytes, n * row_bytes), dtype=np.uint8)
        if isinstance(t, Fp8TensorInfo) and scale is not None:
            b0 = t.block[0]
            x = dequantize_block_fp8(
                raw.reshape(n, cols), scale[r0 // b0 : -(-(r0 + n) // b0)], t.block
            )
        else:
            x = decode(t.dtype, raw, n, cols)
        yield encode(dtype, x)
