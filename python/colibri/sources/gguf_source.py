"""GGUF files (llama.cpp's format) -> Manifest, without loading tensor data.

The header is read by :mod:`.gguf_header` (``gguf.GGUFReader`` takes seconds on a large
vocabulary); tensor bytes stay on disk and are described by extents (absolute file
offsets). ``general.architecture`` names the family (``Family.gguf_architectures``,
families/), which reads its own keys and names its tensors following llama.cpp's
converter (``convert_hf_to_gguf.py``) and model loader, so a GGUF computes what llama.cpp
computes. What every architecture shares is read here:

* Stacked expert tensors ``blk.N.ffn_{gate,up,down}_exps.weight`` (GGML ne = [cols, rows,
  n_expert]) become one TensorInfo per expert, ``blk.N.ffn_gate_exps.E``, each with its own
  slice of the stack.
* The keys every architecture has (``embedding_length``, ``block_count``,
  ``attention.head_count`` / ``head_count_kv`` (per layer with 0 for the layers without
  attention, as hybrids write it: its one non-zero count), ``attention.layer_norm_rms_epsilon``,
  ``rope.freq_base``, ``rope.scaling.*``, ``context_length``, the tokenizer's bos / eos /
  eot ids), with block_count checked against the tensors present before anything loops
  over it.
* Where the family's converter permutes the rows of Q and K (and their biases) for
  llama.cpp's interleaved ("NORM") RoPE (``Family.gguf_permuted``: ``llama``), those
  tensors carry ``rope_unpermute_heads`` (n_head for Q, n_head_kv for K).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError, UnsupportedError
from .families import Family, GGUFInput, gguf_family
from .fields import GGUFFields, as_int, as_str, f32_decimal
from .gguf_header import GGUFHeader, GGUFHeaderError, read_gguf_header
from .manifest import Extent, Manifest, TensorInfo
from .paths import shown
from .quant_types import check_dtype
from .validate import (
    check_extents,
    check_layer_count,
    check_packed,
    layers_present,
    order_and_check,
    split_rows,
)

_EXPS = re.compile(r"^(blk\.\d+\.ffn_(?:gate|up|down)_exps)\.weight$")
_Q = ("attn_q", "attn_q.bias")
_K = ("attn_k", "attn_k.bias")


def _open(path: Path, size: int) -> GGUFHeader:
    """The parsed header; ModelFormatError when it is corrupt or the file is truncated."""
    try:
        header = read_gguf_header(path)
    except GGUFHeaderError as exc:
        raise ModelFormatError(
            f"{path}: not a readable GGUF file ({size} bytes; header error: {exc.detail}). "
            f"Check that the file is a complete GGUF model."
        ) from exc
    expected = header.data_end()
    if expected > size:
        raise ModelFormatError(
            f"{path}: GGUF file is truncated: its header describes tensors up to byte "
            f"{expected}, but the file is {size} bytes. Download or convert it again."
        )
    return header


def _rope_scaling(md: Mapping[str, Any], arch: str, where: Path) -> dict[str, Any] | None:
    kind = md.get(f"{arch}.rope.scaling.type")
    factor = md.get(f"{arch}.rope.scaling.factor")
    if kind is None and md.get(f"{arch}.rope.scale_linear") is not None:
        kind, factor = "linear", md[f"{arch}.rope.scale_linear"]
    if kind is None or kind == "none":
        return None
    out: dict[str, Any] = {"rope_type": as_str(kind, f"{arch}.rope.scaling.type", where)}
    if factor is not None:
        out["factor"] = f32_decimal(factor, f"{arch}.rope.scaling.factor", where)
    extra = {
        "rope.scaling.original_context_length": "original_max_position_embeddings",
        "rope.scaling.attn_factor": "attention_factor",
        "rope.scaling.yarn_beta_fast": "beta_fast",
        "rope.scaling.yarn_beta_slow": "beta_slow",
        "rope.scaling.yarn_log_multiplier": "mscale_all_dim",
    }
    for k, hf in extra.items():
        if (v := md.get(f"{arch}.{k}")) is not None:
            out[hf] = v  # typed and range-checked with the config (check_rope_scaling)
    return out


def _check_layers(meta: GGUFFields, fam: Family, arch: str, header: GGUFHeader) -> int:
    """block_count against the layers present, before anything loops over it; returns it.
    A family with MTP layers may declare them without carrying them ("trunk-only"
    files), so block_count may then exceed the layers present by that many."""
    blocks = meta.int(f"{arch}.block_count")
    declared = meta.int(f"{arch}.{fam.gguf_mtp_key}", 0, lo=0) if fam.gguf_mtp_key else 0
    present = layers_present(t.name for t in header.tensors)
    if present != set(range(len(present))) or blocks not in (len(present), len(present) + declared):
        check_layer_count(blocks, (t.name for t in header.tensors),
                          f"GGUF metadata {arch}.block_count", meta.where)  # fmt: skip
    return blocks


SideTensors = dict[str, tuple[str, tuple[int, ...], Extent]]


def _tensors(
    header: GGUFHeader, p: Path, fam: Family, arch: str, n_expert: int, side: SideTensors
) -> dict[str, TensorInfo]:
    """The file's tensors by canonical name (the family's), stacked experts split one per
    expert; those the family reads into a side file (Family.gguf_side_names) go to
    ``side`` instead."""
    tensors: dict[str, TensorInfo] = {}
    for t in header.tensors:
        ext = Extent(0, header.data_offset(t), t.n_bytes)
        if fam.gguf_side_names is not None and fam.gguf_side_names.fullmatch(t.name):
            side[t.name] = (t.type_name, t.shape, ext)
            continue
        check_dtype(t.name, t.type_name, p)
        m = _EXPS.match(t.name)
        if m:
            if len(t.shape) != 3:
                raise ModelFormatError(f"{p}: stacked expert tensor {t.name!r} has shape {t.shape}")
            n_e, rows, cols = t.shape
            if n_e != n_expert:
                raise ModelFormatError(
                    f"{p}: stacked expert tensor {t.name!r} holds {n_e} experts, but "
                    f"{arch}.expert_count is {n_expert}"
                )
            each = ext.length // n_e
            if each * n_e != ext.length:
                raise ModelFormatError(f"{p}: tensor {t.name!r} does not split into {n_e} experts")
            for e, sub in enumerate(split_rows(ext, n_e, each)):
                nm = f"{m.group(1)}.{e}"
                tensors[nm] = TensorInfo(nm, t.type_name, (rows, cols), (sub,))
            continue
        cname, shape = fam.gguf_name(arch, t.name, t.shape)
        tensors[cname] = TensorInfo(cname, t.type_name, shape, (ext,))
    return tensors


def _base(meta: GGUFFields, arch: str, tensors: dict[str, TensorInfo], blocks: int,
          kv_by_layer: bool) -> dict[str, Any]:  # fmt: skip
    """The ModelConfig fields every architecture reads the same way (GGUFInput.base)."""
    a, md = arch, meta.md
    n_heads = meta.int(f"{a}.attention.head_count")
    eos: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        v = meta.optional_int(key)
        if v is not None and v not in eos:
            eos.append(v)
    return dict(
        vocab_size=tensors["token_embd"].shape[0],
        hidden_size=meta.int(f"{a}.embedding_length"),
        n_layers=blocks,
        n_heads=n_heads,
        n_kv_heads=_kv_heads(meta, a, n_heads, kv_by_layer),
        rms_norm_eps=meta.f32(f"{a}.attention.layer_norm_rms_epsilon"),
        rope_theta=meta.f32(f"{a}.rope.freq_base", 10000.0),
        max_position_embeddings=meta.int(f"{a}.context_length", lo=0),
        tie_word_embeddings="output" not in tensors,
        rope_scaling=_rope_scaling(md, a, meta.where),
        bos_token_id=meta.optional_int("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(eos),
    )


def _kv_heads(meta: GGUFFields, a: str, n_heads: int, by_layer: bool) -> int:
    """attention.head_count_kv; a per-layer list whose layers without attention say 0
    (llama.cpp's hybrids: Kimi-Linear's KDA layers) is its one non-zero count; for a
    family that reads the list itself (``by_layer``: MiMo-V2-Flash's full and sliding
    layers differ), layer 0's."""
    key = f"{a}.attention.head_count_kv"
    raw = meta.md.get(key)
    if by_layer and isinstance(raw, list) and raw:
        return as_int(raw[0], f"GGUF metadata {key}[0]", meta.where, lo=1)
    if isinstance(raw, list) and 0 in raw:
        counts = {v for v in raw if v != 0}
        if len(counts) == 1:
            return as_int(counts.pop(), f"GGUF metadata {key}", meta.where, lo=1)
    return meta.int(key, n_heads)


