"""llama.cpp's GGUF of the tiny Kimi-Linear model (support/kimi_linear_factory): the
checkpoint with the released names the converter maps, its conversion with the converter
the sdist ships, and the exact reference of a quantized file (the checkpoint with every
quantized tensor replaced by the value the file stores) for transformers to run.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

from support.deepseek_factory import convert_with_llama_cpp
from support.kimi_linear_factory import build_kimi_linear

# The converter writes no expert group count (see families/kimi_linear_gguf.py): one
# group, as the released checkpoint has.
ONE_GROUP = {"num_expert_group": 1, "topk_group": 1}
_DENSE = re.compile(r"^(model\.layers\.\d+\.)block_sparse_moe\.((?:gate|up|down)_proj\.weight)$")


def build(root: Path, *, seed: int = 0) -> tuple[Path, torch.nn.Module, Path]:
    """The transformers checkpoint (``root/hf``), its model, and the same weights under
    the released names (``root/released``): the dense layers' FFN as ``mlp.*`` (transformers
    saves it as ``block_sparse_moe.*``, which the converter cannot map)."""
    d, model = build_kimi_linear(root / "hf", seed=seed, **ONE_GROUP)
    rel = root / "released"
    rel.mkdir()
    for f in d.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, rel / f.name)
    sd = load_file(d / "model.safetensors")
    save_file({_DENSE.sub(r"\1mlp.\2", k): v for k, v in sd.items()},
              rel / "model.safetensors", metadata={"format": "pt"})  # fmt: skip
    return d, model, rel


def convert(released: Path, out: Path, outtype: str) -> Path:
    convert_with_llama_cpp(released, out, outtype)
    return out


_PLAIN = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "ssm_beta": "self_attn.b_proj", "ssm_f_a": "self_attn.f_a_proj",
    "ssm_f_b": "self_attn.f_b_proj", "ssm_g_a": "self_attn.g_a_proj",
    "ssm_g_b": "self_attn.g_b_proj", "ffn_gate_inp": "block_sparse_moe.gate",
    "ffn_gate": "block_sparse_moe.gate_proj", "ffn_up": "block_sparse_moe.up_proj",
    "ffn_down": "block_sparse_moe.down_proj",
}  # fmt: skip
_EXPERT = {"gate": "w1", "up": "w3", "down": "w2"}


def _hf_tensors(name: str, v: np.ndarray) -> dict[str, np.ndarray]:
    """One quantized GGUF tensor (torch order) as the transformers checkpoint's tensor(s)."""
    top = {"token_embd": "model.embed_tokens.weight", "output": "lm_head.weight"}
    if name in top:
        return {top[name]: v}
    _, layer, kind = name.split(".", 2)
    p = f"model.layers.{layer}."
    if kind.endswith("_exps"):
        w = _EXPERT[kind.split("_")[1]]
        return {f"{p}block_sparse_moe.experts.{e}.{w}.weight": v[e] for e in range(v.shape[0])}
    if kind.endswith("_shexp"):
        return {f"{p}block_sparse_moe.shared_experts.{kind.split('_')[1]}_proj.weight": v}
    if kind in _PLAIN:
        return {f"{p}{_PLAIN[kind]}.weight": v}
    if kind in ("attn_k_b", "attn_v_b"):  # the halves of kv_b_proj: joined by the caller
        return {kind: v}
    raise AssertionError(f"unmapped quantized tensor {name}")


def dequantized_model(hf_dir: Path, gguf_path: Path, out: Path) -> torch.nn.Module:
    """transformers' model of the values a quantized GGUF stores: the checkpoint with every
    non-F32 tensor replaced by its decoded value (the F32 tensors are the checkpoint's,
    which the file holds as they are or as the exact functions of them colibri reads)."""
    import gguf

    sd = load_file(hf_dir / "model.safetensors")
    kv_b: dict[str, dict[str, np.ndarray]] = {}
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            continue
        value = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        name = t.name.removesuffix(".weight")
        for k, v in _hf_tensors(name, value).items():
            if k in ("attn_k_b", "attn_v_b"):
                kv_b.setdefault(name.split(".")[1], {})[k] = v
                continue
            assert k in sd and tuple(sd[k].shape) == v.shape, (k, v.shape)
            sd[k] = torch.from_numpy(np.ascontiguousarray(v))
    for layer, parts in kv_b.items():
        # attn_k_b [heads, kv_lora, nope] (each head's nope rows transposed), attn_v_b
        # [heads, v, kv_lora]: kv_b_proj has per head its nope rows then its v rows.
        k_b, v_b = parts["attn_k_b"], parts["attn_v_b"]
        joined = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)
        key = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
        joined = joined.reshape(-1, joined.shape[2])
        assert tuple(sd[key].shape) == joined.shape, (key, joined.shape)
        sd[key] = torch.from_numpy(np.ascontiguousarray(joined))
    out.mkdir(parents=True, exist_ok=True)
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    return model.eval().requires_grad_(False)
