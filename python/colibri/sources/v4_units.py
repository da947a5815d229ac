"""DeepSeek-V4's units as canonical tensors and config checks (the core's
csrc/model/attn_v4.cpp, hyper_conn.cpp and the hash routing in ffn_block.cpp).

===============================  ============================================================
name                             shape
===============================  ============================================================
blk.{i}.attn_q_a                 (q_lora, hidden)
blk.{i}.attn_q_a_norm            (q_lora,)
blk.{i}.attn_q_b                 (heads*head_dim, q_lora)
blk.{i}.attn_kv                  (head_dim, hidden)          the one shared key-value head
blk.{i}.attn_kv_norm             (head_dim,)
blk.{i}.attn_output_a            (groups*o_lora, heads*head_dim/groups)   grouped projection
blk.{i}.attn_output_b            (hidden, groups*o_lora)
blk.{i}.attn_sinks               (heads,)
blk.{i}.attn_compressor_kv       (w, hidden)    compressed layers (rate m): w = head_dim,
blk.{i}.attn_compressor_gate     (w, hidden)    2 x head_dim on CSA layers (overlapping)
blk.{i}.attn_compressor_ape      (m, w)         the position bias of a window's slots
blk.{i}.attn_compressor_norm     (head_dim,)
blk.{i}.indexer_compressor_*     as above at index_head_dim (CSA: the indexer's keys)
blk.{i}.indexer.attn_q_b         (index_heads*index_head_dim, q_lora)
blk.{i}.indexer.proj             (index_heads, hidden)       the indexer's head weights
blk.{i}.hc_attn_fn / hc_ffn_fn   ((2+hc)*hc, hc*hidden)      hyper-connections (hc_mult > 0)
blk.{i}.hc_attn_base / _ffn_     ((2+hc)*hc,)
blk.{i}.hc_attn_scale / _ffn_    (3,)
output_hc_fn / _base / _scale    (hc, hc*hidden), (hc,), (1,)   the hyper head
blk.{i}.ffn_hash_eid             (vocab, top_k)              hash layers: expert ids (F32)
===============================  ============================================================
"""

from __future__ import annotations

from ..errors import ModelFormatError, UnsupportedError
from .fields import as_float, as_int, bad
from .manifest import ModelConfig

V4_ROUTERS = ("sqrt_softplus", "sigmoid_grouped")


