"""Checks shared by every model source: families, tensor sets, shapes and byte extents.

A source maps its own names and metadata to canonical ones; this module then checks the
result against the normalized config, so every source reports the same problems the same
way: the first missing tensor, a shape that disagrees with the config, an extent outside
its file or overlapping another one.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ..errors import ModelFormatError, UnsupportedArchitectureError, UnsupportedError
from .manifest import Extent, ModelConfig, TensorInfo

# Families the forward pass implements, by canonical name (ModelConfig.arch).
SUPPORTED_FAMILIES = ("llama", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe")

# Element types the core can read today.
SUPPORTED_DTYPES = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1",
    "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
)  # fmt: skip

# (elements per block, bytes per block) by GGML type name.
BLOCK_SIZES: Mapping[str, tuple[int, int]] = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q8_0": (32, 34),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}


def unsupported_architecture(
    found: str, where: Path, supported: Sequence[str]
) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"{where}: architecture {found!r} is not supported. Supported architectures: "
        f"{', '.join(supported)}."
    )


def tensor_nbytes(dtype: str, shape: Sequence[int], name: str = "") -> int:
    """Bytes a tensor of this type and shape occupies (rows of blocks for quantized types)."""
    if dtype not in BLOCK_SIZES:
        raise UnsupportedError(f"tensor {name!r}: element type {dtype} is not supported")
    block, size = BLOCK_SIZES[dtype]
    n = 1
    for d in shape:
        n *= int(d)
    cols = int(shape[-1]) if shape else 1
    if cols % block:
        raise ModelFormatError(
            f"tensor {name!r}: row length {cols} is not a multiple of the {dtype} "
            f"block size {block}"
        )
    return n // block * size


def check_dtype(name: str, dtype: str, where: Path) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise UnsupportedError(
            f"{where}: tensor {name!r} has element type {dtype}, which colibri cannot read yet "
            f"(supported: {', '.join(SUPPORTED_DTYPES)}). Use a GGUF quantized to one of those, "
            f"or the original Hugging Face checkpoint."
        )


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config implies, in canonical order, with its PyTorch-order shape."""
    h, hd = cfg.hidden_size, cfg.head_dim
    q_rows, kv_rows = cfg.n_heads * hd, cfg.n_kv_heads * hd
    out: dict[str, tuple[int, ...]] = {"token_embd": (cfg.vocab_size, h)}
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        out[b + "attn_norm"] = (h,)
        out[b + "attn_q"] = (q_rows, h)
        out[b + "attn_k"] = (kv_rows, h)
        out[b + "attn_v"] = (kv_rows, h)
        if cfg.attention_bias:
            out[b + "attn_q.bias"] = (q_rows,)
            out[b + "attn_k.bias"] = (kv_rows,)
            out[b + "attn_v.bias"] = (kv_rows,)
        out[b + "attn_output"] = (h, q_rows)
        if cfg.qk_norm == "head":
            out[b + "attn_q_norm"] = (hd,)
            out[b + "attn_k_norm"] = (hd,)
        elif cfg.qk_norm == "full":
            out[b + "attn_q_norm"] = (q_rows,)
            out[b + "attn_k_norm"] = (kv_rows,)
        out[b + "ffn_norm"] = (h,)
        moe = bool(cfg.moe_layers) and cfg.moe_layers[i]
        if not moe:
            f = cfg.intermediate_size
            out[b + "ffn_gate"] = (f, h)
            out[b + "ffn_up"] = (f, h)
            out[b + "ffn_down"] = (h, f)
            continue
        f = cfg.moe_intermediate_size
        out[b + "ffn_gate_inp"] = (cfg.n_experts, h)
        for e in range(cfg.n_experts):
            out[f"{b}ffn_gate_exps.{e}"] = (f, h)
            out[f"{b}ffn_up_exps.{e}"] = (f, h)
            out[f"{b}ffn_down_exps.{e}"] = (h, f)
        s = cfg.shared_expert_intermediate_size
        if s:
            out[b + "ffn_gate_inp_shexp"] = (1, h)
            out[b + "ffn_gate_shexp"] = (s, h)
            out[b + "ffn_up_shexp"] = (s, h)
            out[b + "ffn_down_shexp"] = (h, s)
    out["output_norm"] = (h,)
    if not cfg.tie_word_embeddings:
        out["output"] = (cfg.vocab_size, h)
    return out


