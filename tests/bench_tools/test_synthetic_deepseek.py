"""benchmarks/synthetic_deepseek.py: the DeepSeek-V3 / GLM-4.5-shaped synthetic GGUFs carry
the metadata keys and tensors llama.cpp's converter writes for those architectures (the
tiny converted checkpoints of deepseek_factory are the reference), colibri loads them as
the family they imitate, and so does llama.cpp."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.sources import open_model_source
from colibri.sources.gguf_header import read_gguf_header
from support.deepseek_factory import build_tiny

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from synthetic_deepseek import FAMILY_PRESETS, write_family_gguf

GLM_TINY = dataclasses.replace(
    FAMILY_PRESETS["glm45-air"], name="glm-tiny", n_layers=3, hidden=256, n_heads=4,
    n_kv_heads=2, head_dim=64, n_experts=8, top_k=2, expert_ffn=128, dense_ffn=512, vocab=512,
)  # fmt: skip
CASES = {"ds3-tiny": (FAMILY_PRESETS["ds3-tiny"], "deepseek_v3"),
         "glm-tiny": (GLM_TINY, "glm4_moe")}


@pytest.fixture(scope="module", params=list(CASES))
def synthetic(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[Path, str]:  # fmt: skip
    preset, variant = CASES[request.param]
    path = tmp_path_factory.mktemp("syn") / f"{preset.name}.gguf"
    write_family_gguf(preset, path, seed=1)
    return path, variant


def _shape_of_names(path: Path) -> tuple[set[str], set[tuple[str, int]]]:
    h = read_gguf_header(path)
    keys = {k for k in h.metadata if not k.startswith(("general.", "tokenizer."))}
    tensors = {(re.sub(r"\d+", "N", t.name), len(t.shape)) for t in h.tensors}
    return keys, tensors


def test_same_keys_and_tensors_as_llama_cpp_writes(synthetic: tuple[Path, str]) -> None:
    path, variant = synthetic
    ref = build_tiny(variant).gguf["F32"]
    keys, tensors = _shape_of_names(path)
    ref_keys, ref_tensors = _shape_of_names(ref)
    ref_keys -= {k for k in ref_keys if "rope.scaling" in k or "nextn" in k}  # tiny's extras
    # the tiny model's MTP layer and (GLM-4.5; Air has none) QK-norm are not in the preset
    optional = ("attn_q_norm.weight", "attn_k_norm.weight")
    ref_tensors -= {t for t in ref_tensors if "nextn" in t[0] or t[0].endswith(optional)}
    assert ref_keys <= keys, ref_keys - keys
    assert tensors == ref_tensors


def test_colibri_loads_the_family(synthetic: tuple[Path, str]) -> None:
    path, variant = synthetic
    cfg = open_model_source(path).config
    assert cfg.router == "sigmoid_grouped" and cfg.router_bias and not cfg.moe_layers[0]
    assert cfg.is_mla == (variant == "deepseek_v3")
    if variant == "glm4_moe":
        assert cfg.rotary_dim == cfg.head_dim // 2 and cfg.attention_bias
    else:
        assert (cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.n_group) == (128, 32, 4)
    with colibri.Model.load(path, engine=colibri.EngineConfig(context_length=64)) as m:
        logits = m.session().forward(list(range(300, 316)), all_logits=True)
    assert np.isfinite(logits).all() and float(logits.std()) > 0.1


def test_llama_cpp_loads_and_runs_it(synthetic: tuple[Path, str]) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    path, _ = synthetic
    m = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, n_threads=1,
                        verbose=False)  # fmt: skip
    m.eval(list(range(300, 316)))
    assert np.isfinite(np.asarray(m.scores[:16])).all()
