"""A tiny DeepSeek-V4 checkpoint in the layout DeepSeek released (the one llama.cpp's
converter reads), built from a transformers model: tensor names without ``model.``
(``embed.weight``, ``layers.{i}.attn.kv_norm.weight``, ``hc_head_fn`` ...), routed
experts as MXFP4 (``.weight`` two E2M1 codes a byte, ``.scale`` one E8M0 exponent per 32
inputs) and config.json with the release's ``num_hash_layers`` and ``compress_ratios``.

The experts are rounded to MXFP4 first and written back into the transformers model, so
the model and the checkpoint hold the same values and transformers stays the oracle.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .deepseek_v4_factory import build_deepseek_v4

# E2M1 values by code (ggml's kvalues_mxfp4 order, halved: codes 8..15 are the negatives).
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])  # fmt: skip


def mxfp4_round(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes packed two a byte [rows, cols/2] uint8, E8M0 scales [rows, cols/32] uint8,
    the values they encode) for a float [rows, cols] matrix, cols a multiple of 32."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True).clamp_min(2.0**-100)
    exp = torch.ceil(torch.log2(amax / 6.0))
    scale = torch.exp2(exp)
    codes = (blocks / scale).unsqueeze(-1).sub(E2M1).abs().argmin(dim=-1).to(torch.uint8)
    values = (E2M1[codes.long()] * scale).reshape(rows, cols)
    flat = codes.reshape(rows, cols)
    packed = flat[:, 0::2] | (flat[:, 1::2] << 4)
    return packed, (exp + 127).to(torch.uint8).reshape(rows, cols // 32), values


_EXPERT = re.compile(r"model\.layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight")


# The dense projections the release stores as FP8 (E4M3, one E8M0 scale per 128 x 128
# block); llama.cpp's converter turns exactly these into Q8_0.
_FP8 = re.compile(r"layers\.\d+\.(?:attn\.w(?:q_a|q_b|kv|o_a|o_b)|ffn\.shared_experts\.w[123])"
                  r"\.weight")
# Widths that are multiples of 32, so every Q8_0 and MXFP4 row is whole blocks.
RELEASE_SHAPE = dict(moe_intermediate_size=32, q_lora_rank=32, o_lora_rank=16)


def fp8_round(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(E4M3 weight, E8M0 scales [ceil(rows/128), ceil(cols/128)] uint8, the values they
    encode) for a float matrix."""
    rows, cols = w.shape
    br, bc = -(-rows // 128), -(-cols // 128)
    pad = torch.zeros(br * 128, bc * 128)
    pad[:rows, :cols] = w
    amax = pad.reshape(br, 128, bc, 128).abs().amax(dim=(1, 3)).clamp_min(2.0**-100)
    exp = torch.ceil(torch.log2(amax / 448.0))
    scale = torch.exp2(exp).repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    q = (w / scale).to(torch.float8_e4m3fn)
    return q, (exp + 127).to(torch.uint8), q.float() * scale


def _release_name(name: str) -> str:
    name = name.removeprefix("model.")
    name = name.replace("embed_tokens.", "embed.").replace("hc_head.hc_", "hc_head_")
    return name.replace(".attn.norm.weight", ".attn.kv_norm.weight")


@torch.no_grad()
def build_release_v4(out: Path, *, seed: int = 0, fp8: bool = False, **over: Any
                     ) -> tuple[Path, torch.nn.Module]:  # fmt: skip
    """Write the release-layout checkpoint to ``out``; return it with the transformers model
    (experts rounded to MXFP4; with ``fp8`` the dense projections stored as FP8 and rounded
    to it too)."""
    hf = out.parent / (out.name + "-hf")
    _, model = build_deepseek_v4(hf, seed=seed, **{**RELEASE_SHAPE, **over})
    with safe_open(str(hf / "model.safetensors"), "pt") as f:
        saved = {n: f.get_tensor(n) for n in f.keys()}
    shutil.rmtree(hf)
    tensors = {_release_name(n): t for n, t in saved.items() if not _EXPERT.fullmatch(n)}
    for li, layer in enumerate(model.model.layers):
        # transformers keeps gate and up fused ([E, 2 * ffn, hidden]), down [E, hidden, ffn]
        gate_up, down = layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj
        ffn = gate_up.shape[1] // 2
        for e in range(gate_up.shape[0]):
            for key, w in (("w1", gate_up[e, :ffn]), ("w3", gate_up[e, ffn:]), ("w2", down[e])):
                stored = saved[f"model.layers.{li}.ffn.experts.{e}.{key}.weight"]
                assert torch.equal(stored, w), (li, e, key)  # the save's own split
                packed, scales, values = mxfp4_round(w.float())
                w.copy_(values)
                base = f"layers.{li}.ffn.experts.{e}.{key}"
                tensors[base + ".weight"] = packed.contiguous()
                tensors[base + ".scale"] = scales.contiguous()
    if fp8:
        live = dict(model.named_parameters())
        for name in [n for n in tensors if _FP8.fullmatch(n)]:
            q, scales, values = fp8_round(tensors[name].float())
            tensors[name], tensors[name[: -len(".weight")] + ".scale"] = q, scales
            live[_live_name(name)].copy_(values)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    cfg = model.config.to_dict()
    cfg["num_hash_layers"] = sum(t == "hash_moe" for t in cfg["mlp_layer_types"])
    rates = cfg.get("compress_rates") or {}
    cfg["compress_ratios"] = [0 if t == "sliding_attention" else rates[t]
                              for t in cfg["layer_types"]]  # fmt: skip
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out, model


_LIVE = {"attn.wq_a": "self_attn.q_a_proj", "attn.wq_b": "self_attn.q_b_proj",
         "attn.wkv": "self_attn.kv_proj", "attn.wo_a": "self_attn.o_a_proj",
         "attn.wo_b": "self_attn.o_b_proj", "ffn.shared_experts.w1": "mlp.shared_experts.gate_proj",
         "ffn.shared_experts.w3": "mlp.shared_experts.up_proj",
         "ffn.shared_experts.w2": "mlp.shared_experts.down_proj"}  # fmt: skip


def _live_name(name: str) -> str:
    """A release weight name -> the transformers model's parameter."""
    m = re.fullmatch(r"layers\.(\d+)\.(.+)\.weight", name)
    assert m is not None, name
    return f"model.layers.{m.group(1)}.{_LIVE[m.group(2)]}.weight"


# GGUF names (blk.{i}. and .weight / .bias dropped) -> the transformers model's parameters.
_GGUF_TO_HF = {
    "token_embd": "model.embed_tokens.weight", "output": "lm_head.weight",
    "output_norm": "model.norm.weight", "output_hc_fn": "model.hc_head.hc_fn",
    "output_hc_base": "model.hc_head.hc_base", "output_hc_scale": "model.hc_head.hc_scale",
    "attn_sinks": "self_attn.sinks", "attn_q_a": "self_attn.q_a_proj.weight",
    "attn_q_a_norm": "self_attn.q_a_norm.weight", "attn_q_b": "self_attn.q_b_proj.weight",
    "attn_kv": "self_attn.kv_proj.weight", "attn_kv_a_norm": "self_attn.kv_norm.weight",
    "attn_output_a": "self_attn.o_a_proj.weight", "attn_output_b": "self_attn.o_b_proj.weight",
    "attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
    "ffn_gate_inp": "mlp.gate.weight", "exp_probs_b": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp": "mlp.shared_experts.down_proj.weight",
    "ffn_down_exps": "mlp.experts.down_proj",
    "hc_attn_fn": "attn_hc.fn", "hc_attn_base": "attn_hc.base", "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn", "hc_ffn_base": "ffn_hc.base", "hc_ffn_scale": "ffn_hc.scale",
}  # fmt: skip


def dequantized_v4(model: torch.nn.Module, gguf_path: Path) -> tuple[torch.nn.Module, set[str]]:
    """A copy of ``model`` holding the values a llama.cpp GGUF of it stores (each tensor
    decoded by the gguf package), and the GGUF types present: the exact reference for a
    quantized file."""
    import copy

    import gguf

    out = copy.deepcopy(model)
    state = out.state_dict()
    stacks: dict[tuple[str, str], torch.Tensor] = {}
    types: set[str] = set()
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        types.add(t.tensor_type.name)
        parts = t.name.rsplit(".", 1)[0].split(".")
        if parts[-1] == "ffn_gate_tid2eid":
            got = torch.from_numpy(t.data.copy()).long()
            assert torch.equal(got, state[f"model.layers.{parts[1]}.mlp.gate.tid2eid"])
            continue
        value = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
        if parts[0] != "blk":
            state[_GGUF_TO_HF[parts[0]]].copy_(value)
            continue
        layer, kind = parts[1], parts[2]
        if kind in ("ffn_gate_exps", "ffn_up_exps"):
            stacks[(layer, kind)] = value
        else:
            state[f"model.layers.{layer}.{_GGUF_TO_HF[kind]}"].copy_(value)
    for (layer, kind), value in stacks.items():
        if kind == "ffn_gate_exps":  # gate_up_proj [E, 2 * ffn, hidden]: gate rows first
            up = stacks[(layer, "ffn_up_exps")]
            state[f"model.layers.{layer}.mlp.experts.gate_up_proj"].copy_(
                torch.cat([value, up], dim=1))
    return out, types


def container_model(model: torch.nn.Module, manifest: Any) -> torch.nn.Module:
    """A copy of ``model`` (a transformers DeepSeek-V4) holding the values a colibri
    manifest's tensors store, decoded by the core's scalar kernels: the exact reference
    for a quantized container. The hash tables must be the model's own."""
    import copy

    import numpy as np

    from colibri.convert.quantize import decode

    out = copy.deepcopy(model)
    state = out.state_dict()
    names = {**_GGUF_TO_HF, "attn_kv_norm": "self_attn.kv_norm.weight"}
    for t in manifest.tensors.values():
        raw = b"".join(np.fromfile(manifest.files[e.file], np.uint8, e.length, offset=e.offset)
                       .tobytes() for e in t.extents)  # fmt: skip
        cols = int(t.shape[-1])
        rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        value = torch.from_numpy(decode(t.dtype, np.frombuffer(raw, np.uint8).copy(), rows, cols)
                                 .reshape(t.shape).copy())  # fmt: skip
        parts = t.name.split(".")
        if parts[0] != "blk":
            state[names[parts[0]]].copy_(value)
            continue
        layer, kind = parts[1], parts[2]
        prefix = f"model.layers.{layer}."
        if kind == "ffn_hash_eid":
            assert torch.equal(value.long(), state[prefix + "mlp.gate.tid2eid"]), t.name
        elif kind in ("ffn_gate_exps", "ffn_up_exps"):
            stack = state[prefix + "mlp.experts.gate_up_proj"]
            ffn = stack.shape[1] // 2
            half = slice(0, ffn) if kind == "ffn_gate_exps" else slice(ffn, 2 * ffn)
            stack[int(parts[3]), half].copy_(value)
        elif kind == "ffn_down_exps":
            state[prefix + "mlp.experts.down_proj"][int(parts[3])].copy_(value)
        else:
            state[prefix + names[kind]].copy_(value)
    return out
