"""llama.cpp's GGUF of the tiny Qwen3-Next / Qwen3.5-MoE models (support/qwen3_next_factory):
conversion with the converter the sdist ships, and the exact reference of a quantized file
(a checkpoint of the values the file stores, the converter's re-layouts undone) for
transformers to run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

from support.deepseek_factory import convert_with_llama_cpp


def convert(hf_dir: Path, out: Path, outtype: str) -> Path:
    """The converter's file (``--no-mtp``: the tiny checkpoints carry no MTP layer, which
    the converter otherwise requires of these architectures)."""
    convert_with_llama_cpp(hf_dir, out, outtype, ("--no-mtp",))
    return out


def _untile(x: np.ndarray, nk: int, r: int, hd: int, axis: int) -> np.ndarray:
    """The converter's grouped -> tiled value-head order (Qwen3.5, nk < nv) undone along
    ``axis``: (r, nk, hd) -> (nk, r, hd)."""
    x = np.moveaxis(x, axis, 0)
    rest = x.shape[1:]
    x = x.reshape(r, nk, hd, *rest).transpose(1, 0, 2, *range(3, 3 + len(rest)))
    return np.moveaxis(x.reshape(r * nk * hd, *rest), 0, axis)


def _hf_tensors(name: str, v: np.ndarray, cfg: dict, qwen3_5: bool) -> dict[str, np.ndarray]:
    """One GGUF tensor (torch order) as the checkpoint's tensor(s)."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv, r = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], nv // nk
    tiled = qwen3_5 and nk != nv
    top = {"token_embd": "model.embed_tokens.weight", "output": "lm_head.weight"}
    if name in top:
        return {top[name]: v}
    _, layer, kind = name.split(".", 2)
    p = f"model.layers.{layer}."
    if kind.endswith("_exps"):
        w = kind.split("_")[1]
        return {f"{p}mlp.experts.{e}.{w}_proj.weight": v[e] for e in range(v.shape[0])}
    if kind.endswith("_shexp") and kind != "ffn_gate_inp_shexp":
        return {f"{p}mlp.shared_expert.{kind.split('_')[1]}_proj.weight": v}
    plain = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
             "ssm_ba": "linear_attn.in_proj_ba"}  # fmt: skip
    if kind in plain:
        return {f"{p}{plain[kind]}.weight": v}
    if kind == "ssm_out":
        return {f"{p}linear_attn.out_proj.weight": _untile(v, nk, r, dv, 1) if tiled else v}
    if kind in ("ssm_beta", "ssm_alpha"):
        w = _untile(v, nk, r, 1, 0) if tiled else v
        return {f"{p}linear_attn.in_proj_{kind[4]}.weight": w}
    if kind == "attn_gate":  # z
        z = _untile(v, nk, r, dv, 0) if tiled else v
        if qwen3_5:
            return {f"{p}linear_attn.in_proj_z.weight": z}
        return {"z": z}
    if kind == "attn_qkv":
        q, k, vv = v[: nk * dk], v[nk * dk : 2 * nk * dk], v[2 * nk * dk :]
        if qwen3_5:
            vv = _untile(vv, nk, r, dv, 0) if tiled else vv
            return {f"{p}linear_attn.in_proj_qkv.weight": np.concatenate([q, k, vv])}
        return {"qkv": v}
    raise AssertionError(f"unmapped quantized tensor {name}")


def _qkvz(qkv: np.ndarray, z: np.ndarray, cfg: dict) -> np.ndarray:
    """Qwen3-Next's in_proj_qkvz back from the converter's attn_qkv + attn_gate: per key
    head its q, k, v and z rows."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    rv = nv // nk * dv
    q, k, v = qkv[: nk * dk], qkv[nk * dk : 2 * nk * dk], qkv[2 * nk * dk :]
    rows = []
    for j in range(nk):
        rows += [q[j * dk : (j + 1) * dk], k[j * dk : (j + 1) * dk],
                 v[j * rv : (j + 1) * rv], z[j * rv : (j + 1) * rv]]  # fmt: skip
    return np.concatenate(rows)


def dequantized_model(hf_dir: Path, gguf_path: Path, out: Path, *, qwen3_5: bool
                      ) -> torch.nn.Module:  # fmt: skip
    """transformers' model of the values a quantized GGUF stores: the checkpoint with every
    non-F32 tensor replaced by its decoded value, re-laid out as the checkpoint stores it
    (the F32 tensors are the checkpoint's, which the file holds as they are or as the
    exact functions of them colibri reads)."""
    import gguf

    cfg = json.loads((hf_dir / "config.json").read_text())
    sd = load_file(hf_dir / "model.safetensors")
    fused: dict[str, dict[str, np.ndarray]] = {}
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            continue
        value = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        name = t.name.removesuffix(".weight")
        for k, v in _hf_tensors(name, value, cfg, qwen3_5).items():
            if k in ("qkv", "z"):
                fused.setdefault(name.split(".")[1], {})[k] = v
                continue
            assert k in sd and tuple(sd[k].shape) == v.shape, (k, v.shape)
            sd[k] = torch.from_numpy(np.ascontiguousarray(v))
    for layer, parts in fused.items():
        k = f"model.layers.{layer}.linear_attn.in_proj_qkvz.weight"
        sd[k] = torch.from_numpy(_qkvz(parts["qkv"], parts["z"], cfg))
    out.mkdir(parents=True, exist_ok=True)
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    return model.eval().requires_grad_(False)


def with_mtp_layer(src: Path, dst: Path) -> Path:
    """The checkpoint plus an MTP layer as the released files carry one (``mtp.layers.0.*``:
    a full-attention decoder layer, here layer 1's values; ``mtp.fc``; its norms), which
    the converter keeps as block_count's last layer (``nextn_predict_layers`` 1)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    sd = load_file(src / "model.safetensors")
    for k in list(sd):
        if k.startswith("model.layers.1."):
            sd["mtp.layers.0." + k[len("model.layers.1.") :]] = sd[k].clone()
    h = sd["model.norm.weight"].shape[0]
    g = torch.Generator().manual_seed(0)
    sd["mtp.fc.weight"] = torch.randn(h, 2 * h, generator=g)
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        sd[f"mtp.{n}.weight"] = torch.randn(h, generator=g)
    save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1  # Qwen3.5 declares it; Qwen3-Next's converter counts
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst
