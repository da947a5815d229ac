"""Checks shared by every model source: the config as data, families, tensor sets,
shapes and byte extents (the tensors a config implies: units.py; the families:
families/).

A source maps its own names and metadata to canonical ones; this module then checks the
result, so every source reports the same problems the same way: a config field of the
wrong type or out of range (:func:`check_config`), layer or expert counts that disagree
with the tensors present, the first missing tensor, a shape that disagrees with the
config, an extent outside its file or overlapping another one. The counts are checked
against the tensors before anything loops over them, so a header claiming 2**31 layers
costs nothing.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError, UnsupportedError
from .families import SUPPORTED_FAMILIES as SUPPORTED_FAMILIES
from .families import family_of, unsupported_architecture
from .fields import MAX_DIM, as_bool, as_float, as_int, bad
from .linear_attn import check_linear_fields
from .manifest import Extent, ModelConfig, TensorInfo
from .paths import shown
from .quant_types import tensor_nbytes
from .units import OPTIONAL_SHAPES, optional_shapes
from .units import expected_shapes as expected_shapes
from .units import is_full_indexer_layer as is_full_indexer_layer
from .v4_units import check_v4_fields

# RoPE scaling variants colibri computes (colibri.engine.rope), and the parameters each needs.
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
_QK_NORMS = ("none", "head", "full")


def check_config(cfg: ModelConfig, where: object) -> None:
    """The normalized config as data: every field has its type and a value the forward
    pass can use (positive sizes that fit the core's integers, heads that divide into KV
    groups, top-k within the experts, a finite positive RoPE base, a finite epsilon >= 0,
    RoPE scaling parameters that give finite frequencies). Raises ModelFormatError naming
    the field, UnsupportedArchitectureError / UnsupportedError for what colibri does not
    implement."""
    if not isinstance(cfg.arch, str) or cfg.arch not in SUPPORTED_FAMILIES:
        raise unsupported_architecture(str(cfg.arch), Path(str(where)), SUPPORTED_FAMILIES)

    def pos(name: str, lo: int = 1) -> int:
        return as_int(getattr(cfg, name), name, where, lo=lo)

    for name in ("vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads", "head_dim"):
        pos(name)
    for name in ("intermediate_size", "max_position_embeddings", "n_experts",
                 "n_experts_per_tok", "moe_intermediate_size",
                 "shared_expert_intermediate_size"):  # fmt: skip
        pos(name, 0)
    if cfg.n_heads % cfg.n_kv_heads:
        raise ModelFormatError(
            f"{where}: n_heads ({cfg.n_heads}) must be a multiple of n_kv_heads "
            f"({cfg.n_kv_heads})"
        )
    if cfg.head_dim % 2:
        raise bad(where, "head_dim", cfg.head_dim, "even (RoPE rotates pairs of dimensions)")
    if cfg.n_heads * cfg.head_dim > MAX_DIM:
        raise ModelFormatError(f"{where}: n_heads x head_dim does not fit the core's sizes")
    eps = as_float(cfg.rms_norm_eps, "rms_norm_eps", where, lo=0.0)
    if eps >= 1.0:  # real models use 1e-6..1e-5; >= 1 flattens every activation
        raise bad(where, "rms_norm_eps", eps, "in [0, 1)")
    as_float(cfg.rope_theta, "rope_theta", where, lo=0.0, lo_open=True)
    for name in ("tie_word_embeddings", "attention_bias", "norm_topk_prob"):
        if not isinstance(getattr(cfg, name), bool):
            raise bad(where, name, getattr(cfg, name), "true or false")
    if cfg.qk_norm not in _QK_NORMS:
        raise bad(where, "qk_norm", cfg.qk_norm, f"one of {', '.join(_QK_NORMS)}")
    layers = cfg.moe_layers
    if not isinstance(layers, tuple) or not all(isinstance(m, bool) for m in layers):
        raise bad(where, "moe_layers", layers, "a list of true/false, one per layer")
    if layers and len(layers) != cfg.n_layers:
        raise ModelFormatError(
            f"{where}: moe_layers has {len(layers)} entries for {cfg.n_layers} layers"
        )
    if any(layers):
        if cfg.n_experts < 1 or cfg.moe_intermediate_size < 1:
            raise ModelFormatError(
                f"{where}: MoE layers need n_experts >= 1 and moe_intermediate_size >= 1 "
                f"(got {cfg.n_experts}, {cfg.moe_intermediate_size})"
            )
        if not 1 <= cfg.n_experts_per_tok <= cfg.n_experts:
            raise ModelFormatError(
                f"{where}: n_experts_per_tok must be in [1, n_experts = {cfg.n_experts}], "
                f"not {cfg.n_experts_per_tok}"
            )
    if not all(layers) and cfg.intermediate_size < 1:
        raise ModelFormatError(f"{where}: dense layers need intermediate_size >= 1")
    if cfg.bos_token_id is not None:
        as_int(cfg.bos_token_id, "bos_token_id", where)
    if not isinstance(cfg.eos_token_ids, tuple):
        raise bad(where, "eos_token_ids", cfg.eos_token_ids, "a list of token ids")
    for t in cfg.eos_token_ids:
        as_int(t, "eos_token_ids", where)
    check_rope_scaling(cfg.rope_scaling, cfg.rope_theta, cfg.max_position_embeddings, where)
    check_attention_extras(cfg, where)
    check_family_fields(cfg, where)
    check_v4_fields(cfg, where)
    if cfg.compress_ratios:
        check_rope_scaling(cfg.compress_rope_scaling, cfg.compress_rope_theta,
                           cfg.max_position_embeddings, where)  # fmt: skip
    check_linear_fields(cfg, where)


def check_attention_extras(cfg: ModelConfig, where: object) -> None:
    """Attention sinks, sliding windows and the output bias (gpt-oss; GQA only) as data: a
    window >= 0 that fits the model's context (max_position_embeddings), one sliding_layers
    entry per layer, and layers marked sliding only with a window."""
    for name in ("attention_sinks", "attention_out_bias"):
        if not isinstance(getattr(cfg, name), bool):
            raise bad(where, name, getattr(cfg, name), "true or false")
    window = as_int(cfg.sliding_window, "sliding_window", where, lo=0)
    layers = cfg.sliding_layers
    if not isinstance(layers, tuple) or not all(isinstance(s, bool) for s in layers):
        raise bad(where, "sliding_layers", layers, "a list of true/false, one per layer")
    if layers and len(layers) != cfg.n_layers:
        raise ModelFormatError(
            f"{where}: sliding_layers has {len(layers)} entries for {cfg.n_layers} layers"
        )
    if window and not layers:
        raise ModelFormatError(
            f"{where}: sliding_window {window} needs sliding_layers (one true/false per layer)"
        )
    if any(layers) and not window:
        raise ModelFormatError(f"{where}: sliding_layers marks layers but sliding_window is 0")
    if window > cfg.max_position_embeddings > 0:
        raise ModelFormatError(
            f"{where}: sliding_window {window} is larger than the context length "
            f"(max_position_embeddings {cfg.max_position_embeddings})"
        )
    _check_gqa_overrides(cfg, where)
    extras = cfg.attention_sinks or cfg.attention_out_bias or any(layers)
    if cfg.attention not in ("gqa", "v4_sliding") and extras:
        raise UnsupportedError(f"{where}: attention sinks, sliding windows and an output bias "
                               f"are implemented for GQA attention only")  # fmt: skip


def _check_gqa_overrides(cfg: ModelConfig, where: object) -> None:
    """MiMo-V2-Flash's per-layer-type GQA fields (manifest.ModelConfig): GQA only, the
    sliding layers' KV heads a divisor of n_heads, a RoPE base > 0, a value scale > 0."""
    kv = as_int(cfg.sliding_n_kv_heads, "sliding_n_kv_heads", where, lo=0)
    if kv and cfg.n_heads % kv:
        raise bad(where, "sliding_n_kv_heads", kv, f"a divisor of n_heads ({cfg.n_heads})")
    if cfg.sliding_rope_theta != 0:
        as_float(cfg.sliding_rope_theta, "sliding_rope_theta", where, lo=0.0, lo_open=True)
    as_float(cfg.attention_value_scale, "attention_value_scale", where, lo=0.0, lo_open=True)
    if not isinstance(cfg.sinks_sliding_only, bool):
        raise bad(where, "sinks_sliding_only", cfg.sinks_sliding_only, "true or false")
    used = (kv or cfg.sliding_rope_theta or cfg.sinks_sliding_only
            or cfg.attention_value_scale != 1.0)  # fmt: skip
    if used and cfg.attention != "gqa":
        raise UnsupportedError(f"{where}: per-layer-type KV heads, RoPE, sinks and a value "
                               f"scale are implemented for GQA attention only")  # fmt: skip
    if cfg.attention == "gqa":
        as_int(cfg.v_head_dim, "v_head_dim", where, lo=0)


