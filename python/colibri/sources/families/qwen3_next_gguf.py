"""Qwen3-Next and Qwen3.5-MoE as llama.cpp's converter writes them (general.architecture
``qwen3next`` / ``qwen35moe``; conversion/qwen.py), mapped to the tensors and ModelConfig
the Hugging Face path gives (qwen3_next.py), every transformation the converter applies
undone or told to the core:

* ``A_log`` is stored as ``ssm_a`` = -exp(A_log): the config's ``linear_a_neg_exp`` has
  the core use it as is (exact; a log here would round).
* The residual-stream norms and the QK-norms are stored as 1 + w (the converter adds the
  offset in F32, as transformers' forward does): ``norm_weight_offset`` 0. The linear
  layers' gated norm (``ssm_norm``) is stored as is.
* ``dt_bias`` is ``ssm_dt.bias``; ``conv1d`` (C, 1, K) squeezed to ``ssm_conv1d`` (C, K),
  read as one vector of C * K.
* Qwen3-Next's ``in_proj_qkvz`` is stored regrouped as ``attn_qkv`` (all q, all k, all v
  rows: the convolution's channel order) and ``attn_gate`` (z); its ``in_proj_ba`` as is
  (``ssm_ba``: per key head its b then its a rows), cut here through extents. Qwen3.5's
  separate projections are ``attn_qkv``, ``attn_gate``, ``ssm_beta``, ``ssm_alpha``.
* Qwen3.5 with fewer key than value heads: the converter reorders every value-head-indexed
  row, column and element (v, z, b, a, A_log, dt_bias, the convolution's v channels,
  ``ssm_out``'s columns) from grouped order (value head h reads key head h / (nv / nk)) to
  tiled order (key head h % nk); consistently, so only that pairing changes:
  ``linear_v_tiled``. Qwen3-Next files keep the grouped order.
* The attention layers' ``attn_q`` keeps q_proj's per-head query and gate rows (cut into
  ``attn_q`` / ``attn_gate`` as for the checkpoint); ``post_attention_norm`` is the FFN
  norm.
* Keys: ``ssm.group_count`` / ``ssm.time_step_rank`` (key / value heads),
  ``ssm.state_size`` (key head size), ``ssm.inner_size`` (value heads x value head size),
  ``ssm.conv_kernel``; the layer schedule ``attention.recurrent_layers`` (else every
  ``full_attention_interval``-th layer full). llama.cpp's graphs renormalize the top-k
  weights for both architectures. MTP layers (``nextn_predict_layers`` of
  ``block_count``) are dropped, as the checkpoint path skips ``mtp.*``.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import ModelFormatError, UnsupportedError
from ..manifest import Extent, ModelConfig, TensorInfo
from ..paths import shown
from .spec import GGUFInput, plain_gguf_name

GGUF_ARCHS = {"qwen3next": "qwen3_next", "qwen35moe": "qwen3_5_moe"}
MTP_KEY = "nextn_predict_layers"
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
# llama.cpp's name in a linear layer -> the canonical one.
_LINEAR = {
    "attn_qkv": "gdn_in_qkv", "attn_gate": "gdn_in_z", "ssm_beta": "gdn_in_b",
    "ssm_alpha": "gdn_in_a", "ssm_a": "gdn_a_log", "ssm_dt.bias": "gdn_dt_bias",
    "ssm_conv1d": "gdn_conv", "ssm_norm": "gdn_norm", "ssm_out": "gdn_out",
}  # fmt: skip


def gguf_name(arch: str, name: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """``.weight`` dropped, ``post_attention_norm`` as ``ffn_norm``; a shared-expert gate
    stored as a vector read as its one-row matrix. The linear layers' names are mapped
    with the config (:func:`gguf_tensors`)."""
    name, shape = plain_gguf_name(arch, name, shape)
    if name.endswith(".post_attention_norm"):
        return name[: -len("post_attention_norm")] + "ffn_norm", shape
    if name.endswith(".ffn_gate_inp_shexp") and len(shape) == 1:
        return name, (1, shape[0])
    return name, shape


def gguf_config(inp: GGUFInput) -> ModelConfig:
    a, meta, tensors, where = inp.arch, inp.meta, inp.tensors, inp.where
    arch = GGUF_ARCHS[a]
    n_layers = inp.base["n_layers"] - meta.int(f"{a}.{MTP_KEY}", 0, lo=0)
    if n_layers <= 0:
        raise ModelFormatError(f"{where}: {a}.block_count leaves no trunk layers")
    moe_layers = tuple(f"blk.{i}.ffn_gate_inp" in tensors for i in range(n_layers))
    first_moe = next((i for i, m in enumerate(moe_layers) if m), None)
    if first_moe is None:
        raise ModelFormatError(f"{where}: a {a} model without router tensors (ffn_gate_inp)")
    first_dense = next((i for i, m in enumerate(moe_layers) if not m), None)
    shexp = tensors.get(f"blk.{first_moe}.ffn_gate_shexp")
    head_dim = meta.int(f"{a}.attention.key_length", lo=1)
    if meta.int(f"{a}.attention.value_length", head_dim) != head_dim:
        raise UnsupportedError(f"{where}: key and value head sizes differ")
    nk, nv = meta.int(f"{a}.ssm.group_count", lo=1), meta.int(f"{a}.ssm.time_step_rank", lo=1)
    dk, inner = meta.int(f"{a}.ssm.state_size", lo=1), meta.int(f"{a}.ssm.inner_size", lo=1)
    if inner % nv or nv % nk:
        raise ModelFormatError(f"{where}: {a}.ssm.inner_size {inner}, time_step_rank {nv}, "
                               f"group_count {nk}: not whole value and key heads")  # fmt: skip
    dense = tensors.get(f"blk.{first_dense}.ffn_gate") if first_dense is not None else None
    return ModelConfig(
        **{**inp.base, "n_layers": n_layers},
        arch=arch,
        head_dim=head_dim,
        intermediate_size=dense.shape[0] if dense is not None else 0,
        qk_norm="head",
        rotary_dim=meta.int(f"{a}.rope.dimension_count", head_dim, lo=0),
        n_experts=meta.int(f"{a}.expert_count", lo=1),
        n_experts_per_tok=meta.int(f"{a}.expert_used_count", lo=1),
        moe_intermediate_size=tensors[f"blk.{first_moe}.ffn_gate_exps.0"].shape[0],
        norm_topk_prob=True,  # llama.cpp's qwen3next / qwen35moe graphs hard-code it
        shared_expert_intermediate_size=shexp.shape[0] if shexp is not None else 0,
        moe_layers=moe_layers,
        linear_layers=_schedule(inp, n_layers),
        linear_num_key_heads=nk,
        linear_num_value_heads=nv,
        linear_key_head_dim=dk,
        linear_value_head_dim=inner // nv,
        linear_conv_kernel=meta.int(f"{a}.ssm.conv_kernel", lo=1),
        attention_output_gate=True,
        norm_weight_offset=0.0,  # stored as 1 + w
        linear_a_neg_exp=True,
        linear_v_tiled=arch == "qwen3_5_moe" and nk != nv,
    )


def _schedule(inp: GGUFInput, n_layers: int) -> tuple[bool, ...]:
    a, meta = inp.arch, inp.meta
    flags = meta.md.get(f"{a}.attention.recurrent_layers")
    if flags is None:
        every = meta.int(f"{a}.full_attention_interval", 4, lo=1)
        return tuple(bool((i + 1) % every) for i in range(n_layers))
    blocks = inp.base["n_layers"]  # block_count, MTP layers included
    if not isinstance(flags, list) or len(flags) != blocks or any(
        not isinstance(f, bool) for f in flags
    ):  # fmt: skip
        raise ModelFormatError(f"{inp.where}: {a}.attention.recurrent_layers must be "
                               f"{blocks} true/false values")  # fmt: skip
    return tuple(flags[:n_layers])


def _rows(t: TensorInfo, first: int, count: int, where: Path) -> Extent:
    """`count` rows of a one-extent matrix from row `first` (GGML blocks never span
    rows, so any weight type cuts by rows)."""
    (ext,) = t.extents
    rb = ext.length // t.shape[0]
    if rb * t.shape[0] != ext.length:
        raise ModelFormatError(f"{where}: tensor {shown(t.name)} does not split into rows")
    return Extent(ext.file, ext.offset + first * rb, count * rb)


def _expect(t: TensorInfo, shape: tuple[int, ...], gguf: str, what: str, where: Path) -> None:
    if t.shape != shape:
        raise ModelFormatError(f"{where}: tensor {shown(gguf)} has shape {t.shape}, but "
                               f"{what} implies {shape}")  # fmt: skip


def gguf_tensors(
    tensors: dict[str, TensorInfo], cfg: ModelConfig, where: Path
) -> dict[str, TensorInfo]:
    """The file's tensors cut and named as the core reads them: linear layers' ssm_* and
    fused projections, the attention layers' q/gate rows; MTP layers dropped."""
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    r, hd, nh = nv // nk, cfg.head_dim, cfg.n_heads
    out: dict[str, TensorInfo] = {}
    for name, t in tensors.items():
        m = _LAYER.match(name)
        if m is None:
            out[name] = t
            continue
        layer, part = int(m.group(1)), m.group(2)
        b = f"blk.{layer}."
        if layer >= cfg.n_layers:  # an MTP layer: not run
            continue
        if cfg.is_linear(layer) and part in _LINEAR:
            canon = b + _LINEAR[part]
            if part == "ssm_conv1d":
                k = cfg.linear_conv_kernel
                if len(t.shape) != 2 or t.shape[1] != k:
                    raise ModelFormatError(
                        f"{where}: tensor {shown(name + '.weight')} has shape {t.shape}, but "
                        f"the convolution is {k} wide (ssm.conv_kernel)"
                    )
                out[canon] = TensorInfo(canon, t.dtype, (t.shape[0] * k,), t.extents)
            else:
                out[canon] = TensorInfo(canon, t.dtype, t.shape, t.extents)
        elif cfg.is_linear(layer) and part == "ssm_ba":  # per key head: r b rows, r a rows
            _expect(t, (2 * nv, cfg.hidden_size), name, "ssm.time_step_rank", where)
            for p, first in (("gdn_in_b", 0), ("gdn_in_a", r)):
                exts = tuple(_rows(t, j * 2 * r + first, r, where) for j in range(nk))
                out[b + p] = TensorInfo(b + p, t.dtype, (nv, t.shape[1]), exts)
        elif not cfg.is_linear(layer) and part == "attn_q":  # per head: query then gate rows
            _expect(t, (2 * nh * hd, cfg.hidden_size), name, "attention.head_count", where)
            for p, first in (("attn_q", 0), ("attn_gate", hd)):
                exts = tuple(_rows(t, h * 2 * hd + first, hd, where) for h in range(nh))
                out[b + p] = TensorInfo(b + p, t.dtype, (nh * hd, t.shape[1]), exts)
        else:
            out[name] = t
    for i in range(cfg.n_layers):
        if not cfg.is_linear(i):
            continue
        ba = f"blk.{i}.gdn_in_b" in out and f"blk.{i}.gdn_in_a" in out
        for part, canon in _LINEAR.items():
            if f"blk.{i}.{canon}" in out or (ba and part in ("ssm_beta", "ssm_alpha")):
                continue
            if part in ("ssm_beta", "ssm_alpha") and cfg.arch == "qwen3_next":
                part = "ssm_ba"  # Qwen3-Next stores them fused
            raise ModelFormatError(f"{where}: tensor {shown(f'blk.{i}.{part}')} of "
                                   f"linear-attention layer {i} is missing")  # fmt: skip
    return out
