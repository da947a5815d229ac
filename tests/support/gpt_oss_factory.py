"""Tiny random gpt-oss checkpoints (transformers' GptOssForCausalLM, float32) for the oracle
tests: 4 layers alternating sliding (window 4) and full attention, 8 experts top-2, YaRN
RoPE, every bias and the sinks set to non-trivial values, and a SwiGLU clamp small enough
to act on a good share of the values (``clamp_shares`` measures it).

``neutral_attention`` zeroes every o_proj weight and bias: attention then adds exactly
nothing to the residual stream, so sinks and windows cannot change a logit, which lets the
FFN pieces be checked against transformers on a build whose attention unit lacks them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

VOCAB = 128
LIMIT = 0.7  # swiglu_limit: the gate/up values of these models are ~N(0, 1)


def gpt_oss_config(**over: Any) -> transformers.GptOssConfig:
    args: dict[str, Any] = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=16, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=4, max_position_embeddings=64,
        layer_types=["sliding_attention", "full_attention"] * 2, swiglu_limit=LIMIT,
        rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 16},
    )  # fmt: skip
    args.update(over)
    return transformers.GptOssConfig(**args)


@torch.no_grad()
def build_gpt_oss(
    out: Path, *, seed: int = 0, neutral_attention: bool = False, expert_scale: float = 1.0,
    **over: Any,
) -> tuple[Path, torch.nn.Module]:
    """Write the checkpoint to ``out`` (save_pretrained) and return it with the model.
    ``expert_scale`` multiplies the expert matrices (gate/up values ~N(0, scale^2)): with
    llama.cpp's fixed limit 7.0, a scale of 10 keeps the clamp acting."""
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(gpt_oss_config(**over)).float().eval()
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        elif name.endswith("embed_tokens.weight"):
            p.normal_(0.0, 1.0)
        elif name.endswith("sinks"):
            p.normal_(0.0, 1.0)
        elif "bias" in name:
            p.normal_(0.0, 0.3)
        elif "experts" in name:  # [E, in, out]: entries ~ 1/sqrt(in) make gate/up ~N(0, 1)
            p.normal_(0.0, expert_scale / np.sqrt(p.shape[1]))
        else:
            p.normal_(0.0, 0.15)
    if neutral_attention:
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.self_attn.o_proj.bias.zero_()
    model.save_pretrained(out, safe_serialization=True)
    model.requires_grad_(False)
    return out, model


@torch.no_grad()
def clamp_shares(model: torch.nn.Module, ids: list[int]) -> tuple[float, float]:
    """(share of gate values above the limit, share of up values outside +-limit) over
    every expert evaluation of one forward of ``ids``."""
    seen: list[torch.Tensor] = []
    for layer in model.model.layers:
        experts = layer.mlp.experts
        original = experts._apply_gate

        def record(gate_up: torch.Tensor, _orig: Any = original) -> torch.Tensor:
            seen.append(gate_up.detach().clone())
            return _orig(gate_up)

        experts._apply_gate = record
    try:
        model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        for layer in model.model.layers:
            del layer.mlp.experts._apply_gate
    gu = torch.cat([s.reshape(-1, s.shape[-1]) for s in seen])
    limit = model.config.swiglu_limit
    gate, up = gu[:, ::2], gu[:, 1::2]
    return float((gate > limit).float().mean()), float((up.abs() > limit).float().mean())


# --------------------------------------------------------------------------- MXFP4