_ATTENTION_KINDS = ("gqa", "mla", "v4_sliding")
_ROUTERS = ("softmax", "sigmoid_grouped", "softmax_group_limited", "sqrt_softplus")
_INDEXER_TYPES = ("full", "shared")


_ACTIVATIONS = ("silu", "swiglu_oai", "swiglu_clamp")


def check_ffn_fields(cfg: ModelConfig, where: object) -> None:
    """The gpt-oss FFN fields: biases on or off, a known activation, and for the clamped
    SwiGLU a finite limit > 0 and a finite alpha."""
    for name in ("router_logit_bias", "expert_bias"):
        if not isinstance(getattr(cfg, name), bool):
            raise bad(where, name, getattr(cfg, name), "true or false")
    if cfg.activation not in _ACTIVATIONS:
        raise UnsupportedError(f"{where}: activation {shown(cfg.activation)} is not "
                               f"implemented ({', '.join(_ACTIVATIONS)})")  # fmt: skip
    if cfg.activation in ("swiglu_oai", "swiglu_clamp"):
        as_float(cfg.swiglu_limit, "swiglu_limit", where, lo=0.0, lo_open=True)
        as_float(cfg.swiglu_alpha, "swiglu_alpha", where)


def check_family_fields(cfg: ModelConfig, where: object) -> None:
    """The fields of the DeepSeek / GLM family (routing rule, MLA, DSA, MTP; defaults for
    every other family) as data, with the same care as the rest of the config."""
    for name in ("rope_interleaved", "router_bias", "shared_expert_gated",
                 "index_rope_interleaved"):  # fmt: skip
        if not isinstance(getattr(cfg, name), bool):
            raise bad(where, name, getattr(cfg, name), "true or false")
    as_int(cfg.index_n_heads, "index_n_heads", where, lo=0)  # has_indexer compares it
    if cfg.attention not in _ATTENTION_KINDS:
        raise bad(where, "attention", cfg.attention, f"one of {', '.join(_ATTENTION_KINDS)}")
    if cfg.router not in _ROUTERS:
        raise UnsupportedError(f"{where}: routing rule {shown(cfg.router)} is not implemented "
                               f"({', '.join(_ROUTERS)})")  # fmt: skip
    fam = family_of(cfg.arch)
    if cfg.attention not in fam.attention or cfg.router not in fam.routers:
        raise UnsupportedError(
            f"{where}: a {cfg.arch} model with {cfg.attention} attention and the {cfg.router} "
            f"router is not implemented (the {fam.name} family: {', '.join(fam.attention)} "
            f"attention; routers {', '.join(fam.routers)})"
        )
    as_float(cfg.routed_scaling_factor, "routed_scaling_factor", where, lo=0.0, lo_open=True)
    as_float(cfg.attention_scale, "attention_scale", where, lo=0.0)
    n_group = as_int(cfg.n_group, "n_group", where, lo=1)
    as_int(cfg.topk_group, "topk_group", where, lo=1, hi=n_group)
    if any(cfg.moe_layers) and cfg.n_experts % n_group:
        raise ModelFormatError(f"{where}: n_group {n_group} does not divide n_experts "
                               f"{cfg.n_experts}")  # fmt: skip
    check_ffn_fields(cfg, where)
    rot = as_int(cfg.rotary_dim, "rotary_dim", where, lo=0, hi=cfg.head_dim)
    if rot % 2:
        raise bad(where, "rotary_dim", rot, "even (RoPE rotates pairs of dimensions)")
    as_int(cfg.n_mtp_layers, "n_mtp_layers", where, lo=0, hi=64)
    if cfg.attention == "mla":
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            as_int(getattr(cfg, name), name, where, lo=1)
        as_int(cfg.q_lora_rank, "q_lora_rank", where, lo=0)
        if cfg.qk_rope_head_dim % 2 or cfg.rotary_dim != cfg.qk_rope_head_dim:
            raise bad(where, "qk_rope_head_dim", cfg.qk_rope_head_dim,
                      "even, and the rotary dimension (rotary_dim)")  # fmt: skip
        if cfg.head_dim != cfg.qk_nope_head_dim + cfg.qk_rope_head_dim or \
                cfg.n_kv_heads != cfg.n_heads:  # fmt: skip
            raise ModelFormatError(f"{where}: MLA needs head_dim = qk_nope_head_dim + "
                                   f"qk_rope_head_dim and n_kv_heads = n_heads")  # fmt: skip
        eps = as_float(cfg.mla_norm_eps, "mla_norm_eps", where, lo=0.0)
        if eps >= 1.0:
            raise bad(where, "mla_norm_eps", eps, "in [0, 1)")
    elif cfg.rope_interleaved and cfg.attention != "v4_sliding":
        raise UnsupportedError(f"{where}: interleaved RoPE is implemented for MLA models only")
    if not cfg.has_indexer or cfg.attention == "v4_sliding":  # V4's own: v4_units
        return
    if cfg.attention != "mla" or cfg.q_lora_rank < 1:
        raise UnsupportedError(f"{where}: the DSA indexer needs MLA with q-LoRA")
    as_int(cfg.index_head_dim, "index_head_dim", where, lo=max(cfg.qk_rope_head_dim, 1))
    as_int(cfg.index_topk, "index_topk", where, lo=1, hi=1 << 30)
    types = cfg.indexer_types
    if not isinstance(types, tuple) or (types and len(types) != cfg.n_layers):
        raise bad(where, "indexer_types", types, f"a list of {cfg.n_layers} entries")
    for t in types:
        if t not in _INDEXER_TYPES:
            raise UnsupportedError(f"{where}: indexer type {shown(t)} is not implemented "
                                   f"(colibri runs 'full' and 'shared' DSA layers)")  # fmt: skip
    if types and types[0] != "full":
        raise ModelFormatError(f"{where}: indexer_types[0] must be 'full' (a shared layer "
                               f"reuses an earlier full layer's selection)")  # fmt: skip


