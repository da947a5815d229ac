"""Tiny random Kimi-Linear checkpoints (transformers' KimiLinearForCausalLM, float32) for
the oracle tests: 4 layers (KDA, KDA, MLA, KDA: the config's ``linear_attn_config``
lists, 1-indexed, as the released checkpoints give them), 2 heads of 8 dimensions in the
Kimi Delta Attention layers with a 4-wide convolution, 4 MLA heads (no q-LoRA, latent 16,
nope 8, rope part 4, value 8, no RoPE applied: Kimi-Linear's MLA is NoPE), a dense first
FFN then 8 experts top-2 in 2 groups (sigmoid scores, correction bias) with a shared
expert. Every 1-D parameter is randomized (transformers initializes A_log, dt_bias and the
norms to constants or narrow ranges), so a unit that ignored one of them would show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

VOCAB = 128


def kimi_linear_config(**over: Any) -> transformers.KimiLinearConfig:
    args: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=24, moe_intermediate_size=8,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=8, num_experts=8, num_experts_per_token=2, num_shared_experts=1,
        num_expert_group=2, topk_group=1, moe_renormalize=True, routed_scaling_factor=2.0,
        first_k_dense_replace=1, rms_norm_eps=1e-5, tie_word_embeddings=False,
        model_max_length=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        linear_attn_config={"head_dim": 8, "num_heads": 2, "short_conv_kernel_size": 4,
                            "kda_layers": [1, 2, 4], "full_attn_layers": [3]},
    )  # fmt: skip
    args.update(over)
    return transformers.KimiLinearConfig(**args)


@torch.no_grad()
def _randomize(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.uniform_(-1.0, 1.0)
        elif name.endswith("dt_bias"):
            p.normal_(0.0, 1.0)
        elif name.endswith("norm.weight"):
            p.copy_(1.0 + 0.3 * torch.randn_like(p))
        elif name.endswith("conv1d.weight"):
            p.normal_(0.0, 0.5)
        elif name.endswith("embed_tokens.weight"):
            p.normal_(0.0, 1.0)
        elif "experts" in name:
            p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
        else:
            p.normal_(0.0, 0.2)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.normal_(0.0, 0.1)


@torch.no_grad()
def build_kimi_linear(out: Path, *, seed: int = 0, **over: Any) -> tuple[Path, torch.nn.Module]:
    """Write the checkpoint to ``out`` (save_pretrained) and return it with the model."""
    torch.manual_seed(seed)
    model = transformers.KimiLinearForCausalLM(kimi_linear_config(**over)).float().eval()
    _randomize(model)
    model.save_pretrained(out, safe_serialization=True)
    model.requires_grad_(False)
    return out, model
