"""Tiny random DeepSeek-V4 checkpoints (transformers' DeepseekV4ForCausalLM, float32) for
the oracle tests: 3 layers, all ``sliding_attention`` (a 5-position window, shorter than
the prompts), the first MoE layer hash-routed (``tid2eid``) and the others routed by
sqrt-softplus scores with a correction bias that changes some choices; 4 query heads of
16 dimensions with the trailing 8 rotated, one shared key-value head, a q-LoRA of 24, two
output groups of rank 12; 8 experts top-2 and one shared expert with a SwiGLU clamp low
enough to bite; hyper-connections of ``hc_mult`` streams and several Sinkhorn iterations.
Every norm weight, sink, hyper-connection parameter and the bias set to non-trivial
values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

VOCAB = 128
N_LAYERS = 3


def deepseek_v4_config(**over: Any) -> transformers.DeepseekV4Config:
    args: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=N_LAYERS,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, q_lora_rank=24,
        qk_rope_head_dim=8, num_experts_per_tok=2, n_routed_experts=8, n_shared_experts=1,
        layer_types=["sliding_attention"] * N_LAYERS,
        mlp_layer_types=["hash_moe"] + ["moe"] * (N_LAYERS - 1),
        hc_mult=3, hc_sinkhorn_iters=5, sliding_window=5, o_groups=2, o_lora_rank=12,
        swiglu_limit=1.0, routed_scaling_factor=1.5, scoring_func="sqrtsoftplus",
        max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    args.update(over)
    return transformers.DeepseekV4Config(**args)


@torch.no_grad()
def build_deepseek_v4(out: Path, *, seed: int = 0, **over: Any) -> tuple[Path, torch.nn.Module]:
    """Write the checkpoint to ``out`` (save_pretrained) and return it with the model."""
    torch.manual_seed(seed)
    model = transformers.DeepseekV4ForCausalLM(deepseek_v4_config(**over)).float().eval()
    for name, p in model.named_parameters():
        if name.endswith(("norm.weight", "hc.scale", "hc_scale")):
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        elif name.endswith(("hc.base", "hc_base", "sinks")):
            p.normal_(0.0, 0.5)
        elif name.endswith("embed_tokens.weight"):
            p.normal_(0.0, 1.0)
        elif "experts" in name and p.ndim == 3:  # [E, out, in]
            p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
        else:
            p.normal_(0.0, 0.15)
    k, n_exp = model.config.num_experts_per_tok, model.config.n_routed_experts
    for layer in model.model.layers:  # buffers, not parameters
        gate = layer.mlp.gate
        if layer.mlp.is_hash:
            gate.tid2eid.copy_(torch.stack([torch.randperm(n_exp)[:k] for _ in range(VOCAB)]))
        else:
            gate.e_score_correction_bias.normal_(0.0, 0.3)
    model.save_pretrained(out, safe_serialization=True)
    model.requires_grad_(False)
    return out, model


@torch.no_grad()
def clamp_and_bias_bite(model: torch.nn.Module, ids: list[int]) -> tuple[int, int]:
    """Over one forward of ``ids``: (how many gate / up pre-activations of the routed and
    shared experts the SwiGLU clamp changes, how many routing choices the correction bias
    changes)."""
    limit = model.config.swiglu_limit
    clamped, changed = 0, 0
    seen: list[tuple[torch.nn.Module, torch.Tensor]] = []
    hooks = [layer.mlp.register_forward_pre_hook(
        lambda mod, args: seen.append((mod, args[0].reshape(-1, args[0].shape[-1]))))
        for layer in model.model.layers]  # fmt: skip
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    k = model.config.num_experts_per_tok
    for mod, x in seen:
        sh = mod.shared_experts
        for pre, lo in ((sh.gate_proj(x), False), (sh.up_proj(x), True)):
            clamped += int((pre > limit).sum()) + (int((pre < -limit).sum()) if lo else 0)
        if not mod.is_hash:
            score = mod.gate.score_fn(x @ mod.gate.weight.T)
            plain = score.topk(k, dim=-1).indices.sort(dim=-1).values
            biased = (score + mod.gate.e_score_correction_bias).topk(k, dim=-1).indices
            changed += int((plain != biased.sort(dim=-1).values).any(dim=-1).sum())
    return clamped, changed


# A model with every V4 layer type: sliding, compressed sparse (rate 4: overlapping
# compressor + lightning indexer keeping 3 of the closed entries) and heavily compressed
# (rate 8), under a 48-token prompt: 12 CSA windows and 6 HCA windows close in it.
COMPRESSED_LAYERS = ["sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention", "compressed_sparse_attention"]  # fmt: skip
COMPRESSED = dict(
    num_hidden_layers=len(COMPRESSED_LAYERS), layer_types=COMPRESSED_LAYERS,
    mlp_layer_types=["hash_moe"] + ["moe"] * (len(COMPRESSED_LAYERS) - 1),
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
    index_n_heads=8, index_head_dim=16, index_topk=3, max_position_embeddings=256,
)  # fmt: skip


@torch.no_grad()
def indexer_margins(model: torch.nn.Module, ids: list[int]) -> list[float]:
    """Per CSA layer, over one forward of ``ids``: the smallest gap between the last score
    the lightning indexer keeps and the first it drops, over the queries that have more
    closed entries than index_topk (0 when none has: the selection never acts)."""
    cfg = model.config
    rate, k = cfg.compress_rates["compressed_sparse_attention"], cfg.index_topk
    scores: list[torch.Tensor] = []
    indexers = [layer.self_attn.compressor.indexer for layer in model.model.layers
                if hasattr(layer.self_attn.compressor, "indexer")]  # fmt: skip
    hooks = [ix.scorer.register_forward_hook(lambda mod, args, out: scores.append(out[0]))
             for ix in indexers]  # fmt: skip
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    margins = []
    for s in scores:  # [S, T]
        gap = float("inf")
        for t in range(s.shape[0]):
            closed = (t + 1) // rate
            if closed > k:
                top = s[t, :closed].sort(descending=True).values
                gap = min(gap, float(top[k - 1] - top[k]))
        margins.append(0.0 if gap == float("inf") else gap)
    return margins
