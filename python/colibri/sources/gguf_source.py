"""GGUF files (llama.cpp's format) -> Manifest, without loading tensor data.

The header is read by :mod:`.gguf_header` (``gguf.GGUFReader`` takes seconds on a large
vocabulary); tensor bytes stay on disk and are described by extents (absolute file
offsets). Conventions follow llama.cpp's converter (``convert_hf_to_gguf.py``) and model
loader:

* ``general.architecture`` ``llama`` is a dense Llama, or Mixtral when ``llama.expert_count``
  is > 0; ``qwen2moe``, ``qwen3moe`` and ``olmoe`` map to their families.
* Stacked expert tensors ``blk.N.ffn_{gate,up,down}_exps.weight`` (GGML ne = [cols, rows,
  n_expert]) become one TensorInfo per expert, ``blk.N.ffn_gate_exps.E``, each with its own
  slice of the stack.
* The ``llama`` converter permutes the rows of Q and K (and their biases) for llama.cpp's
  interleaved ("NORM") RoPE; those tensors carry ``rope_unpermute_heads`` (n_head for Q,
  n_head_kv for K). qwen2moe, qwen3moe and olmoe use NEOX RoPE and are stored unpermuted.
* Whether the top-k router weights are renormalized is hard-coded per architecture in
  llama.cpp's graphs (llama/Mixtral and qwen3moe: yes; qwen2moe and olmoe: no); the same
  values are used here so a GGUF computes what llama.cpp computes.
* Expert and shared-expert widths are taken from the tensors themselves: llama.cpp's
  olmoe and Mixtral files keep the expert width in ``feed_forward_length``.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from . import gguf_deepseek
from .fields import as_float, as_int, as_str, bad
from .gguf_header import GGUFHeader, GGUFHeaderError, read_gguf_header
from .manifest import Extent, Manifest, ModelConfig, QkNorm, TensorInfo
from .paths import shown
from .quant_types import check_dtype
from .validate import (
    check_extents,
    check_layer_count,
    check_packed,
    layers_present,
    order_and_check,
    split_rows,
    unsupported_architecture,
)

# GGUF general.architecture values this loader understands -> family.
GGUF_ARCHITECTURES = ("llama", "qwen2moe", "qwen3moe", "olmoe", *gguf_deepseek.ARCHITECTURES)
_FAMILY = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "olmoe": "olmoe"}
# llama.cpp's graphs: the norm_w argument of build_moe_ffn, per family.
_NORM_TOPK = {"mixtral": True, "qwen3_moe": True, "qwen2_moe": False, "olmoe": False}
# Architectures whose llama.cpp converter permutes Q/K rows (LlamaModel.undo_permute).
_PERMUTED = {"llama"}

_EXPS = re.compile(r"^(blk\.\d+\.ffn_(?:gate|up|down)_exps)\.weight$")


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


def _get(md: dict[str, Any], key: str, where: Path, default: Any = None) -> Any:
    v = md.get(key, default)
    if v is None:
        raise ModelFormatError(f"{where}: GGUF metadata key {key!r} is missing")
    return v


def _int_key(
    md: dict[str, Any], key: str, where: Path, default: int | None = None, *, lo: int = 1
) -> int:
    v = _get(md, key, where, default)
    if isinstance(v, list):
        if not v or any(x != v[0] for x in v):
            raise UnsupportedError(f"{where}: per-layer values for {key!r} are not supported")
        v = v[0]
    return as_int(v, f"GGUF metadata {key}", where, lo=lo)


def _rope_scaling(md: dict[str, Any], arch: str, where: Path) -> dict[str, Any] | None:
    kind = md.get(f"{arch}.rope.scaling.type")
    factor = md.get(f"{arch}.rope.scaling.factor")
    if kind is None and md.get(f"{arch}.rope.scale_linear") is not None:
        kind, factor = "linear", md[f"{arch}.rope.scale_linear"]
    if kind is None or kind == "none":
        return None
    out: dict[str, Any] = {"rope_type": as_str(kind, f"{arch}.rope.scaling.type", where)}
    if factor is not None:
        out["factor"] = _f32(factor, f"{arch}.rope.scaling.factor", where)
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


def _f32(v: Any, key: str, where: Path) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99e-06)."""
    x = as_float(v, f"GGUF metadata {key}", where)
    with np.errstate(over="ignore"):
        y = float(str(np.float32(x)))
    if not math.isfinite(y):
        raise bad(where, f"GGUF metadata {key}", v, "a finite float32")
    return y


