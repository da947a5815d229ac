"""RoPE tables for every supported scaling variant against transformers' own
ROPE_INIT_FUNCTIONS (the oracle), plus an end-to-end Llama with llama3 scaling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import colibri
from colibri.engine.rope import rope_table
from colibri.errors import UnsupportedError
from support.modelfactory import reference_logits, write_gguf

HEAD_DIM = 64
CASES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
    "yarn-mscale": {
        "rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 4096,
    },
}  # fmt: skip


def _config(scaling: dict[str, object], theta: float = 500000.0) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=HEAD_DIM * 4, num_attention_heads=4, max_position_embeddings=131072,
        rope_theta=theta, rope_scaling=dict(scaling),
    )  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_table_matches_transformers(name: str) -> None:
    scaling = CASES[name]
    cfg = _config(scaling)
    inv, factor = ROPE_INIT_FUNCTIONS[str(scaling["rope_type"])](cfg, "cpu")
    ours = rope_table(HEAD_DIM, 500000.0, scaling, 131072)
    # Same float32 formulas; only the pow/exp implementations may differ by an ulp.
    np.testing.assert_allclose(ours.inv_freq, inv.numpy(), rtol=2e-6, atol=0)
    assert ours.attention_factor == pytest.approx(float(factor), rel=1e-6)


def test_default_table() -> None:
    inv = 1.0 / (10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM))
    np.testing.assert_allclose(rope_table(HEAD_DIM, 10000.0, None, 2048).inv_freq, inv, rtol=2e-6)


def test_unknown_scaling_is_refused() -> None:
    with pytest.raises(UnsupportedError, match=r"longrope.*supported: default"):
        rope_table(HEAD_DIM, 10000.0, {"rope_type": "longrope", "factor": 2.0}, 4096)


def _llama3_model(tmp_path: Path) -> tuple[LlamaForCausalLM, Path]:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=131072,
        rope_theta=500000.0, rope_scaling=dict(CASES["llama3"]), tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.15)
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    return model, tmp_path / "hf"


IDS = list(range(3, 200, 7))


def test_llama3_scaled_model_matches_transformers(tmp_path: Path) -> None:
    model, hf_dir = _llama3_model(tmp_path)
    ref = reference_logits(model, IDS)
    got = colibri.Model.load(hf_dir, engine=colibri.EngineConfig(context_length=64))
    out = got.session().forward(IDS, all_logits=True)
    assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()


def test_gguf_rope_freqs_tensor_carries_llama3_scaling(tmp_path: Path) -> None:
    """llama.cpp's converter writes llama3 scaling as a `rope_freqs` tensor of divisors of
    the base frequencies (no scaling keys in the metadata)."""
    model, hf_dir = _llama3_model(tmp_path)
    base = rope_table(16, 500000.0, None, 131072).inv_freq
    scaled = rope_table(16, 500000.0, CASES["llama3"], 131072).inv_freq
    path = tmp_path / "llama3.gguf"
    write_gguf(hf_dir, path, "F32", extra={"rope_freqs": base / scaled})
    ref = reference_logits(model, IDS)
    out = colibri.Model.load(path, engine=colibri.EngineConfig(context_length=64))
    got = out.session().forward(IDS, all_logits=True)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    # The tensor is really applied: halving every frequency moves the logits far more
    # than float noise. (llama3 scaling itself only touches the slowest frequencies, whose
    # angles are still tiny at these 29 positions.)
    halved = tmp_path / "halved.gguf"
    write_gguf(hf_dir, halved, "F32", extra={"rope_freqs": np.full(8, 2.0, np.float32)})
    other = colibri.Model.load(halved, engine=colibri.EngineConfig(context_length=64))
    moved = np.abs(other.session().forward(IDS, all_logits=True) - ref).max()
    assert moved > 100 * 1e-4 * np.abs(ref).max()  # 100x the tolerance that matched
