"""llama.cpp's GGUF of the tiny MiMo-V2-Flash model (support/mimo_v2_flash_factory): the
checkpoint with config.json written the way the released checkpoint writes it (the keys
the converter's MimoV2Model reads: ``hybrid_layer_pattern``, ``swa_*``,
``partial_rotary_factor``, ``layernorm_epsilon``, ...; transformers' own config keys make
it fail with KeyError 'partial_rotary_factor'), its conversion with the converter the
sdist ships, and the exact reference of a quantized file for transformers to run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

from support.deepseek_factory import _BOOTSTRAP, require_llama_cpp
from support.mimo_v2_flash_factory import build_mimo


def released_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """transformers' saved config.json of a MiMo-V2-Flash model as the release spells it.
    The release's ``sliding_window`` and ``sliding_window_size`` are both the window less
    one (the query attends ``sliding_window_size`` earlier tokens and itself; transformers
    reads ``sliding_window_size + 1``); its rope keys are flat (``rope_theta``,
    ``swa_rope_theta``, ``partial_rotary_factor``), its layer kinds 0/1 lists."""
    rope = cfg["rope_parameters"]
    full, swa = rope["full_attention"], rope["sliding_attention"]
    assert full["partial_rotary_factor"] == swa["partial_rotary_factor"]
    sliding = [t == "sliding_attention" for t in cfg["layer_types"]]
    out = {k: cfg[k] for k in (
        "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
        "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "v_head_dim", "n_routed_experts",
        "num_experts_per_tok", "n_group", "topk_group", "norm_topk_prob",
        "max_position_embeddings", "attention_bias", "attention_value_scale",
        "tie_word_embeddings", "bos_token_id", "eos_token_id",
    )}  # fmt: skip
    out.update(
        swa_num_attention_heads=cfg["num_attention_heads"],
        swa_num_key_value_heads=2 * cfg["num_key_value_heads"],
        swa_head_dim=cfg["head_dim"],
        swa_v_head_dim=cfg["v_head_dim"],
        partial_rotary_factor=full["partial_rotary_factor"],
        rope_theta=full["rope_theta"],
        swa_rope_theta=swa["rope_theta"],
        sliding_window=cfg["sliding_window"] - 1,
        sliding_window_size=cfg["sliding_window"] - 1,
        hybrid_layer_pattern=[int(s) for s in sliding],
        moe_layer_freq=[int(t == "sparse") for t in cfg["mlp_layer_types"]],
        add_swa_attention_sink_bias=True,
        add_full_attention_sink_bias=False,
        routed_scaling_factor=None if cfg["routed_scaling_factor"] == 1.0 else
        cfg["routed_scaling_factor"],
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        layernorm_epsilon=cfg["rms_norm_eps"],
    )
    return out


def build(root: Path, *, seed: int = 0, **over: Any) -> tuple[Path, torch.nn.Module, Path]:
    """The transformers checkpoint (``root/hf``), its model, and the same weights with the
    released config.json (``root/released``)."""
    d, model = build_mimo(root / "hf", seed=seed, **over)
    rel = root / "released"
    rel.mkdir()
    shutil.copy(d / "model.safetensors", rel / "model.safetensors")
    cfg = json.loads((d / "config.json").read_text())
    (rel / "config.json").write_text(json.dumps(released_config(cfg), indent=1))
    return d, model, rel


# The converter's requirements pin transformers 4.57.6, which has no mimo_v2_flash: its
# AutoConfig fails and the converter reads config.json as it is. A transformers that knows
# the model (5.x) hands it transformers' own rope_parameters instead, keyed by layer type,
# and the converter fails on them (KeyError 'partial_rotary_factor'), so the conversion
# runs as under the pinned version.
_PINNED_TRANSFORMERS = r"""
import transformers
def _unknown_model_type(*args, **kwargs):
    raise ValueError("mimo_v2_flash is unknown to transformers 4.57.6")
transformers.AutoConfig.from_pretrained = _unknown_model_type
"""


def convert(released: Path, out: Path, outtype: str) -> Path:
    root = require_llama_cpp()
    cmd = [sys.executable, "-c", _PINNED_TRANSFORMERS + _BOOTSTRAP, str(root), str(released),
           "--outfile", str(out), "--outtype", outtype]  # fmt: skip
    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)  # the converter's own gguf-py, not the installed package
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0 or not out.is_file():
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return out


_PLAIN = {
    "token_embd": "model.embed_tokens", "output": "lm_head", "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate_inp": "mlp.gate", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}  # fmt: skip


def _hf_tensors(name: str, v: np.ndarray) -> dict[str, np.ndarray]:
    """One quantized GGUF tensor (torch order) as the transformers checkpoint's tensor(s)."""
    if name in _PLAIN:
        return {_PLAIN[name] + ".weight": v}
    _, layer, kind = name.split(".", 2)
    p = f"model.layers.{layer}."
    if kind.endswith("_exps"):
        w = kind.split("_")[1]
        return {f"{p}mlp.experts.{e}.{w}_proj.weight": v[e] for e in range(v.shape[0])}
    if kind in _PLAIN:
        return {f"{p}{_PLAIN[kind]}.weight": v}
    raise AssertionError(f"unmapped quantized tensor {name}")


def dequantized_model(hf_dir: Path, gguf_path: Path, out: Path) -> torch.nn.Module:
    """transformers' model of the values a quantized GGUF stores: the checkpoint with every
    non-F32 tensor replaced by its decoded value (the F32 ones are the checkpoint's)."""
    import gguf

    sd = load_file(hf_dir / "model.safetensors")
    for t in gguf.GGUFReader(str(gguf_path)).tensors:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            continue
        value = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        for k, v in _hf_tensors(t.name.removesuffix(".weight"), value).items():
            assert k in sd and tuple(sd[k].shape) == v.shape, (k, v.shape)
            sd[k] = torch.from_numpy(np.ascontiguousarray(v))
    out.mkdir(parents=True, exist_ok=True)
    for f in hf_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    save_file(sd, out / "model.safetensors", metadata={"format": "pt"})
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    return model.eval().requires_grad_(False)