def check_rope_scaling(
    scaling: Mapping[str, Any] | None, theta: float, max_positions: int, where: object
) -> None:
    """The parameters colibri.engine.rope reads, for the variant named: present, numbers, and in
    the range where the formulas are finite (factor > 0, llama3's 0 < low < high, ...)."""
    if scaling is None:
        return
    if not isinstance(scaling, Mapping):
        raise bad(where, "rope_scaling", scaling, "an object or null")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise UnsupportedError(
            f"{where}: RoPE scaling type {shown(kind)} is not supported; supported: "
            f"{', '.join(ROPE_TYPES)}"
        )

    def number(key: str, *, required: bool = True, lo_open: bool = True) -> float | None:
        v = scaling.get(key)
        if v is None and not required:
            return None
        return as_float(v, f"rope_scaling.{key}", where, lo=0.0, lo_open=lo_open)

    if kind == "default":
        return
    number("factor", required=kind != "dynamic")
    if kind == "llama3":
        low, high = number("low_freq_factor"), number("high_freq_factor")
        if low is not None and high is not None and not low < high:
            raise ModelFormatError(
                f"{where}: rope_scaling needs low_freq_factor < high_freq_factor "
                f"(got {low:g}, {high:g})"
            )
        as_int(scaling.get("original_max_position_embeddings"),
               "rope_scaling.original_max_position_embeddings", where, lo=1)  # fmt: skip
    if kind == "yarn":
        number("beta_fast", required=False)
        number("beta_slow", required=False)
        number("attention_factor", required=False)
        number("mscale", required=False, lo_open=False)
        number("mscale_all_dim", required=False, lo_open=False)
        original = scaling.get("original_max_position_embeddings")
        if original is not None or max_positions < 1:
            as_int(original, "rope_scaling.original_max_position_embeddings", where, lo=1)
        if "truncate" in scaling:
            as_bool(scaling["truncate"], "rope_scaling.truncate", where)
        if theta == 1.0:
            raise bad(where, "rope_theta", theta, "!= 1 with YaRN scaling (it divides by log)")


