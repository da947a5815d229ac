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


def _release_name(name: str) -> str:
    name = name.removeprefix("model.")
    name = name.replace("embed_tokens.", "embed.").replace("hc_head.hc_", "hc_head_")
    return name.replace(".attn.norm.weight", ".attn.kv_norm.weight")


@torch.no_grad()
def build_release_v4(out: Path, *, seed: int = 0, **over: object
                     ) -> tuple[Path, torch.nn.Module]:  # fmt: skip
    """Write the release-layout checkpoint to ``out``; return it with the transformers model
    (experts rounded to MXFP4). Expert widths must be multiples of 32."""
    hf = out.parent / (out.name + "-hf")
    _, model = build_deepseek_v4(hf, seed=seed, moe_intermediate_size=32, **over)
    with safe_open(str(hf / "model.safetensors"), "pt") as f:
        saved = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118
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
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    cfg = model.config.to_dict()
    cfg["num_hash_layers"] = sum(t == "hash_moe" for t in cfg["mlp_layer_types"])
    cfg["compress_ratios"] = [0] * cfg["num_hidden_layers"]
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out, model
