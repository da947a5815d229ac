"""The canonical tensors of each unit the core implements (csrc/model/): grouped-query or
latent (MLA) attention, the DSA indexer, a dense or routed (MoE) FFN, multi-token-prediction
layers. A config selects units by its fields (``attention``, ``qk_norm``,
``attention_bias``, ``attention_sinks``, ``attention_out_bias``, ``moe_layers``,
``shared_expert_*``, ``router_bias``, ``index_*``, ``n_mtp_layers``), whatever its family,
and :func:`expected_shapes` lists the tensors they need; validate.order_and_check holds a
model to them. A family that needs a new unit adds its tensors here (and the unit to the
core); one built from these units adds nothing.

Also here: how MLA's ``kv_b_proj`` of a Hugging Face checkpoint becomes the absorbed
``attn_k_b`` / ``attn_v_b`` (:func:`split_kv_b`).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelFormatError
from .linear_attn import gdn_shapes, kda_shapes
from .manifest import Extent, ModelConfig
from .v4_units import hc_shapes, v4_attention_shapes


def _gqa_shapes(cfg: ModelConfig, b: str, layer: int) -> dict[str, tuple[int, ...]]:
    h, hd, vd, nkv = cfg.hidden_size, cfg.head_dim, cfg.gqa_value_dim, cfg.kv_heads(layer)
    q_rows, kv_rows, v_rows, o_cols = cfg.n_heads * hd, nkv * hd, nkv * vd, cfg.n_heads * vd
    out: dict[str, tuple[int, ...]] = {
        b + "attn_q": (q_rows, h), b + "attn_k": (kv_rows, h), b + "attn_v": (v_rows, h),
    }
    if cfg.attention_bias:
        out[b + "attn_q.bias"] = (q_rows,)
        out[b + "attn_k.bias"] = (kv_rows,)
        out[b + "attn_v.bias"] = (v_rows,)
    if cfg.attention_output_gate:
        out[b + "attn_gate"] = (o_cols, h)
    out[b + "attn_output"] = (h, o_cols)
    if cfg.attention_out_bias:
        out[b + "attn_output.bias"] = (h,)
    if cfg.has_sinks(layer):
        out[b + "attn_sinks"] = (cfg.n_heads,)
    if cfg.qk_norm == "head":
        out[b + "attn_q_norm"] = (hd,)
        out[b + "attn_k_norm"] = (hd,)
    elif cfg.qk_norm == "full":
        out[b + "attn_q_norm"] = (q_rows,)
        out[b + "attn_k_norm"] = (kv_rows,)
    return out


def _mla_shapes(cfg: ModelConfig, b: str, indexer: bool) -> dict[str, tuple[int, ...]]:
    h, nh = cfg.hidden_size, cfg.n_heads
    qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    out: dict[str, tuple[int, ...]] = {}
    if cfg.q_lora_rank:
        out[b + "attn_q_a"] = (cfg.q_lora_rank, h)
        out[b + "attn_q_a_norm"] = (cfg.q_lora_rank,)
        out[b + "attn_q_b"] = (nh * qk, cfg.q_lora_rank)
    else:
        out[b + "attn_q"] = (nh * qk, h)
    out[b + "attn_kv_a_mqa"] = (cfg.kv_lora_rank + cfg.qk_rope_head_dim, h)
    out[b + "attn_kv_a_norm"] = (cfg.kv_lora_rank,)
    out[b + "attn_k_b"] = (nh * cfg.kv_lora_rank, cfg.qk_nope_head_dim)
    out[b + "attn_v_b"] = (nh * cfg.v_head_dim, cfg.kv_lora_rank)
    out[b + "attn_output"] = (h, nh * cfg.v_head_dim)
    if indexer:
        ih, idim = cfg.index_n_heads, cfg.index_head_dim
        out[b + "indexer.attn_q_b"] = (ih * idim, cfg.q_lora_rank)
        out[b + "indexer.attn_k"] = (idim, h)
        out[b + "indexer.k_norm"] = (idim,)
        out[b + "indexer.k_norm.bias"] = (idim,)
        out[b + "indexer.proj"] = (ih, h)
    return out


def _moe_shapes(cfg: ModelConfig, b: str) -> dict[str, tuple[int, ...]]:
    h, f = cfg.hidden_size, cfg.moe_intermediate_size
    out: dict[str, tuple[int, ...]] = {b + "ffn_gate_inp": (cfg.n_experts, h)}
    if cfg.router_bias:
        out[b + "exp_probs_b"] = (cfg.n_experts,)
    if cfg.router_logit_bias:
        out[b + "ffn_gate_inp.bias"] = (cfg.n_experts,)
    if cfg.expert_bias:
        out[b + "ffn_gate_exps.bias"] = (cfg.n_experts, f)
        out[b + "ffn_up_exps.bias"] = (cfg.n_experts, f)
        out[b + "ffn_down_exps.bias"] = (cfg.n_experts, h)
    for e in range(cfg.n_experts):
        out[f"{b}ffn_gate_exps.{e}"] = (f, h)
        out[f"{b}ffn_up_exps.{e}"] = (f, h)
        out[f"{b}ffn_down_exps.{e}"] = (h, f)
    s = cfg.shared_expert_intermediate_size
    if s:
        if cfg.shared_expert_gated:
            out[b + "ffn_gate_inp_shexp"] = (1, h)
        out[b + "ffn_gate_shexp"] = (s, h)
        out[b + "ffn_up_shexp"] = (s, h)
        out[b + "ffn_down_shexp"] = (h, s)
    return out


def is_full_indexer_layer(cfg: ModelConfig, layer: int) -> bool:
    """True when the layer runs its own DSA indexer (MTP layers always do: the
    multi-token-prediction pass has no earlier layer to share a selection with)."""
    if not cfg.has_indexer:
        return False
    types = cfg.indexer_types
    return layer >= cfg.n_layers or not types or types[layer] == "full"


# nextn tensors of a multi-token-prediction layer: required, then optional copies of the
# embedding and head (transformers ties them to the main model's and ignores these).
MTP_REQUIRED = ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm")
MTP_OPTIONAL = ("nextn.embed_tokens", "nextn.shared_head_head")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the config implies, in canonical order, with its PyTorch-order shape.
    (Optional tensors, MTP_OPTIONAL, are checked by order_and_check when present.)"""
    h = cfg.hidden_size
    out: dict[str, tuple[int, ...]] = {"token_embd": (cfg.vocab_size, h)}
    for i in range(cfg.n_layers + cfg.n_mtp_layers):
        b = f"blk.{i}."
        mtp = i >= cfg.n_layers
        out[b + "attn_norm"] = (h,)
        if cfg.is_linear(i):
            out.update(kda_shapes(cfg, b) if cfg.linear_kda else gdn_shapes(cfg, b))
        elif cfg.is_mla:
            out.update(_mla_shapes(cfg, b, is_full_indexer_layer(cfg, i)))
        elif cfg.attention == "v4_sliding":
            out.update(v4_attention_shapes(cfg, b))
        else:
            out.update(_gqa_shapes(cfg, b, i))
        out[b + "ffn_norm"] = (h,)
        moe = mtp or (bool(cfg.moe_layers) and cfg.moe_layers[i])
        if moe:
            out.update(_moe_shapes(cfg, b))
            if cfg.hash_layers and cfg.hash_layers[i]:  # chosen by the table: no selection bias
                out.pop(b + "exp_probs_b", None)
                out[b + "ffn_hash_eid"] = (cfg.vocab_size, cfg.n_experts_per_tok)
        else:
            f = cfg.intermediate_size
            out[b + "ffn_gate"] = (f, h)
            out[b + "ffn_up"] = (f, h)
            out[b + "ffn_down"] = (h, f)
        out.update(hc_shapes(cfg, b))
        if mtp:
            out[b + "nextn.eh_proj"] = (h, 2 * h)
            for n in MTP_REQUIRED[1:]:
                out[b + n] = (h,)
    out["output_norm"] = (h,)
    out.update(hc_shapes(cfg, "output_", head=True))
    if not cfg.tie_word_embeddings:
        out["output"] = (cfg.vocab_size, h)
    return out