# At most 9 digits: a name with a 5000-digit index must not reach int() (which refuses
# more than 4300 digits); it is then simply a tensor the config does not use.
_LAYER = re.compile(r"^blk\.(\d{1,9})\.")
_EXPERT = re.compile(r"^blk\.(\d{1,9})\.ffn_(?:gate|up|down)_exps\.(\d{1,9})$")


def layers_present(names: Iterable[str], pattern: re.Pattern[str] = _LAYER) -> set[int]:
    """The layer indices that tensors named ``blk.{i}....`` (or ``pattern``) exist for."""
    return {int(m.group(1)) for n in names if (m := pattern.match(n))}


def check_layer_count(
    n_layers: int, names: Iterable[str], field: str, where: object,
    pattern: re.Pattern[str] = _LAYER,
) -> None:  # fmt: skip
    """A header's layer count against the tensors present (before anything loops over
    it): layers 0 .. n_layers - 1, each with tensors, and no others. ``pattern`` finds
    the layer index in a name (group 1; canonical ``blk.{i}.`` by default)."""
    found = layers_present(names, pattern)
    if found != set(range(len(found))) or len(found) != n_layers:
        last = max(found) if found else None
        raise ModelFormatError(
            f"{where}: {field} says {n_layers} layers, but the file has tensors for "
            f"{len(found)} layers" + (f" (numbered up to blk.{last})" if last is not None else "")
            + ". The header is corrupt or does not match the weights."
        )


