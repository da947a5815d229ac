"""Tiny random MiniMax-M2 checkpoints (transformers' MiniMaxM2ForCausalLM, float32) for the
oracle tests: 3 layers, 4 query and 2 KV heads of 16 dimensions of which 8 are rotated
(partial RoPE), 8 experts top-2 routed by sigmoid scores with a correction bias, every norm
weight and the bias set to non-trivial values.

``routing_margins`` measures what the tests rely on: that the correction bias changes the
chosen experts for some tokens, and that no token's k-th and (k+1)-th choices tie;
``dequantized_model`` is the model holding the values a quantized GGUF of it stores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

VOCAB = 128


def minimax_m2_config(**over: Any) -> transformers.MiniMaxM2Config:
    args: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rotary_dim=8,
        num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        scoring_func="sigmoid",  # as the released config.json (llama.cpp's converter reads it)
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )  # fmt: skip
    args.update(over)
    return transformers.MiniMaxM2Config(**args)


@torch.no_grad()
def build_minimax_m2(out: Path, *, seed: int = 0, **over: Any) -> tuple[Path, torch.nn.Module]:
    """Write the checkpoint to ``out`` (save_pretrained) and return it with the model."""
    torch.manual_seed(seed)
    model = transformers.MiniMaxM2ForCausalLM(minimax_m2_config(**over)).float().eval()
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
        elif name.endswith("embed_tokens.weight"):
            p.normal_(0.0, 1.0)
        elif "experts" in name:  # [E, out, in]
            p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
        else:
            p.normal_(0.0, 0.15)
    for layer in model.model.layers:  # a buffer, not a parameter
        layer.mlp.e_score_correction_bias.normal_(0.0, 0.3)
    model.save_pretrained(out, safe_serialization=True)
    model.requires_grad_(False)
    return out, model


@torch.no_grad()
def routing_margins(model: torch.nn.Module, ids: list[int]) -> tuple[int, float]:
    """Over every layer and token of one forward of ``ids``: (how many choices the
    correction bias changes, the smallest gap between the k-th and (k+1)-th choice)."""
    k = model.config.num_experts_per_tok
    changed, gap = 0, float("inf")
    seen: list[tuple[torch.nn.Module, torch.Tensor]] = []
    hooks = [layer.mlp.register_forward_pre_hook(
        lambda mod, args: seen.append((mod, args[0].reshape(-1, args[0].shape[-1]))))
        for layer in model.model.layers]  # fmt: skip
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    for mod, x in seen:
        score = torch.sigmoid(x @ mod.gate.weight.T)
        choice = score + mod.e_score_correction_bias
        top = choice.sort(dim=-1, descending=True)
        gap = min(gap, float((top.values[:, k - 1] - top.values[:, k]).min()))
        plain = score.topk(k, dim=-1).indices.sort(dim=-1).values
        biased = top.indices[:, :k].sort(dim=-1).values
        changed += int((plain != biased).any(dim=-1).sum())
    return changed, gap


_GGUF_TO_HF = {
    "token_embd": "model.embed_tokens.weight", "output": "lm_head.weight",
    "output_norm": "model.norm.weight", "attn_norm": "input_layernorm.weight",
    "ffn_norm": "post_attention_layernorm.weight", "attn_q": "self_attn.q_proj.weight",
    "attn_k": "self_attn.k_proj.weight", "attn_v": "self_attn.v_proj.weight",
    "attn_output": "self_attn.o_proj.weight", "attn_q_norm": "self_attn.q_norm.weight",
    "attn_k_norm": "self_attn.k_norm.weight", "ffn_gate_inp": "mlp.gate.weight",
    "exp_probs_b": "mlp.e_score_correction_bias", "ffn_down_exps": "mlp.experts.down_proj",
}  # fmt: skip


@torch.no_grad()
def dequantized_model(model: torch.nn.Module, gguf_path: Path) -> torch.nn.Module:
    """A copy of ``model`` holding the values a llama.cpp GGUF of it stores (each tensor
    decoded by the gguf package): the exact reference for a quantized file."""
    import copy

    import gguf

    out = copy.deepcopy(model)
    state = out.state_dict()
    stacks: dict[tuple[str, str], torch.Tensor] = {}
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        value = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
        parts = t.name.rsplit(".", 1)[0].split(".")  # drop .weight / .bias
        if parts[0] != "blk":
            state[_GGUF_TO_HF[parts[0]]].copy_(value)
            continue
        layer, kind = parts[1], ".".join(parts[2:])
        if kind in ("ffn_gate_exps", "ffn_up_exps"):
            stacks[(layer, kind)] = value
        else:
            state[f"model.layers.{layer}.{_GGUF_TO_HF[kind]}"].copy_(value)
    for (layer, kind), value in stacks.items():
        if kind == "ffn_gate_exps":  # gate_up_proj [E, 2 * ffn, hidden]: gate rows first
            up = stacks[(layer, "ffn_up_exps")]
            state[f"model.layers.{layer}.mlp.experts.gate_up_proj"].copy_(
                torch.cat([value, up], dim=1))
    return out