def _canonical(name: str) -> str:
    return name[: -len(".weight")] if name.endswith(".weight") else name


def _optional_int(md: dict[str, Any], key: str, where: Path) -> int | None:
    v = md.get(key)
    return None if v is None else as_int(v, f"GGUF metadata {key}", where)


def _tensors(header: GGUFHeader, p: Path, arch: str, n_expert: int) -> dict[str, TensorInfo]:
    """The file's tensors by canonical name, stacked experts split one per expert."""
    tensors: dict[str, TensorInfo] = {}
    for t in header.tensors:
        if any(d == 0 for d in t.dims):
            raise ModelFormatError(f"{p}: tensor {shown(t.name)} has a zero dimension {t.shape}")
        ext = Extent(0, header.data_offset(t), t.n_bytes)
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
        cname = gguf_deepseek.canonical_name(arch, t.name)
        shape = gguf_deepseek.reshape(cname, t.shape)
        tensors[cname] = TensorInfo(cname, t.type_name, shape, (ext,))
    return tensors


def _load_deepseek(p: Path, size: int, header: GGUFHeader, arch: str) -> Manifest:
    md = header.metadata
    check_packed(
        ((header.data_offset(t), header.data_offset(t) + t.n_bytes, t.name)
         for t in header.tensors),
        header.data_start, size, header.alignment, p,
    )  # fmt: skip
    # Before anything loops over the layers: block_count is the layers present (a
    # "trunk-only" file declares its MTP layers without carrying them).
    blocks = _int_key(md, f"{arch}.block_count", p)
    declared = _int_key(md, f"{arch}.nextn_predict_layers", p, 0, lo=0)
    present = layers_present(t.name for t in header.tensors)
    if present != set(range(len(present))) or blocks not in (len(present), len(present) + declared):
        check_layer_count(blocks, (t.name for t in header.tensors),
                          f"GGUF metadata {arch}.block_count", p)  # fmt: skip
    tensors = _tensors(header, p, arch, _int_key(md, f"{arch}.expert_count", p, 0, lo=0))
    if "token_embd" not in tensors or len(tensors["token_embd"].shape) != 2:
        raise ModelFormatError(f"{p}: tensor 'token_embd' is missing or not a matrix")
    n_heads = _int_key(md, f"{arch}.attention.head_count", p)
    base = dict(
        vocab_size=tensors["token_embd"].shape[0],
        hidden_size=_int_key(md, f"{arch}.embedding_length", p),
        n_layers=blocks,
        n_heads=n_heads,
        n_kv_heads=_int_key(md, f"{arch}.attention.head_count_kv", p, n_heads),
        head_dim=0,
        rms_norm_eps=_f32(_get(md, f"{arch}.attention.layer_norm_rms_epsilon", p),
                          f"{arch}.attention.layer_norm_rms_epsilon", p),
        rope_theta=_f32(md.get(f"{arch}.rope.freq_base", 10000.0), f"{arch}.rope.freq_base", p),
        max_position_embeddings=_int_key(md, f"{arch}.context_length", p),
        tie_word_embeddings="output" not in tensors,
        rope_scaling=_rope_scaling(md, arch, p),
        **_special_ids(md, p),
    )  # fmt: skip
    cfg = gguf_deepseek.family_config(arch, md, tensors, p, base)
    ordered = order_and_check(tensors, cfg, p)
    check_extents(ordered, (p,), (size,))
    return Manifest(source="gguf", path=p, files=(p.resolve(),), config=cfg, tensors=ordered,
                    metadata=md)  # fmt: skip