def optional_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Tensors a model may carry or not: MTP layers' copies of the embedding and head."""
    out: dict[str, tuple[int, ...]] = {}
    for i in range(cfg.n_layers, cfg.n_layers + cfg.n_mtp_layers):
        for n in MTP_OPTIONAL:
            out[f"blk.{i}.{n}"] = (cfg.vocab_size, cfg.hidden_size)
    return out


# Tensors a source may carry beyond what the config implies (kept in the manifest).
OPTIONAL_SHAPES = {"rope_freqs"}


def split_kv_b(
    layer: str, dtype: str, shape: tuple[int, ...], ext: Extent, cfg: ModelConfig, itemsize: int,
    where: Path,
) -> tuple[tuple[str, tuple[int, int], tuple[Extent, ...], tuple[int, ...]],
           tuple[str, tuple[int, int], tuple[Extent, ...], tuple[int, ...]]]:  # fmt: skip
    """``kv_b_proj`` [heads * (nope + v), kv_lora] -> (name, shape, extents, first source
    row of each extent) of ``attn_k_b`` (each head's nope rows; the core transposes each
    head's block) and of ``attn_v_b`` (each head's v rows)."""
    nh, nope, v, r = cfg.n_heads, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if tuple(shape) != (nh * (nope + v), r):
        raise ModelFormatError(
            f"{where}: kv_b_proj of layer {layer} has shape {tuple(shape)}, but the config "
            f"implies {(nh * (nope + v), r)}"
        )
    row = r * itemsize
    k_ext, v_ext, k_rows, v_rows = [], [], [], []
    for h in range(nh):
        base = h * (nope + v)
        k_ext.append(Extent(ext.file, ext.offset + base * row, nope * row))
        v_ext.append(Extent(ext.file, ext.offset + (base + nope) * row, v * row))
        k_rows.append(base)
        v_rows.append(base + nope)
    return (
        (f"blk.{layer}.attn_k_b", (nh * r, nope), tuple(k_ext), tuple(k_rows)),
        (f"blk.{layer}.attn_v_b", (nh * v, r), tuple(v_ext), tuple(v_rows)),
    )