def check_expert_count(cfg: ModelConfig, names: Iterable[str], where: object) -> None:
    """n_experts against the routed-expert tensors present: indices 0 .. n_experts - 1."""
    found = {int(m.group(2)) for n in names if (m := _EXPERT.match(n))}
    if not any(cfg.moe_layers):
        return
    # found is bounded by the tensors present; range(n_experts) is not (2**31).
    if len(found) != cfg.n_experts or (found and max(found) != cfg.n_experts - 1):
        raise ModelFormatError(
            f"{where}: the config says {cfg.n_experts} experts per MoE layer, but the file "
            f"holds routed-expert tensors for {len(found)} distinct experts. The header is "
            f"corrupt or does not match the weights."
        )


def order_and_check(
    tensors: Mapping[str, TensorInfo], cfg: ModelConfig, where: Path
) -> dict[str, TensorInfo]:
    """Check the tensor set against the config and return it in canonical order.

    The config is checked first (:func:`check_config`), then its layer and expert counts
    against the tensors present. Raises ModelFormatError naming the first missing tensor,
    a shape mismatch, or a tensor the config does not account for.
    """
    check_config(cfg, where)
    check_layer_count(cfg.n_layers + cfg.n_mtp_layers, tensors, "n_layers + n_mtp_layers", where)
    check_expert_count(cfg, tensors, where)
    want = expected_shapes(cfg)
    out: dict[str, TensorInfo] = {}
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None:
            raise ModelFormatError(
                f"{where}: tensor {shown(name)} is missing ({len(tensors)} tensors found, "
                f"{len(want)} expected for this {cfg.arch} config). The checkpoint is incomplete "
                f"or its config does not match its weights."
            )
        if tuple(t.shape) != shape:
            raise ModelFormatError(
                f"{where}: tensor {shown(name)} has shape {tuple(t.shape)}, but the config implies "
                f"{shape}. The config does not match the weights."
            )
        out[name] = t
    optional = optional_shapes(cfg)
    for name, t in tensors.items():
        if name in out:
            continue
        if name in OPTIONAL_SHAPES:
            out[name] = t
            continue
        if name in optional:
            if tuple(t.shape) != optional[name]:
                raise ModelFormatError(
                    f"{where}: tensor {shown(name)} has shape {tuple(t.shape)}, but the config "
                    f"implies {optional[name]}. The config does not match the weights."
                )
            out[name] = t
            continue
        raise ModelFormatError(
            f"{where}: tensor {shown(name)} is not used by a {cfg.arch} model with this config "
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
                f"tensor {shown(t.name)}: its extents hold {t.nbytes} bytes, but a {t.dtype} "
                f"tensor "
                f"of shape {tuple(t.shape)} needs {want}. The file is corrupt."
            )
        for e in t.extents:
            if not 0 <= e.file < len(files):
                raise ModelFormatError(
                    f"tensor {shown(t.name)}: extent names file #{e.file}, which does not exist"
                )
            end = e.offset + e.length
            if e.offset < 0 or e.length < 0 or end > sizes[e.file]:
                raise ModelFormatError(
                    f"{files[e.file]}: tensor {shown(t.name)} needs bytes [{e.offset}, {end}), but "
                    f"the file is only {sizes[e.file]} bytes long (expected at least {end}). "
                    f"The file is truncated or corrupt; download or convert it again."
                )
            per_file[e.file].append((e.offset, end, t.name))
    for fi, spans in enumerate(per_file):
        spans.sort()
        for (a0, a1, an), (b0, _b1, bn) in itertools.pairwise(spans):
            if b0 < a1 and a0 != a1:
                raise ModelFormatError(
                    f"{files[fi]}: tensors {shown(an)} and {shown(bn)} overlap (bytes {b0}..{a1}). "
                    f"The file's header is corrupt."
                )


