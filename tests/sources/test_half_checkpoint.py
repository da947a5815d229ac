"""Half-precision Hugging Face checkpoints (BF16, F16) load directly: matrices stay in
their type, norm weights and biases are widened to F32 at load (exact), and the logits
match transformers running the same half-precision weights upcast to float32."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import colibri as co
from support.modelfactory import build_tiny_model, prompt_ids, reference_logits, transformers_model


@pytest.mark.parametrize("family", ["qwen2_moe", "olmoe", "llama"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_checkpoint_matches_transformers(
    tmp_path: Path, family: str, dtype: torch.dtype
) -> None:
    src = build_tiny_model(family).hf_dir
    dst = tmp_path / "half"
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        sd = load_file(f)
        half = {k: v.to(dtype).contiguous() for k, v in sd.items()}
        save_file(half, f, metadata={"format": "pt"})
    ids = prompt_ids(24)
    # The oracle: transformers on the same rounded weights, computed in float32.
    ref = reference_logits(transformers_model(str(dst)).float(), ids)
    with co.Model.load(dst, engine=co.EngineConfig(activation_precision="float32")) as m:
        got = m.session().forward(ids, all_logits=True)
    # Same weights, float32 arithmetic on both sides: the difference is summation order.
    scale = float(np.abs(ref).max())
    assert np.abs(got - ref).max() <= 1e-4 * scale
    assert (got.argmax(-1) == ref.argmax(-1)).all()
