"""``colibri convert`` of DeepSeek-V4 (support/deepseek_v4_factory.py, with a hidden size of
256 so that rows are whole 256-element super-blocks and the K- and i-quant targets write
their own types, not only their 32-element fallbacks) to the native container, with every
``--quant`` target.

``keep`` and ``f32`` give the checkpoint's logits bit for bit. Every other target runs
within 1e-4 of the largest logit of transformers running the values the container stores
(decoded by the core's scalar kernels: support/deepseek_v4_release.container_model); the
hyper-connection projections and the hash tables stay F32. How far each target moves this
tiny random model from the float one is in docs/deepseek.md. A GGUF written by llama.cpp's
converter, kept, runs bit for bit as the file does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import colibri
from colibri.convert import write_container
from colibri.sources.native_format import QUANT_CHOICES
from support.deepseek_factory import convert_with_llama_cpp
from support.deepseek_v4_factory import VOCAB, build_deepseek_v4
from support.deepseek_v4_release import build_release_v4, container_model
from support.logit_checks import assert_within
from support.modelfactory import prompt_ids, reference_logits

N_PROMPT = 12
EXACT = ("keep", "f32")
MIX = {"q4_k_m": "Q4_K", "q5_k_m": "Q5_K"}
Tiny = tuple[Path, torch.nn.Module]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return build_deepseek_v4(tmp_path_factory.mktemp("v4-wide"), seed=3, hidden_size=256)


def _load(p: Path) -> colibri.Model:
    return colibri.Model.load(p, engine=colibri.EngineConfig(context_length=64))


@pytest.mark.parametrize("quant", QUANT_CHOICES)
def test_every_quant_target_converts_and_runs(tiny: Tiny, tmp_path: Path, quant: str) -> None:
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    write_container(d, tmp_path / quant, quant=quant)
    m = _load(tmp_path / quant)
    types = {n: t.dtype for n, t in m.manifest.tensors.items()}
    got = m.session().forward(ids, all_logits=True)
    if quant in EXACT:
        assert set(types.values()) == {"F32"}
        assert np.array_equal(got, _load(d).session().forward(ids, all_logits=True))
        return
    assert MIX.get(quant, quant.upper()) in set(types.values()), sorted(set(types.values()))
    assert {types[n] for n in ("output_hc_fn", "blk.1.hc_attn_fn", "blk.2.hc_ffn_fn",
                               "blk.0.ffn_hash_eid")} == {"F32"}  # fmt: skip
    ref = reference_logits(container_model(model, m.manifest), ids)
    assert_within(got, ref, f"{quant} container")


def test_a_llama_cpp_gguf_kept_runs_as_the_file(tmp_path: Path) -> None:
    d, _ = build_release_v4(tmp_path / "release", seed=3)
    gguf = tmp_path / "v4.gguf"
    convert_with_llama_cpp(d, gguf, "f32")
    write_container(gguf, tmp_path / "keep")
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    kept = _load(tmp_path / "keep")
    assert kept.manifest.tensors["blk.0.ffn_gate_exps.0"].dtype == "MXFP4"
    assert kept.manifest.tensors["blk.0.ffn_hash_eid"].dtype == "F32"
    assert np.array_equal(kept.session().forward(ids, all_logits=True),
                          _load(gguf).session().forward(ids, all_logits=True))  # fmt: skip