def check_packed(
    spans: Iterable[tuple[int, int, str]], start: int, end: int, slack: int, where: object
) -> None:
    """Tensors fill the data region [start, end) of a file the way its writers lay them
    out: in offset order, each starting fewer than ``slack`` bytes after the previous one
    ends (alignment padding), the last ending fewer than ``slack`` bytes before ``end``.
    A gap means the header shrank a tensor (a changed type or shape): its bytes would be
    read as something they are not. Overlaps are check_extents' to report."""
    pos, prev = start, "the start of the data"
    for lo, hi, name in sorted(spans):
        if lo < pos and lo < hi:
            raise ModelFormatError(
                f"{where}: tensors {prev} and {shown(name)} overlap (bytes {lo}..{pos}): the "
                f"header is corrupt"
            )
        if lo - pos >= max(slack, 1):
            raise ModelFormatError(
                f"{where}: {lo - pos} unused bytes between {prev} and tensor {shown(name)} "
                f"(more than the writer's padding): the header is corrupt (a tensor's type or "
                f"shape was changed)"
            )
        pos, prev = max(pos, hi), f"tensor {shown(name)}"
    if end - pos >= max(slack, 1):
        raise ModelFormatError(
            f"{where}: {end - pos} bytes after the last tensor ({prev}) belong to no tensor: "
            f"the header is corrupt (a tensor's type or shape was changed, or its length "
            f"field is wrong)"
        )


def split_rows(extent: Extent, n: int, nbytes_each: int) -> Iterator[Extent]:
    """Cut a contiguous extent holding n equal parts into one extent per part."""
    for i in range(n):
        yield Extent(extent.file, extent.offset + i * nbytes_each, nbytes_each)
