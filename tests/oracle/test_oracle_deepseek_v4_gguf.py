"""DeepSeek-V4 GGUF files as llama.cpp's converter writes them (``deepseek4``), against
transformers. The converter reads the checkpoint as DeepSeek released it (routed experts
MXFP4, dense projections FP8, names without ``model.``), not as transformers saves it, so
the tiny model is written in that layout (support/deepseek_v4_release.py) from a
transformers model holding the same values: 3 ``sliding_attention`` layers, layer 0
hash-routed, hyper-connections of 3 streams.

* Float projections: the file holds F32 and the experts' MXFP4 values: every logit within
  1e-4 of the largest for a prefill and for prefill + decode, the same greedy 20 tokens.
* FP8 projections: the converter stores them as Q8_0 (with ``--outtype`` f32 or q8_0
  alike). Against transformers running the values the file stores, the same bound and
  greedy continuation. (Those Q8_0 values move this tiny model's logits by about 15% of
  max |logit| from the FP8 model's: 0.55 of 3.77 measured; colibri measured 1.3e-6 from
  the dequantized reference.)
* Compressed layers (sliding, CSA, HCA, CSA; support/deepseek_v4_factory.py COMPRESSED):
  the same bound for prefill and prefill + decode over 48 tokens, the same greedy tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import colibri
from support.deepseek_factory import convert_with_llama_cpp
from support.deepseek_v4_factory import COMPRESSED, VOCAB, build_deepseek_v4, indexer_margins
from support.deepseek_v4_release import build_release_v4, dequantized_v4
from support.logit_checks import assert_decode_matches, assert_greedy_matches, assert_within
from support.modelfactory import prompt_ids, reference_greedy, reference_logits

N_PROMPT, N_GREEDY = 12, 20
Tiny = tuple[Path, torch.nn.Module]


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return build_release_v4(tmp_path_factory.mktemp("v4-release") / "ckpt", seed=3)


@pytest.fixture(scope="module")
def f32_gguf(release: Tiny, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("v4-gguf") / "v4.f32.gguf"
    convert_with_llama_cpp(release[0], out, "f32")
    return out


def _load(p: Path) -> colibri.Model:
    return colibri.Model.load(p, engine=colibri.EngineConfig(context_length=64))


def test_the_gguf_reads_as_the_checkpoint_does(release: Tiny, f32_gguf: Path) -> None:
    cfg = _load(f32_gguf).config
    assert (cfg.arch, cfg.attention, cfg.router, cfg.activation) == (
        "deepseek_v4", "v4_sliding", "sqrt_softplus", "swiglu_clamp")  # fmt: skip
    assert (cfg.hash_layers, cfg.router_bias, cfg.sliding_window, cfg.swiglu_limit) == (
        (True, False, False), True, 5, 1.0)  # fmt: skip
    assert (cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rotary_dim) == (3, 5, 1e-6, 8)
    assert (cfg.o_groups, cfg.o_lora_rank, cfg.q_lora_rank, cfg.routed_scaling_factor) == (
        2, 16, 32, 1.5)  # fmt: skip


def test_f32_gguf_prefill_and_decode_match_transformers(release: Tiny, f32_gguf: Path) -> None:
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(release[1], ids)
    s = _load(f32_gguf).session()
    assert_within(s.forward(ids, all_logits=True), ref, "gguf prefill")
    s.reset()
    assert_decode_matches(s, ids, ref, "gguf")


def test_f32_gguf_greedy_matches_transformers(release: Tiny, f32_gguf: Path) -> None:
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref_tokens, ref_logits = reference_greedy(release[1], ids, N_GREEDY)
    assert_greedy_matches(_load(f32_gguf).session(), ids, ref_tokens, ref_logits)


@pytest.mark.parametrize("outtype", ["q8_0", "f32"])
def test_fp8_projections_become_q8_0_and_match_their_values(tmp_path: Path, outtype: str) -> None:
    d, model = build_release_v4(tmp_path / "fp8", seed=3, fp8=True)
    out = tmp_path / f"v4-fp8.{outtype}.gguf"
    convert_with_llama_cpp(d, out, outtype)
    ref_model, types = dequantized_v4(model, out)
    assert {"Q8_0", "MXFP4", "I32", "F32"} == types
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref_tokens, ref_logits = reference_greedy(ref_model, ids, N_GREEDY)
    s = _load(out).session()
    assert_within(s.forward(ids, all_logits=True), reference_logits(ref_model, ids), "q8_0")
    s.reset()
    assert_greedy_matches(s, ids, ref_tokens, ref_logits)


def test_compressed_layers_match_transformers(tmp_path: Path) -> None:
    """The compressed model of test_oracle_deepseek_v4_compressed.py (sliding, CSA, HCA,
    CSA) in the release's layout, converted: the compressors and the indexer read from the
    file's compress_ratios, indexer keys and tensors; a 48-token prompt within 1e-4 of
    transformers for prefill and prefill + decode, the same greedy 20 tokens."""
    d, model = build_release_v4(tmp_path / "ckpt", seed=19, **COMPRESSED)
    out = tmp_path / "v4c.gguf"
    convert_with_llama_cpp(d, out, "f32")
    m = colibri.Model.load(out, engine=colibri.EngineConfig(context_length=128))
    cfg = m.config
    assert cfg.compress_ratios == (0, 4, 8, 4) and cfg.csa_layers == (False, True, False, True)
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (8, 16, 3)
    ids = prompt_ids(48, vocab=VOCAB)
    ref_tokens, ref_logits = reference_greedy(model, ids, N_GREEDY)
    assert min(indexer_margins(model, ids + ref_tokens[:-1])) > 1e-4  # no ties to break
    ref = reference_logits(model, ids)
    assert_within(m.session().forward(ids, all_logits=True), ref, "prefill")
    assert_decode_matches(m.session(), ids, ref, "gguf")
    assert_greedy_matches(m.session(), ids, ref_tokens, ref_logits)


def test_the_release_name_of_the_kv_norm_reads(tmp_path: Path) -> None:
    """llama.cpp's converter reads the released checkpoint's key-value norm as
    ``attn.kv_norm.weight``, transformers' save_pretrained ``attn.norm.weight``: the
    Hugging Face path reads both, to the same logits."""
    d, _ = build_deepseek_v4(tmp_path / "saved", seed=3)
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    (renamed / "config.json").write_text((d / "config.json").read_text())
    sd = load_file(d / "model.safetensors")
    sd = {n.replace(".attn.norm.weight", ".attn.kv_norm.weight"): t for n, t in sd.items()}
    assert any(".attn.kv_norm.weight" in n for n in sd)
    save_file(sd, renamed / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    want = _load(d).session().forward(ids, all_logits=True)
    assert (_load(renamed).session().forward(ids, all_logits=True) == want).all()
