"""Tiny random MiMo-V2-Flash checkpoints (transformers' MiMoV2FlashForCausalLM, float32)
for the oracle tests: 4 layers (full, sliding, sliding, full; a dense first FFN, then MoE),
4 query heads of 16 dimensions with 8-wide values, 1 KV head in the full layers and 2 in
the sliding ones (window 5), partial RoPE (8 of 16 dimensions) with a different base per
layer type, q/k/v biases, sinks on the sliding layers, a value scale of 0.6, and 8 experts
in 2 groups, top-2 routed by sigmoid scores with a correction bias. Every norm weight, sink
and bias is set to non-trivial values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

VOCAB = 128
WINDOW = 5
LAYER_TYPES = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]


def mimo_config(**over: Any) -> transformers.MiMoV2FlashConfig:
    args: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        v_head_dim=8, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        max_position_embeddings=64, sliding_window=WINDOW, layer_types=LAYER_TYPES,
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"], attention_bias=True,
        attention_value_scale=0.6, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 5e6,
                               "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                  "partial_rotary_factor": 0.5},
        },
    )  # fmt: skip
    args.update(over)
    return transformers.MiMoV2FlashConfig(**args)


@torch.no_grad()
def build_mimo(out: Path, *, seed: int = 0, **over: Any) -> tuple[Path, torch.nn.Module]:
    """Write the checkpoint to ``out`` (save_pretrained) and return it with the model."""
    torch.manual_seed(seed)
    model = transformers.MiMoV2FlashForCausalLM(mimo_config(**over)).float().eval()
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        elif name.endswith("embed_tokens.weight") or name.endswith("sinks"):
            p.normal_(0.0, 1.0)
        elif "experts" in name:  # [E, out, in]
            p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
        else:
            p.normal_(0.0, 0.15)
    for layer in model.model.layers:  # a buffer, not a parameter
        if hasattr(layer.mlp, "gate"):
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
    model.save_pretrained(out, safe_serialization=True)
    model.requires_grad_(False)
    return out, model