# Tensors a source may carry beyond what the config implies (kept in the manifest).
OPTIONAL_SHAPES = {"rope_freqs"}


def order_and_check(
    tensors: Mapping[str, TensorInfo], cfg: ModelConfig, where: Path
) -> dict[str, TensorInfo]:
    """Check the tensor set against the config and return it in canonical order.

    Raises ModelFormatError naming the first missing tensor, a shape mismatch, or a tensor
    the config does not account for.
    """
    want = expected_shapes(cfg)
    out: dict[str, TensorInfo] = {}
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            raise ModelFormatError(
                f"{where}: tensor {name!r} is missing ({len(tensors)} tensors found, "
                f"{len(want)} expected for this {cfg.arch} config). The checkpoint is incomplete "
                f"or its config does not match its weights."
            )
        if tuple(t.shape) != shape:
            raise ModelFormatError(
                f"{where}: tensor {name!r} has shape {tuple(t.shape)}, but the config implies "
                f"{shape}. The config does not match the weights."
            )
        out[name] = t
    for name, t in tensors.items():
        if name in out:
            continue
        if name in OPTIONAL_SHAPES:
            out[name] = t
            continue
        raise ModelFormatError(
            f"{where}: tensor {name!r} is not used by a {cfg.arch} model with this config "
            f"(for example a dense FFN in a layer the config makes MoE). The config does not "
            f"match the weights."
        )
    return out


def file_sizes(files: Sequence[Path]) -> list[int]:
    return [os.stat(f).st_size for f in files]


def check_extents(
    tensors: Mapping[str, TensorInfo], files: Sequence[Path], sizes: Sequence[int] | None = None
) -> None:
    """Every extent lies inside its file, has the tensor's byte size, and none overlap."""
    sizes = list(sizes) if sizes is not None else file_sizes(files)
    per_file: list[list[tuple[int, int, str]]] = [[] for _ in files]
    for t in tensors.values():
        want = tensor_nbytes(t.dtype, t.shape, t.name)
        if t.nbytes != want:
            raise ModelFormatError(
                f"tensor {t.name!r}: its extents hold {t.nbytes} bytes, but a {t.dtype} tensor "
                f"of shape {tuple(t.shape)} needs {want}. The file is corrupt."
            )
        for e in t.extents:
            if not 0 <= e.file < len(files):
                raise ModelFormatError(
                    f"tensor {t.name!r}: extent names file #{e.file}, which does not exist"
                )
            end = e.offset + e.length
            if e.offset < 0 or e.length < 0 or end > sizes[e.file]:
                raise ModelFormatError(
                    f"{files[e.file]}: tensor {t.name!r} needs bytes [{e.offset}, {end}), but "
                    f"the file is only {sizes[e.file]} bytes long (expected at least {end}). "
                    f"The file is truncated or corrupt; download or convert it again."
                )
            per_file[e.file].append((e.offset, end, t.name))
    for fi, spans in enumerate(per_file):
        spans.sort()
        for (a0, a1, an), (b0, _b1, bn) in itertools.pairwise(spans):
            if b0 < a1 and a0 != a1:
                raise ModelFormatError(
                    f"{files[fi]}: tensors {an!r} and {bn!r} overlap (bytes {b0}..{a1}). "
                    f"The file's header is corrupt."
                )


def split_rows(extent: Extent, n: int, nbytes_each: int) -> Iterator[Extent]:
    """Cut a contiguous extent holding n equal parts into one extent per part."""
    for i in range(n):
        yield Extent(extent.file, extent.offset + i * nbytes_each, nbytes_each)
