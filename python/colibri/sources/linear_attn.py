"""The Gated DeltaNet linear-attention unit as data (csrc/model/linear_attn_gdn.hpp): its
config fields checked (:func:`check_linear_fields`) and the canonical tensors of one layer
(:func:`gdn_shapes`), for hybrid models (Qwen3-Next) whose ``linear_layers`` mark the
layers that run it instead of attention.

Per layer ``blk.{i}.``: ``gdn_in_qkv`` (q, k and v rows of every head, in the short
convolution's channel order), ``gdn_in_z`` (the output gate), ``gdn_in_b`` / ``gdn_in_a``
(one row per value head: the write strength beta and the decay input), ``gdn_conv``
(channels x kernel as one vector, so the loader widens it to F32), ``gdn_a_log`` and
``gdn_dt_bias`` (per value head), ``gdn_norm`` (the gated RMSNorm over a value head),
``gdn_out`` (back to the hidden size).
"""

from __future__ import annotations

from ..errors import ModelFormatError, UnsupportedError
from .fields import as_float, as_int, bad
from .manifest import ModelConfig


def gdn_shapes(cfg: ModelConfig, b: str) -> dict[str, tuple[int, ...]]:
    h = cfg.hidden_size
    nv = cfg.linear_num_value_heads
    kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    vd = nv * cfg.linear_value_head_dim
    return {
        b + "gdn_in_qkv": (2 * kd + vd, h), b + "gdn_in_z": (vd, h),
        b + "gdn_in_b": (nv, h), b + "gdn_in_a": (nv, h),
        b + "gdn_conv": ((2 * kd + vd) * cfg.linear_conv_kernel,),
        b + "gdn_a_log": (nv,), b + "gdn_dt_bias": (nv,),
        b + "gdn_norm": (cfg.linear_value_head_dim,), b + "gdn_out": (h, vd),
    }  # fmt: skip


def kda_shapes(cfg: ModelConfig, b: str) -> dict[str, tuple[int, ...]]:
    """Kimi Delta Attention's tensors of one layer (csrc/model/linear_attn_kda.hpp): the
    q/k/v and output projections under the attention names, ``kda_conv`` (the q, k and v
    channels x kernel as one vector), the low-rank decay (``kda_f_a``, ``kda_f_b``) and
    output gate (``kda_g_a``, ``kda_g_b``) projections, ``kda_a_log`` per head,
    ``kda_dt_bias`` per channel, ``kda_b`` (beta per head), ``kda_norm`` (over a head)."""
    h, d = cfg.hidden_size, cfg.linear_value_head_dim
    vd = cfg.linear_num_value_heads * d
    return {
        b + "attn_q": (vd, h), b + "attn_k": (vd, h), b + "attn_v": (vd, h),
        b + "kda_conv": (3 * vd * cfg.linear_conv_kernel,),
        b + "kda_f_a": (d, h), b + "kda_f_b": (vd, d),
        b + "kda_a_log": (cfg.linear_num_value_heads,), b + "kda_dt_bias": (vd,),
        b + "kda_b": (cfg.linear_num_value_heads, h),
        b + "kda_g_a": (d, h), b + "kda_g_b": (vd, d),
        b + "kda_norm": (d,), b + "attn_output": (h, vd),
    }  # fmt: skip


def linear_state_bytes(cfg: ModelConfig) -> int:
    """Bytes of one session's recurrent state over the linear layers (F32, whatever the KV
    cache type; the core's KvLayerLayout.state_floats): per layer the convolution's last
    ``linear_conv_kernel - 1`` inputs of every q/k/v channel and one (key dim x value dim)
    matrix per value head. Qwen3-Next-80B-A3B: 36 layers x (3 x 8192 + 32 x 128 x 128)
    floats, about 75 MiB, for any context length."""
    if not any(cfg.linear_layers):
        return 0
    nv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    channels = 2 * cfg.linear_num_key_heads * dk + nv * dv
    per_layer = (cfg.linear_conv_kernel - 1) * channels + nv * dk * dv
    return 4 * per_layer * sum(1 for i in range(cfg.n_layers) if cfg.is_linear(i))


def linear_work_floats(cfg: ModelConfig) -> int:
    """Per-token floats of the buffers the Gated DeltaNet adds to a forward
    (csrc/model/linear_attn_gdn.cpp: the q/k/v projection and its convolution, z and the
    heads' outputs, b and a; the convolution's few history rows left out), plus the
    attention output gate's (attention_output_gate); 0 for a model with neither."""
    gate = cfg.n_heads * cfg.head_dim if cfg.attention_output_gate else 0
    if not any(cfg.linear_layers):
        return gate
    nv, vd = cfg.linear_num_value_heads, cfg.linear_num_value_heads * cfg.linear_value_head_dim
    if cfg.linear_kda:  # linear_attn_kda.cpp: q/k/v, their convolution and projections, f_a, g_a
        return gate + 9 * vd + 2 * cfg.linear_value_head_dim + nv
    channels = 2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim + vd
    return gate + 2 * channels + 2 * vd + 2 * nv


def check_linear_fields(cfg: ModelConfig, where: object) -> None:
    """linear_layers one true/false per layer; when any is true, head counts and sizes > 0
    with the value heads a multiple of the key heads (each key head serves a group of
    value heads), a convolution width >= 1; GQA attention in the other layers. Also the
    attention output gate and the norm weight offset, whatever the family."""
    layers = cfg.linear_layers
    if not isinstance(layers, tuple) or not all(isinstance(x, bool) for x in layers):
        raise bad(where, "linear_layers", layers, "a list of true/false, one per layer")
    if layers and len(layers) != cfg.n_layers:
        raise ModelFormatError(
            f"{where}: linear_layers has {len(layers)} entries for {cfg.n_layers} layers"
        )
    if not isinstance(cfg.attention_output_gate, bool):
        raise bad(where, "attention_output_gate", cfg.attention_output_gate, "true or false")
    as_float(cfg.norm_weight_offset, "norm_weight_offset", where)
    for key in ("linear_a_neg_exp", "linear_v_tiled", "linear_kda"):
        if not isinstance(getattr(cfg, key), bool):
            raise bad(where, key, getattr(cfg, key), "true or false")
    # Typed whatever the layers are: the budget and the core's spec read them on any model.
    for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel"):  # fmt: skip
        as_int(getattr(cfg, key), key, where)
    if not any(layers):
        return
    if (cfg.is_mla and not cfg.linear_kda) or cfg.n_mtp_layers:
        raise UnsupportedError(f"{where}: Gated DeltaNet layers are implemented beside GQA "
                               f"attention only, and linear layers without MTP layers")  # fmt: skip
    nk = as_int(cfg.linear_num_key_heads, "linear_num_key_heads", where, lo=1)
    nv = as_int(cfg.linear_num_value_heads, "linear_num_value_heads", where, lo=1)
    as_int(cfg.linear_key_head_dim, "linear_key_head_dim", where, lo=1)
    as_int(cfg.linear_value_head_dim, "linear_value_head_dim", where, lo=1)
    as_int(cfg.linear_conv_kernel, "linear_conv_kernel", where, lo=1, hi=64)
    if nv % nk:
        raise ModelFormatError(f"{where}: linear_num_value_heads {nv} is not a multiple of "
                               f"linear_num_key_heads {nk}")  # fmt: skip
    if cfg.linear_kda and (nk != nv or cfg.linear_key_head_dim != cfg.linear_value_head_dim):
        raise ModelFormatError(f"{where}: Kimi Delta Attention needs as many key as value heads "
                               f"of one size")  # fmt: skip
