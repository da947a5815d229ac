"""Tiny random Qwen3-Next checkpoints (transformers' Qwen3NextForCausalLM, float32) for the
oracle tests: 4 layers (linear, full, linear, full attention), 2 key and 4 value heads of
8 dimensions in the linear layers, a 4-wide convolution, 4 query / 2 KV heads of 16 in the
attention layers with a quarter of each head rotated, 8 experts top-2 with a gated shared
expert. Every 1-D parameter is randomized (transformers initializes A_log, dt_bias and the
norms to constants or narrow ranges), so a unit that ignored one of them would show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

VOCAB = 128


def qwen3_next_config(**over: Any) -> transformers.Qwen3NextConfig:
    args: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=16, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=8,
        shared_expert_intermediate_size=12, max_position_embeddings=512, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25},
    )  # fmt: skip
    args.update(over)
    return transformers.Qwen3NextConfig(**args)


def qwen3_5_text_config(**over: Any) -> transformers.Qwen3_5MoeTextConfig:
    """Qwen3.5-MoE's text model at the same sizes (no dense-layer or top-k settings: every
    FFN is MoE, the top-k weights always renormalized)."""
    args = qwen3_next_config().to_dict()
    keep = {f for f in transformers.Qwen3_5MoeTextConfig.__dataclass_fields__} - {
        "model_type", "architectures"}  # fmt: skip
    args = {k: v for k, v in args.items() if k in keep}
    args["rope_parameters"] = {**args["rope_parameters"], "mrope_interleaved": True,
                               "mrope_section": [1, 1, 0]}  # fmt: skip
    args.update(over)
    return transformers.Qwen3_5MoeTextConfig(**args)


@torch.no_grad()
def _randomize(model: torch.nn.Module) -> None:
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.uniform_(-1.0, 1.0)  # decays exp(A_log) * softplus(.) around 0.2 .. 3
        elif name.endswith("dt_bias"):
            p.normal_(0.0, 1.0)
        elif name.endswith("linear_attn.norm.weight"):  # scales by w
            p.copy_(1.0 + 0.3 * torch.randn_like(p))
        elif name.endswith("norm.weight"):  # zero-centred: scales by 1 + w
            p.normal_(0.0, 0.3)
        elif name.endswith("conv1d.weight"):
            p.normal_(0.0, 0.5)
        elif name.endswith("embed_tokens.weight"):
            p.normal_(0.0, 1.0)
        elif "experts" in name:
            p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
        else:
            p.normal_(0.0, 0.2)


@torch.no_grad()
def build_qwen3_5_multimodal(out: Path, *, seed: int = 0) -> tuple[Path, torch.nn.Module]:
    """Qwen3.5-MoE as released, a multimodal checkpoint (Qwen3_5MoeForConditionalGeneration:
    the text model under ``model.language_model``, a one-block vision tower under
    ``model.visual``), with the text model's sizes as above."""
    torch.manual_seed(seed)
    vision = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32,
                  patch_size=2, spatial_merge_size=2, temporal_patch_size=1, in_channels=3,
                  num_position_embeddings=16)  # fmt: skip
    cfg = transformers.Qwen3_5MoeConfig(text_config=qwen3_5_text_config().to_dict(),
                                        vision_config=vision)  # fmt: skip
    model = transformers.Qwen3_5MoeForConditionalGeneration(cfg).float().eval()
    _randomize(model)
    model.save_pretrained(out, safe_serialization=True)
    model.requires_grad_(False)
    return out, model


@torch.no_grad()
def build_qwen3_next(out: Path, *, seed: int = 0, qwen3_5: bool = False,
                     **over: Any) -> tuple[Path, torch.nn.Module]:  # fmt: skip
    """Write the checkpoint to ``out`` (save_pretrained) and return it with the model;
    ``qwen3_5``: Qwen3.5-MoE's text model (Qwen3_5MoeForCausalLM) instead."""
    torch.manual_seed(seed)
    if qwen3_5:
        model = transformers.Qwen3_5MoeForCausalLM(qwen3_5_text_config(**over)).float().eval()
    else:
        model = transformers.Qwen3NextForCausalLM(qwen3_next_config(**over)).float().eval()
    _randomize(model)
    model.save_pretrained(out, safe_serialization=True)
    model.requires_grad_(False)
    return out, model
