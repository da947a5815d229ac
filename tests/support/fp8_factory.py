"""FP8 block-scaled checkpoints made from the tiny test models, in the official
DeepSeek-V3 layout: each chosen projection ``weight`` as float8_e4m3fn with an F32
``<name>_scale_inv`` holding one scale per block (block amax / 448), the other tensors in
BF16 as DeepSeek ships them, ``quantization_config.weight_block_size`` in config.json.
Beside each checkpoint, its "twin": the same weights dequantized by torch
(``fp8.float() * scale``) in F32, which transformers runs as the oracle.

Used by tests/sources/test_fp8.py (conversion), tests/sources/test_fp8_direct.py (dense / MoE run
directly) and tests/sources/test_fp8_mla.py (MLA run directly).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

OFFICIAL = (128, 128)
# The block the tiny test models use: smaller than the official one, so their matrices have
# several blocks each and partial blocks at the edges.
SMALL = (32, 48)
FP8_MAX = 448.0  # largest finite e4m3 value


def expand(scale: torch.Tensor, shape: tuple[int, ...], block: tuple[int, int]) -> torch.Tensor:
    """The per-block scales spread to every element of a `shape` weight."""
    s = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return s[: shape[0], : shape[1]]


def to_fp8(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, F32 scale_inv per block) of a 2-D weight; partial edge blocks too."""
    rows, cols = w.shape
    sr, sc = -(-rows // block[0]), -(-cols // block[1])
    padded = torch.zeros(sr * block[0], sc * block[1])
    padded[:rows, :cols] = w
    amax = padded.reshape(sr, block[0], sc, block[1]).abs().amax(dim=(1, 3))
    scale = (amax / FP8_MAX).clamp(min=1e-12).float()
    return (w / expand(scale, tuple(w.shape), block)).to(torch.float8_e4m3fn), scale


def write_fp8_pair(hf: Path, fp8_dir: Path, ref_dir: Path, block: tuple[int, int],
                   fp8_projections: tuple[str, ...],
                   keep_f32: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Writes the FP8 checkpoint of the Hugging Face directory `hf` to `fp8_dir` and its
    dequantized F32 twin to `ref_dir`. A 2-D tensor whose module name is in
    `fp8_projections` becomes FP8; a tensor whose name ends with one of `keep_f32` stays
    F32 in both (DeepSeek ships e_score_correction_bias so); the rest is BF16."""
    fp8_sd: dict[str, torch.Tensor] = {}
    ref_sd: dict[str, torch.Tensor] = {}
    for name, w in load_file(str(hf / "model.safetensors")).items():
        if w.ndim == 2 and name.split(".")[-2] in fp8_projections:
            qw, scale = to_fp8(w.float(), block)
            fp8_sd[name], fp8_sd[name + "_scale_inv"] = qw, scale
            ref_sd[name] = qw.float() * expand(scale, tuple(w.shape), block)
        elif keep_f32 and name.endswith(keep_f32):
            fp8_sd[name] = ref_sd[name] = w.float()
        else:
            fp8_sd[name] = w.to(torch.bfloat16)
            ref_sd[name] = fp8_sd[name].float()
    cfg = json.loads((hf / "config.json").read_text())
    for d, sd in ((fp8_dir, fp8_sd), (ref_dir, ref_sd)):
        d.mkdir(parents=True, exist_ok=True)
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(hf / "generation_config.json", d / "generation_config.json")
    qcfg = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": list(block)}  # fmt: skip
    (fp8_dir / "config.json").write_text(json.dumps(dict(cfg, quantization_config=qcfg)))
    (ref_dir / "config.json").write_text(json.dumps(cfg))
    return fp8_dir, ref_dir


# The Linear weights DeepSeek-V3's FP8 release stores in FP8 (router, norms, embeddings and
# lm_head stay BF16; e_score_correction_bias F32).
DEEPSEEK_FP8_PROJECTIONS = (
    "q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
    "gate_proj", "up_proj", "down_proj", "eh_proj", "wq_b", "wk")  # fmt: skip


def fp8_deepseek(root: Path, block: tuple[int, int],
                 variant: str = "deepseek_v3") -> tuple[Path, Path]:
    """(FP8 checkpoint, its dequantized F32 twin) of a tiny DeepSeek / GLM-family model
    (support.deepseek_factory), cached under `root`."""
    from support.deepseek_factory import build_tiny

    hf = build_tiny(variant, with_gguf=False).hf_dir
    tag = f"{variant}-{block[0]}x{block[1]}"
    fp8_dir, ref_dir = root / f"{tag}-fp8", root / tag
    if fp8_dir.is_dir():
        return fp8_dir, ref_dir
    return write_fp8_pair(hf, fp8_dir, ref_dir, block, DEEPSEEK_FP8_PROJECTIONS,
                          keep_f32=("e_score_correction_bias",))

