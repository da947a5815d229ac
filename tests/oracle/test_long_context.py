"""32k-token contexts: a tiny Llama trained-for-32k in shape (max_position_embeddings
32768, RoPE scaled by linear / YaRN as real long-context checkpoints are) runs a 32768-token
prompt, fed in chunks, and its logits at the last positions match transformers on the same
sequence; the budget reports the KV cache at the full context.

Same F32 weights and F32 KV cache (the exact path): the logits must agree to 1e-4 of the
largest, as for the short oracle tests; over 32k keys the float softmax sums are longer,
measured well inside (~1e-6).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import colibri
from colibri.engine.budget import kv_bytes
from colibri.settings.config import EngineConfig, ThreadConfig

CONTEXT = 32768
CHUNK = 8192
CHECKED = 16  # last positions compared with transformers
SCALING = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
}


def _model(tmp_path: Path, scaling: dict[str, object]) -> tuple[LlamaForCausalLM, Path]:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=CONTEXT,
        rope_theta=10000.0, rope_scaling=dict(scaling), tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    return model, tmp_path / "hf"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCALING))
def test_32k_context_matches_transformers(tmp_path: Path, name: str) -> None:
    model, hf_dir = _model(tmp_path, SCALING[name])
    ids = [int(x) for x in np.random.default_rng(1).integers(3, 256, CONTEXT)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0, -CHECKED:].float().numpy()

    m = colibri.Model.load(hf_dir, engine=EngineConfig(threads=ThreadConfig(n=2),
                                                       context_length=CONTEXT))
    assert m.kv_cache_type == "f32"
    mem = m.stats().memory
    assert mem is not None and mem.kv_bytes == kv_bytes(2, 1, 64, CONTEXT, "f32") == 33_554_432
    s = m.session()
    for start in range(0, CONTEXT - CHUNK, CHUNK):
        s.forward(ids[start:start + CHUNK])
    got = s.forward(ids[CONTEXT - CHUNK:], all_logits=True)[-CHECKED:]
    assert s.n_tokens == CONTEXT
    err = float(np.abs(got - ref).max())
    assert err <= 1e-4 * float(np.abs(ref).max()), f"{name}: max |delta| {err:.3g}"