# e2m1 code -> value (OCP Microscaling Formats v1.0, FP4 E2M1)
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)  # fmt: skip


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``w [..., rows, cols]`` (cols % 32 == 0) as gpt-oss stores MXFP4: blocks
    [..., rows, cols / 32, 16] (element 2k in the low nibble of byte k), scales
    [..., rows, cols / 32] (E8M0, bias 127), and the dequantized float32 values."""
    *prefix, rows, cols = w.shape
    x = w.astype(np.float64).reshape(*prefix, rows, cols // 32, 32)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    exp = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0))  # |x| / 2^exp <= 6
    scaled = x / 2.0**exp
    codes = np.abs(scaled[..., None] - E2M1.astype(np.float64)).argmin(axis=-1).astype(np.uint8)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    scales = (exp[..., 0] + 127).astype(np.uint8)
    deq = (E2M1[codes].astype(np.float64) * 2.0**exp).astype(np.float32)
    return blocks, scales, deq.reshape(w.shape)


def write_mxfp4_pair(hf_dir: Path, mx_dir: Path, deq_dir: Path) -> dict[str, np.ndarray]:
    """From a float gpt-oss checkpoint: the same model with MXFP4 experts as released
    (``*_blocks`` / ``*_scales``, quantization_config mxfp4) in ``mx_dir``, and its exact
    float32 dequantization in ``deq_dir``. Returns the dequantized expert tensors."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    sd = load_file(hf_dir / "model.safetensors")
    mx, deq = dict(sd), dict(sd)
    out: dict[str, np.ndarray] = {}
    for name in [n for n in sd if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        rows = sd[name].numpy().transpose(0, 2, 1)  # [E, out, in]: MXFP4 keeps rows = outputs
        blocks, scales, values = quantize_mxfp4(rows)
        del mx[name]
        mx[name + "_blocks"] = torch.from_numpy(blocks)
        mx[name + "_scales"] = torch.from_numpy(scales)
        out[name] = values.transpose(0, 2, 1).copy()
        deq[name] = torch.from_numpy(out[name])
    cfg = json.loads((hf_dir / "config.json").read_text())
    for d, tensors, extra in ((mx_dir, mx, {"quantization_config": {"quant_method": "mxfp4"}}),
                              (deq_dir, deq, {})):  # fmt: skip
        d.mkdir(parents=True)
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
        (d / "config.json").write_text(json.dumps({**cfg, **extra}))
        if (hf_dir / "generation_config.json").is_file():
            shutil.copy(hf_dir / "generation_config.json", d)
    return out


# llama.cpp's GGUF names for gpt-oss (per layer after "blk.{i}.", and the rest) -> the
# Hugging Face parameter; the experts are handled apart (fused and interleaved in HF).
_GGUF_TO_HF = {
    "token_embd": "model.embed_tokens.weight", "output_norm": "model.norm.weight",
    "output": "lm_head.weight", "attn_norm": "input_layernorm.weight",
    "post_attention_norm": "post_attention_layernorm.weight",
    "attn_q": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output": "self_attn.o_proj.weight", "attn_output.bias": "self_attn.o_proj.bias",
    "attn_sinks": "self_attn.sinks", "ffn_gate_inp": "mlp.router.weight",
    "ffn_gate_inp.bias": "mlp.router.bias",
}  # fmt: skip


@torch.no_grad()
def dequantized_model(model: torch.nn.Module, gguf_path: Path) -> torch.nn.Module:
    """A copy of ``model`` holding the values a llama.cpp GGUF of it stores (each tensor
    decoded by the gguf package): the exact reference for a quantized file. The experts go
    back to transformers' layout: gate and up interleaved in ``gate_up_proj`` [E, hidden,
    2 * ffn] (gate at even columns), ``down_proj`` [E, ffn, hidden]."""
    import copy

    import gguf

    out = copy.deepcopy(model)
    state = out.state_dict()
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        value = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
        name = t.name.removesuffix(".weight")
        if not name.startswith("blk."):
            state[_GGUF_TO_HF[name]].copy_(value)
            continue
        _, layer, kind = name.split(".", 2)
        p = f"model.layers.{layer}."
        experts = p + "mlp.experts."
        if kind in ("ffn_gate_exps", "ffn_up_exps"):  # [E, ffn, hidden]
            col = 0 if kind == "ffn_gate_exps" else 1
            state[experts + "gate_up_proj"][:, :, col::2].copy_(value.transpose(1, 2))
        elif kind in ("ffn_gate_exps.bias", "ffn_up_exps.bias"):  # [E, ffn]
            col = 0 if kind.startswith("ffn_gate") else 1
            state[experts + "gate_up_proj_bias"][:, col::2].copy_(value)
        elif kind == "ffn_down_exps":  # [E, hidden, ffn]
            state[experts + "down_proj"].copy_(value.transpose(1, 2))
        elif kind == "ffn_down_exps.bias":
            state[experts + "down_proj_bias"].copy_(value)
        else:
            state[p + _GGUF_TO_HF[kind]].copy_(value.reshape(state[p + _GGUF_TO_HF[kind]].shape))
    return out