def _unpermuted(tensors: dict[str, TensorInfo], n_heads: int, n_kv: int
                ) -> dict[str, TensorInfo]:  # fmt: skip
    """Q/K rows (and biases) in llama.cpp's interleaved-RoPE order, marked for the loader
    to restore (rope_unpermute_heads: n_head for Q, n_head_kv for K)."""
    out: dict[str, TensorInfo] = {}
    for name, t in tensors.items():
        heads = n_heads if name.endswith(_Q) else n_kv if name.endswith(_K) else 0
        out[name] = dataclasses.replace(t, rope_unpermute_heads=heads) if heads else t
    return out


def load_gguf(path: str | os.PathLike[str]) -> Manifest:
    """Read a GGUF file's header and return its manifest (no tensor data is loaded)."""
    p = Path(path)
    size = os.stat(p).st_size
    header = _open(p, size)
    md = header.metadata
    meta = GGUFFields(md, p)
    if (meta.optional_int("split.count") or 1) > 1:
        raise UnsupportedError(
            f"{p}: split GGUF files are not supported; merge the parts with "
            f"`llama-gguf-split --merge` and load the merged file."
        )
    arch = md.get("general.architecture", "")
    fam = gguf_family(arch, p)
    n_expert = meta.int(f"{arch}.expert_count", 0, lo=0)
    # Writers put tensors back to back, padded to the alignment: a gap is a shrunk tensor.
    check_packed(
        ((header.data_offset(t), header.data_offset(t) + t.n_bytes, t.name)
         for t in header.tensors),
        header.data_start, size, header.alignment, p,
    )  # fmt: skip
    for t in header.tensors:
        if any(d == 0 for d in t.dims):
            raise ModelFormatError(f"{p}: tensor {shown(t.name)} has a zero dimension {t.shape}")
    blocks = _check_layers(meta, fam, arch, header)
    side: SideTensors = {}
    tensors = _tensors(header, p, fam, arch, n_expert, side)
    if "token_embd" not in tensors or len(tensors["token_embd"].shape) != 2:
        raise ModelFormatError(f"{p}: tensor 'token_embd' is missing or not a matrix")
    base = _base(meta, arch, tensors, blocks, fam.gguf_kv_heads_by_layer)
    cfg = fam.gguf_config(GGUFInput(arch, meta, tensors, p, base))
    if fam.gguf_tensors is not None:
        tensors = fam.gguf_tensors(tensors, cfg, p)
    if arch in fam.gguf_permuted:
        tensors = _unpermuted(tensors, cfg.n_heads, cfg.n_kv_heads)
    files: tuple[Path, ...] = (p.resolve(),)
    sizes: tuple[int, ...] = (size,)
    if side and fam.gguf_side is not None:  # e.g. DeepSeek-V4's hash tables, as F32
        side_tensors, side_file = fam.gguf_side(p, side, cfg)
        tensors.update(side_tensors)
        if side_file is not None:
            files, sizes = (*files, side_file), (*sizes, os.stat(side_file).st_size)
    ordered = order_and_check(tensors, cfg, p)
    check_extents(ordered, files, sizes)
    return Manifest(source="gguf", path=p, files=files, config=cfg, tensors=ordered,
                    metadata=md)  # fmt: skip
