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
    return {
        b + "attn_q_a": (q_lora, h), b + "attn_q_a_norm": (q_lora,),
        b + "attn_q_b": (qd, q_lora), b + "attn_kv": (cfg.head_dim, h),
        b + "attn_kv_norm": (cfg.head_dim,), b + "attn_output_a": (groups * rank, qd // groups),
        b + "attn_output_b": (h, groups * rank), b + "attn_sinks": (cfg.n_heads,),
    }  # fmt: skip


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
        if hc or any(layers) or cfg.o_groups or cfg.o_lora_rank:
            raise UnsupportedError(f"{where}: hyper-connections, hash routing and the grouped "
                                   f"output projection are implemented for DeepSeek-V4 "
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
