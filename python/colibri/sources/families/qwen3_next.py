"""Qwen3-Next: a hybrid of Gated DeltaNet linear-attention layers and gated grouped-query
attention layers, with a Qwen2-MoE-style FFN (softmax top-k routing plus a shared expert
behind a sigmoid gate).

* ``qwen3_next``: Hugging Face ``qwen3_next`` / ``Qwen3NextForCausalLM``; GGUF
  ``qwen3next`` (qwen3_next_gguf.py reads llama.cpp's files).
* ``qwen3_5_moe``: the text model of Qwen3.5-MoE, Hugging Face ``qwen3_5_moe_text`` /
  ``Qwen3_5MoeForCausalLM``: the same layers with the linear projections stored apart
  (``in_proj_qkv`` already in the convolution's channel order, ``in_proj_z``, ``in_proj_b``,
  ``in_proj_a``), every FFN MoE and the top-k weights always renormalized. Its RoPE is
  multimodal (sections of the frequencies follow time, height and width positions); for
  text the three positions are the token's, which is plain RoPE. The multimodal
  checkpoint (``qwen3_5_moe`` / ``Qwen3_5MoeForConditionalGeneration``) loads as its text
  model: ``text_config`` read over the top level, ``model.language_model.*`` as
  ``model.*``, the vision tower (``model.visual.*``) skipped. colibri takes text only (an
  image in a request is refused as every family's is). GGUF ``qwen35moe``.

* Layer schedule: config.json's ``layer_types`` ("linear_attention" / "full_attention"),
  else transformers' default from ``full_attention_interval`` (every n-th layer full,
  default 4). Any other kind is refused.
* Linear layers (csrc/model/linear_attn_gdn.hpp): ``in_proj_qkvz`` stores, per key head,
  its q and k rows then the v and z rows of the value heads that share it; ``in_proj_ba``
  per key head its b then a rows. Both are cut here, through extents (no copy), into
  ``gdn_in_qkv`` (all q, all k, all v rows: the order of the short convolution's channels),
  ``gdn_in_z``, ``gdn_in_b`` and ``gdn_in_a``; ``conv1d.weight`` (C, 1, K) is read as one
  vector of C * K.
* Attention layers: ``q_proj`` holds, per head, head_dim query rows then head_dim gate
  rows; cut into ``attn_q`` and ``attn_gate`` (sigmoid(gate) scales the attention output
  before o_proj). QK-norm per head; partial RoPE (``partial_rotary_factor``, 0.25 by
  default as transformers' config).
* The multi-token-prediction weights the released checkpoints carry (``mtp.*``) are
  skipped, as transformers skips them; colibri's MTP drafting does not run them.
* Norms: the residual-stream RMSNorms and the QK-norms scale by (1 + w) (zero-centred
  weights): ``norm_weight_offset`` 1; the linear layers' gated norm scales by w.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import ModelFormatError, UnsupportedError
from ..fields import as_float, as_int, bad
from ..manifest import Extent, ModelConfig, TensorInfo
from ..paths import shown
from .common import DECODER_NAMES, LAYER, hf_expert_counts, refuse_hf_features
from .qwen3_next_gguf import GGUF_ARCHS, MTP_KEY, gguf_config, gguf_name, gguf_tensors
from .qwen_moe import SHARED_EXPERT_NAMES
from .spec import Family, HFInput, NameRule

ARCH = "qwen3_next"
QWEN35 = "qwen3_5_moe"
_KINDS = {"linear_attention": True, "full_attention": False}
_NAMES: list[NameRule] = [
    *DECODER_NAMES,
    *SHARED_EXPERT_NAMES,
    (re.compile(LAYER + r"linear_attn\.A_log"), "blk.{0}.gdn_a_log"),
    (re.compile(LAYER + r"linear_attn\.dt_bias"), "blk.{0}.gdn_dt_bias"),
    (re.compile(LAYER + r"linear_attn\.norm\.weight"), "blk.{0}.gdn_norm"),
    (re.compile(LAYER + r"linear_attn\.out_proj\.weight"), "blk.{0}.gdn_out"),
    (re.compile(LAYER + r"linear_attn\.in_proj_(qkv|z|b|a)\.weight"), "blk.{0}.gdn_in_{1}"),
]
_QKVZ = re.compile(LAYER + r"linear_attn\.in_proj_qkvz\.weight")
_BA = re.compile(LAYER + r"linear_attn\.in_proj_ba\.weight")
_CONV = re.compile(LAYER + r"linear_attn\.conv1d\.weight")
_Q = re.compile(LAYER + r"self_attn\.q_proj\.weight")
_ITEMSIZE = {"F32": 4, "F16": 2, "BF16": 2}  # the float types the fused tensors may have


def linear_layers(cfg: Mapping[str, object], n_layers: int, where: object) -> tuple[bool, ...]:
    """Per layer True for a linear-attention layer, as transformers' Qwen3NextConfig reads
    ``layer_types`` / ``full_attention_interval``."""
    types = cfg.get("layer_types")
    if types is None:
        every = as_int(cfg.get("full_attention_interval", 4), "full_attention_interval", where,
                       lo=1)  # fmt: skip
        return tuple(bool((i + 1) % every) for i in range(n_layers))
    if not isinstance(types, list) or len(types) != n_layers:
        raise bad(where, "layer_types", types, f"a list of {n_layers} layer kinds")
    for i, t in enumerate(types):
        if t not in _KINDS:
            raise UnsupportedError(
                f"{where}: layer_types[{i}] is {shown(t)}; colibri runs Qwen3-Next's "
                f"linear_attention and full_attention layers only"
            )
    return tuple(_KINDS[t] for t in types)


def _hf_config(inp: HFInput) -> ModelConfig:
    refuse_hf_features(inp)
    f, where, n_layers = inp.fields, inp.fields.where, inp.base["n_layers"]
    n_exp, top_k = hf_expert_counts(inp)
    step = f.int("decoder_sparse_step", 1, lo=1)
    only_raw = inp.cfg.get("mlp_only_layers") or []
    if not isinstance(only_raw, list):
        raise bad(where, "mlp_only_layers", only_raw, "a list of layer indices")
    only = {as_int(i, "mlp_only_layers", where) for i in only_raw}
    moe_layers = tuple(i not in only and (i + 1) % step == 0 for i in range(n_layers))
    qwen35 = inp.arch == QWEN35
    head_dim = inp.base["head_dim"]
    params = inp.cfg.get("rope_parameters")
    params = params if isinstance(params, dict) else {}
    prf = as_float(params.get("partial_rotary_factor", inp.cfg.get("partial_rotary_factor", 0.25)),
                   "partial_rotary_factor", where, lo=0.0, lo_open=True)  # fmt: skip
    if prf > 1:
        raise ModelFormatError(f"{where}: partial_rotary_factor {prf} > 1")
    nk, nv = f.int("linear_num_key_heads", lo=1), f.int("linear_num_value_heads", lo=1)
    if nv % nk:  # checked before the fused projections are cut by these counts
        raise ModelFormatError(f"{where}: linear_num_value_heads {nv} is not a multiple of "
                               f"linear_num_key_heads {nk}")  # fmt: skip
    return ModelConfig(
        **inp.base,
        arch=inp.arch,
        intermediate_size=0 if all(moe_layers) else f.int("intermediate_size", 0, lo=0),
        qk_norm="head",
        rotary_dim=int(head_dim * prf),
        n_experts=n_exp,
        n_experts_per_tok=top_k,
        moe_intermediate_size=f.int("moe_intermediate_size"),
        norm_topk_prob=True if qwen35 else f.bool("norm_topk_prob", True),
        shared_expert_intermediate_size=f.int("shared_expert_intermediate_size", 0, lo=0),
        moe_layers=moe_layers,
        linear_layers=linear_layers(inp.cfg, n_layers, where),
        linear_num_key_heads=nk,
        linear_num_value_heads=nv,
        linear_key_head_dim=f.int("linear_key_head_dim", lo=1),
        linear_value_head_dim=f.int("linear_value_head_dim", lo=1),
        linear_conv_kernel=f.int("linear_conv_kernel_dim", 4, lo=1),
        attention_output_gate=True,
        norm_weight_offset=1.0,
    )


def _rows(ext: Extent, row_bytes: int, first: int, count: int) -> Extent:
    return Extent(ext.file, ext.offset + first * row_bytes, count * row_bytes)


def _float_rows(name: str, dtype: str, shape: tuple[int, ...], rows: int, where: Path) -> int:
    """Bytes of one row of a stored float matrix of `rows` rows, checked."""
    if dtype not in _ITEMSIZE:
        raise UnsupportedError(
            f"{where}: tensor {shown(name)} has dtype {dtype}; colibri reads Qwen3-Next's "
            f"F32, F16 and BF16 safetensors only"
        )
    if len(shape) != 2 or shape[0] != rows:
        raise ModelFormatError(
            f"{where}: tensor {shown(name)} has shape {tuple(shape)}, but the config implies "
            f"{rows} rows"
        )
    return shape[1] * _ITEMSIZE[dtype]


def _split(
    found: Mapping[str, tuple[str, tuple[int, ...], Extent]],
    files: Sequence[Path],
    cfg: ModelConfig,
    d: Path,
) -> tuple[dict[str, TensorInfo], frozenset[str], Path | None]:
    """The fused projections cut into the canonical tensors (extents into the stored
    bytes, so nothing is copied)."""
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    r = nv // nk  # value heads per key head
    out: dict[str, TensorInfo] = {}
    used: set[str] = set()
    for name, (dtype, shape, ext) in found.items():
        where = files[ext.file]
        if m := _QKVZ.fullmatch(name):
            rb = _float_rows(name, dtype, shape, nk * (2 * dk + 2 * r * dv), where)
            per = 2 * dk + 2 * r * dv
            q = [_rows(ext, rb, j * per, dk) for j in range(nk)]
            k = [_rows(ext, rb, j * per + dk, dk) for j in range(nk)]
            v = [_rows(ext, rb, j * per + 2 * dk, r * dv) for j in range(nk)]
            z = [_rows(ext, rb, j * per + 2 * dk + r * dv, r * dv) for j in range(nk)]
            b = f"blk.{m.group(1)}."
            out[b + "gdn_in_qkv"] = TensorInfo(b + "gdn_in_qkv", dtype,
                                               (2 * nk * dk + nv * dv, shape[1]),
                                               tuple(q + k + v))  # fmt: skip
            out[b + "gdn_in_z"] = TensorInfo(b + "gdn_in_z", dtype, (nv * dv, shape[1]), tuple(z))
        elif m := _BA.fullmatch(name):
            rb = _float_rows(name, dtype, shape, 2 * nv, where)
            b = f"blk.{m.group(1)}."
            for part, first in (("b", 0), ("a", r)):
                exts = tuple(_rows(ext, rb, j * 2 * r + first, r) for j in range(nk))
                out[b + "gdn_in_" + part] = TensorInfo(b + "gdn_in_" + part, dtype,
                                                       (nv, shape[1]), exts)  # fmt: skip
        elif m := _CONV.fullmatch(name):
            if len(shape) != 3 or shape[1] != 1:
                raise ModelFormatError(f"{where}: tensor {shown(name)} has shape {tuple(shape)}, "
                                       f"not (channels, 1, kernel)")  # fmt: skip
            _float_rows(name, dtype, (shape[0], shape[2]), shape[0], where)
            b = f"blk.{m.group(1)}."
            out[b + "gdn_conv"] = TensorInfo(b + "gdn_conv", dtype, (shape[0] * shape[2],), (ext,))
        elif m := _Q.fullmatch(name):
            hd, nh = cfg.head_dim, cfg.n_heads
            rb = _float_rows(name, dtype, shape, 2 * nh * hd, where)
            b = f"blk.{m.group(1)}."
            for part, first in (("attn_q", 0), ("attn_gate", hd)):
                exts = tuple(_rows(ext, rb, h * 2 * hd + first, hd) for h in range(nh))
                out[b + part] = TensorInfo(b + part, dtype, (nh * hd, shape[1]), exts)
        elif not name.startswith("mtp."):  # the released files' MTP layer: not run, as
            continue  # transformers' Qwen3NextForCausalLM ignores it (^mtp.*)
        used.add(name)
    return out, frozenset(used), None


def _text_tensor(name: str) -> str | None:
    """A multimodal Qwen3.5 checkpoint's tensor as its text model names it (None: the
    vision tower's, skipped)."""
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model.") :]
    return None if name.startswith("model.visual.") else name


FAMILY = Family(
    name="qwen3_next",
    archs=(ARCH, QWEN35),
    attention=("gqa",),
    routers=("softmax",),
    hf_model_types={"qwen3_next": ARCH, "qwen3_5_moe_text": QWEN35, "qwen3_5_moe": QWEN35},
    hf_arch_classes={
        "Qwen3NextForCausalLM": ARCH,
        "Qwen3_5MoeForCausalLM": QWEN35,
        "Qwen3_5MoeForConditionalGeneration": QWEN35,
    },
    hf_names=_NAMES,
    hf_config=_hf_config,
    gguf_architectures=tuple(GGUF_ARCHS),
    gguf_config=gguf_config,
    gguf_name=gguf_name,
    gguf_tensors=gguf_tensors,
    gguf_mtp_key=MTP_KEY,
    hf_experts=_split,
    hf_text_config="text_config",
    hf_rename=_text_tensor,
)