def _special_ids(md: dict[str, Any], where: Path) -> dict[str, Any]:
    eos: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        v = _optional_int(md, key, where)
        if v is not None and v not in eos:
            eos.append(v)
    bos = _optional_int(md, "tokenizer.ggml.bos_token_id", where)
    return {"bos_token_id": bos, "eos_token_ids": tuple(eos)}


def load_gguf(path: str | os.PathLike[str]) -> Manifest:
    """Read a GGUF file's header and return its manifest (no tensor data is loaded)."""
    p = Path(path)
    size = os.stat(p).st_size
    header = _open(p, size)
    md = header.metadata
    where = p
    if (_optional_int(md, "split.count", p) or 1) > 1:
        raise UnsupportedError(
            f"{p}: split GGUF files are not supported; merge the parts with "
            f"`llama-gguf-split --merge` and load the merged file."
        )
    gguf_arch = md.get("general.architecture", "")
    if gguf_arch not in GGUF_ARCHITECTURES:
        found = gguf_arch if isinstance(gguf_arch, str) and gguf_arch else "<missing>"
        raise unsupported_architecture(found[:60], p, GGUF_ARCHITECTURES)

    if gguf_arch in gguf_deepseek.ARCHITECTURES:
        return _load_deepseek(p, size, header, gguf_arch)
    n_expert = _int_key(md, f"{gguf_arch}.expert_count", where, 0, lo=0)
    family = _FAMILY.get(gguf_arch, "mixtral" if n_expert > 0 else "llama")

    # Writers put tensors back to back, padded to the alignment: a gap is a shrunk tensor.
    check_packed(
        ((header.data_offset(t), header.data_offset(t) + t.n_bytes, t.name)
         for t in header.tensors),
        header.data_start, size, header.alignment, p,
    )  # fmt: skip
    # Raw tensors: name -> (dtype, torch shape, extent).
    raw: dict[str, tuple[str, tuple[int, ...], Extent]] = {}
    for t in header.tensors:
        if any(d == 0 for d in t.dims):
            raise ModelFormatError(f"{p}: tensor {shown(t.name)} has a zero dimension {t.shape}")
        raw[t.name] = (t.type_name, t.shape, Extent(0, header.data_offset(t), t.n_bytes))

    hidden = _int_key(md, f"{gguf_arch}.embedding_length", where)
    n_layers = _int_key(md, f"{gguf_arch}.block_count", where)
    n_heads = _int_key(md, f"{gguf_arch}.attention.head_count", where)
    n_kv = _int_key(md, f"{gguf_arch}.attention.head_count_kv", where, n_heads)
    head_dim = _int_key(md, f"{gguf_arch}.attention.key_length", where, hidden // n_heads)
    v_dim = _int_key(md, f"{gguf_arch}.attention.value_length", where, head_dim)
    rot = _int_key(md, f"{gguf_arch}.rope.dimension_count", where, head_dim)
    if v_dim != head_dim or rot != head_dim:
        raise UnsupportedError(
            f"{p}: key length {head_dim}, value length {v_dim} and RoPE dimensions {rot} "
            f"differ; colibri supports full-dimension RoPE with equal key/value head sizes."
        )
    if "token_embd.weight" not in raw or len(raw["token_embd.weight"][1]) != 2:
        raise ModelFormatError(f"{p}: tensor 'token_embd' is missing or not a matrix")
    vocab = raw["token_embd.weight"][1][0]
    # Before anything loops over the layers: the count must be the layers present.
    check_layer_count(n_layers, raw, f"GGUF metadata {gguf_arch}.block_count", p)

    tensors: dict[str, TensorInfo] = {}
    for name, (dtype, shape, ext) in raw.items():
        check_dtype(name, dtype, p)
        m = _EXPS.match(name)
        if m:
            if len(shape) != 3:
                raise ModelFormatError(f"{p}: stacked expert tensor {name!r} has shape {shape}")
            n_e, rows, cols = shape
            if n_e != n_expert:
                raise ModelFormatError(
                    f"{p}: stacked expert tensor {name!r} holds {n_e} experts, but "
                    f"{gguf_arch}.expert_count is {n_expert}"
                )
            each = ext.length // n_e
            if each * n_e != ext.length:
                raise ModelFormatError(f"{p}: tensor {name!r} does not split into {n_e} experts")
            for e, sub in enumerate(split_rows(ext, n_e, each)):
                nm = f"{m.group(1)}.{e}"
                tensors[nm] = TensorInfo(nm, dtype, (rows, cols), (sub,))
            continue
        cname = _canonical(name)
        if cname.endswith("ffn_gate_inp_shexp") and len(shape) == 1:
            shape = (1, shape[0])  # llama.cpp creates it as {n_embd}; either layout is one row
        heads = 0
        if gguf_arch in _PERMUTED:
            if cname.endswith(("attn_q", "attn_q.bias")):
                heads = n_heads
            elif cname.endswith(("attn_k", "attn_k.bias")):
                heads = n_kv
        tensors[cname] = TensorInfo(cname, dtype, shape, (ext,), heads)

    def width(name: str, axis: int) -> int:
        t = tensors.get(name)
        return t.shape[axis] if t is not None and len(t.shape) > axis else 0

    moe_layers = tuple(f"blk.{i}.ffn_gate_inp" in tensors for i in range(n_layers))
    first_moe = next((i for i, m in enumerate(moe_layers) if m), None)
    first_dense = next((i for i, m in enumerate(moe_layers) if not m), None)
    moe_ffn = width(f"blk.{first_moe}.ffn_gate_exps.0", 0) if first_moe is not None else 0
    shared_ffn = width(f"blk.{first_moe}.ffn_gate_shexp", 0) if first_moe is not None else 0
    dense_ffn = width(f"blk.{first_dense}.ffn_gate", 0) if first_dense is not None else 0

    # OLMoE normalizes the whole Q/K projection, Qwen3-MoE each head (llama.cpp likewise).
    qk: QkNorm = "none"
    if "blk.0.attn_q_norm" in tensors:
        qk = "full" if family == "olmoe" else "head"

    eos: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        v = _optional_int(md, key, where)
        if v is not None and v not in eos:
            eos.append(v)
    eps_key = f"{gguf_arch}.attention.layer_norm_rms_epsilon"
    theta_key = f"{gguf_arch}.rope.freq_base"

    cfg = ModelConfig(
        arch=family,
        vocab_size=vocab,
        hidden_size=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=dense_ffn,
        rms_norm_eps=_f32(_get(md, eps_key, where), eps_key, where),
        rope_theta=_f32(md.get(theta_key, 10000.0), theta_key, where),
        max_position_embeddings=_int_key(md, f"{gguf_arch}.context_length", where, lo=0),
        tie_word_embeddings="output" not in tensors,
        rope_scaling=_rope_scaling(md, gguf_arch, where),
        qk_norm=qk,
        attention_bias="blk.0.attn_q.bias" in tensors,
        n_experts=n_expert if first_moe is not None else 0,
        n_experts_per_tok=_int_key(md, f"{gguf_arch}.expert_used_count", where, 0, lo=0)
        if first_moe is not None
        else 0,
        moe_intermediate_size=moe_ffn,
        norm_topk_prob=_NORM_TOPK.get(family, False) if first_moe is not None else False,
        shared_expert_intermediate_size=shared_ffn,
        moe_layers=moe_layers,
        bos_token_id=_optional_int(md, "tokenizer.ggml.bos_token_id", where),
        eos_token_ids=tuple(eos),
    )
    if family in _NORM_TOPK and first_moe is None:
        raise ModelFormatError(f"{p}: a {family} model without router tensors (ffn_gate_inp)")
    ordered = order_and_check(tensors, cfg, p)
    check_extents(ordered, (p,), (size,))
    return Manifest(
        source="gguf",
        path=p,
        files=(p.resolve(),),
        config=cfg,
        tensors=ordered,
        metadata=md,
    )