def v4_attention_shapes(cfg: ModelConfig, b: str) -> dict[str, tuple[int, ...]]:
    h, qd, q_lora = cfg.hidden_size, cfg.n_heads * cfg.head_dim, cfg.q_lora_rank
    groups, rank = max(cfg.o_groups, 1), cfg.o_lora_rank
    out = {
        b + "attn_q_a": (q_lora, h), b + "attn_q_a_norm": (q_lora,),
        b + "attn_q_b": (qd, q_lora), b + "attn_kv": (cfg.head_dim, h),
        b + "attn_kv_norm": (cfg.head_dim,), b + "attn_output_a": (groups * rank, qd // groups),
        b + "attn_output_b": (h, groups * rank), b + "attn_sinks": (cfg.n_heads,),
    }  # fmt: skip
    layer = int(b.split(".")[1])
    rate = cfg.compress_ratios[layer] if layer < len(cfg.compress_ratios) else 0
    if rate:
        csa = layer < len(cfg.csa_layers) and cfg.csa_layers[layer]
        out.update(_compressor_shapes(b + "attn_compressor_", cfg.head_dim, rate, csa, h))
        if csa:
            ih, idim = cfg.index_n_heads, cfg.index_head_dim
            out.update(_compressor_shapes(b + "indexer_compressor_", idim, rate, True, h))
            out[b + "indexer.attn_q_b"] = (ih * idim, q_lora)
            out[b + "indexer.proj"] = (ih, h)
    return out


def _compressor_shapes(p: str, dim: int, rate: int, overlap: bool,
                       hidden: int) -> dict[str, tuple[int, ...]]:
    w = 2 * dim if overlap else dim
    return {p + "kv": (w, hidden), p + "gate": (w, hidden), p + "ape": (rate, w),
            p + "norm": (dim,)}  # fmt: skip


def v4_compressed_state_bytes(cfg: ModelConfig, context_length: int) -> int:
    """Bytes of one session's compressed-layer state (F32 whatever the KV cache type; the
    core's KvLayerLayout comp_rate / comp_floats, csrc/model/attn_v4_compressed.hpp): per
    layer its compressors' pending projections (2 x width values for each of the last
    window's positions, the last two windows' when overlapping) and one entry per
    ``rate`` positions of the context (head_dim values, + index_head_dim on CSA layers)."""
    total = 0
    for i, rate in enumerate(cfg.compress_ratios):
        if not rate:
            continue
        csa = i < len(cfg.csa_layers) and cfg.csa_layers[i]
        dims = [cfg.head_dim] + ([cfg.index_head_dim] if csa else [])
        slots = 2 * rate if csa else rate
        pending = sum(slots * 2 * (2 * d if csa else d) for d in dims)
        total += pending + -(-context_length // rate) * sum(dims)
    return 4 * total


def hc_shapes(cfg: ModelConfig, b: str, *, head: bool = False) -> dict[str, tuple[int, ...]]:
    """A layer's two hyper-connections (``b`` its prefix), or the hyper head; none without
    hyper-connections."""
    hc, h = cfg.hc_mult, cfg.hidden_size
    if hc <= 0:
        return {}
    if head:
        return {b + "hc_fn": (hc, hc * h), b + "hc_base": (hc,), b + "hc_scale": (1,)}
    rows = (2 + hc) * hc
    out: dict[str, tuple[int, ...]] = {}
    for block in ("attn", "ffn"):
        out.update({f"{b}hc_{block}_fn": (rows, hc * h), f"{b}hc_{block}_base": (rows,),
                    f"{b}hc_{block}_scale": (3,)})  # fmt: skip
    return out


def check_v4_fields(cfg: ModelConfig, where: object) -> None:
    """The V4 fields as data: hyper-connections, hash layers and the grouped output
    projection only with V4 attention, and there consistent with the heads and layers."""
    hc = as_int(cfg.hc_mult, "hc_mult", where, lo=0, hi=64)
    layers = cfg.hash_layers
    if not isinstance(layers, tuple) or not all(isinstance(x, bool) for x in layers):
        raise bad(where, "hash_layers", layers, "a list of true/false, one per layer")
    if cfg.attention != "v4_sliding":
        if hc or any(layers) or cfg.o_groups or cfg.o_lora_rank or any(cfg.compress_ratios):
            raise UnsupportedError(f"{where}: hyper-connections, hash routing, compressed "
                                   f"layers and the grouped output projection are "
                                   f"implemented for DeepSeek-V4 "
                                   f"attention only")  # fmt: skip
        return
    if hc < 1:
        raise bad(where, "hc_mult", hc, ">= 1 (DeepSeek-V4 always has hyper-connections)")
    as_int(cfg.hc_sinkhorn_iters, "hc_sinkhorn_iters", where, lo=1, hi=1000)
    as_float(cfg.hc_eps, "hc_eps", where, lo=0.0)
    as_int(cfg.q_lora_rank, "q_lora_rank", where, lo=1)
    groups = as_int(cfg.o_groups, "o_groups", where, lo=1)
    as_int(cfg.o_lora_rank, "o_lora_rank", where, lo=1)
    if (cfg.n_heads * cfg.head_dim) % groups:
        raise bad(where, "o_groups", groups, f"a divisor of n_heads x head_dim "
                                             f"({cfg.n_heads * cfg.head_dim})")  # fmt: skip
    if cfg.n_kv_heads != 1:
        raise bad(where, "n_kv_heads", cfg.n_kv_heads, "1 (V4 shares one key-value head)")
    rope = as_int(cfg.qk_rope_head_dim, "qk_rope_head_dim", where, lo=2, hi=cfg.head_dim)
    if rope % 2 or cfg.rotary_dim != rope:
        raise bad(where, "qk_rope_head_dim", rope, "even, and the rotary dimension (rotary_dim)")
    if cfg.router not in V4_ROUTERS:
        raise UnsupportedError(f"{where}: DeepSeek-V4 with the {cfg.router} router is not "
                               f"implemented ({', '.join(V4_ROUTERS)})")  # fmt: skip
    if layers and len(layers) != cfg.n_layers:
        raise ModelFormatError(f"{where}: hash_layers has {len(layers)} entries for "
                               f"{cfg.n_layers} layers")  # fmt: skip
    for i, hashed in enumerate(layers):
        if hashed and not (cfg.moe_layers and cfg.moe_layers[i]):
            raise ModelFormatError(f"{where}: layer {i} routes by hash but is not a MoE layer")
    if cfg.n_mtp_layers:
        raise UnsupportedError(f"{where}: DeepSeek-V4's multi-token-prediction layers are not "
                               f"implemented")  # fmt: skip
    _check_compressed(cfg, where)


def _check_compressed(cfg: ModelConfig, where: object) -> None:
    ratios, csa = cfg.compress_ratios, cfg.csa_layers
    if not isinstance(ratios, tuple) or (ratios and len(ratios) != cfg.n_layers):
        raise bad(where, "compress_ratios", ratios, f"a list of {cfg.n_layers} rates")
    if not isinstance(csa, tuple) or (csa and len(csa) != cfg.n_layers) or \
            not all(isinstance(x, bool) for x in csa):  # fmt: skip
        raise bad(where, "csa_layers", csa, f"a list of {cfg.n_layers} true/false")
    for i, r in enumerate(ratios):
        as_int(r, f"compress_ratios[{i}]", where, lo=0, hi=1 << 20)
        if csa and csa[i] and not r:
            raise ModelFormatError(f"{where}: layer {i} is compressed sparse attention without a "
                                   f"compression rate")  # fmt: skip
    if not any(ratios):
        return
    # (compress_rope_scaling: validate.check_rope_scaling, as the main RoPE's)
    as_float(cfg.compress_rope_theta, "compress_rope_theta", where, lo=0.0, lo_open=True)
    if any(csa):
        as_int(cfg.index_n_heads, "index_n_heads", where, lo=1)
        as_int(cfg.index_head_dim, "index_head_dim", where, lo=max(cfg.qk_rope_head_dim, 1))
        as_int(cfg.index_topk, "index_topk", where, lo=1, hi=1 << 30)
