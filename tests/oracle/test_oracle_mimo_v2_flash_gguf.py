"""MiMo-V2-Flash as llama.cpp's converter (the llama-cpp-python 0.3.36 sdist's
convert_hf_to_gguf.py) writes it, general.architecture ``mimo2``, against transformers on
the tiny random checkpoint of support/mimo_v2_flash_factory.py (seed 3): full and sliding
layers with 1 and 2 KV heads, RoPE bases 5e6 / 1e4 over 8 of 16 dimensions, 8-wide values
scaled by 0.6, sinks on the sliding layers, q/k/v biases, a dense first layer, 8 experts in
2 groups. The converter reads the released checkpoint's config keys, so the weights are
converted under a config.json written as the release writes it
(support/mimo_v2_flash_gguf.py); the file declares 3 MTP layers it does not carry.

F32 file: every logit at every position within 1e-4 of the largest of transformers' for
one prefill and for a prefill followed by token-by-token decode (12-token prompt, window
5); the same greedy 20 tokens. Q8_0 file (embeddings, head, attention projections and
expert gate/up in Q8_0; the 16-wide expert down rows in F16; norms, biases, sinks, the
router and its bias in F32) against transformers running the very values the file stores
(support/mimo_v2_flash_gguf.dequantized_model): the same bound, the same greedy tokens.
Measured: 3.3e-7 of max |logit| on the F32 file, 2.9e-7 on the Q8_0 file against its
stored values (Q8_0 itself moves this model's logits by 1.5% of max |logit|).

Bad input: a per-layer list of the wrong length is a ModelFormatError naming its key;
full (or sliding) layers with different KV-head counts are refused (UnsupportedError).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import colibri
from colibri.errors import ModelFormatError, UnsupportedError
from support.logit_checks import assert_decode_matches, assert_greedy_matches, assert_within
from support.mimo_v2_flash_factory import VOCAB, WINDOW
from support.mimo_v2_flash_gguf import build, convert, dequantized_model
from support.modelfactory import prompt_ids, reference_greedy, reference_logits
from support.untrusted import edit_gguf, set_kv

N_PROMPT, N_GREEDY = 12, 20
SEED = 3
Tiny = tuple[Path, torch.nn.Module, dict[str, Path]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """The transformers checkpoint, its model and the converter's F32 and Q8_0 files."""
    root = tmp_path_factory.mktemp("mimo-gguf")
    d, model, released = build(root, seed=SEED)
    files = {t: convert(released, root / f"mimo.{t}.gguf", t) for t in ("f32", "q8_0")}
    return d, model, files


def _load(p: Path) -> colibri.Model:
    return colibri.Model.load(p, engine=colibri.EngineConfig(context_length=64))


def test_the_file_maps_to_the_checkpoints_config(tiny: Tiny) -> None:
    """Every field the forward pass reads is the Hugging Face checkpoint's, the window
    included (the file's sliding_window is the release's, one less)."""
    d, _, files = tiny
    hf, gg = _load(d).config, _load(files["f32"]).config
    assert N_PROMPT > WINDOW
    for field in ("n_layers", "n_heads", "n_kv_heads", "sliding_n_kv_heads", "head_dim",
                  "v_head_dim", "rotary_dim", "rope_theta", "sliding_rope_theta",
                  "sliding_window", "sliding_layers", "attention_sinks", "sinks_sliding_only",
                  "attention_bias", "attention_value_scale", "moe_layers", "n_experts",
                  "n_experts_per_tok", "moe_intermediate_size", "intermediate_size", "router",
                  "router_bias", "n_group", "topk_group", "norm_topk_prob",
                  "routed_scaling_factor", "rms_norm_eps", "n_mtp_layers"):  # fmt: skip
        assert getattr(gg, field) == getattr(hf, field), field


def test_f32_prefill_and_decode_match_transformers(tiny: Tiny) -> None:
    _, model, files = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    m = _load(files["f32"])
    assert_within(m.session().forward(ids, all_logits=True), ref, "gguf prefill")
    assert_decode_matches(m.session(), ids, ref, "gguf")


def test_f32_greedy_continuation_matches_transformers(tiny: Tiny) -> None:
    _, model, files = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref_tokens, ref_logits = reference_greedy(model, ids, N_GREEDY)
    assert_greedy_matches(_load(files["f32"]).session(), ids, ref_tokens, ref_logits)


def test_q8_0_matches_its_dequantized_weights(tiny: Tiny, tmp_path: Path) -> None:
    d, model, files = tiny
    ref_model = dequantized_model(d, files["q8_0"], tmp_path / "deq")
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(ref_model, ids)
    # Not vacuous: the stored values move the logits away from the float model's.
    moved = float(np.abs(reference_logits(model, ids) - ref).max())
    assert moved > 1e-3 * float(np.abs(ref).max())
    m = _load(files["q8_0"])
    assert_within(m.session().forward(ids, all_logits=True), ref, "q8_0 prefill")
    assert_decode_matches(m.session(), ids, ref, "q8_0")
    ref_tokens, ref_logits = reference_greedy(ref_model, ids, N_GREEDY)
    assert_greedy_matches(m.session(), ids, ref_tokens, ref_logits)


def test_bad_per_layer_metadata_is_refused(tiny: Tiny, tmp_path: Path) -> None:
    f32 = tiny[2]["f32"]
    short = edit_gguf(f32, tmp_path / "short.gguf", lambda doc: set_kv(
        doc, "mimo2.attention.sliding_window_pattern", [0, 1, 1]))
    with pytest.raises(ModelFormatError, match="sliding_window_pattern"):
        _load(short)
    mixed = edit_gguf(f32, tmp_path / "mixed.gguf", lambda doc: set_kv(
        doc, "mimo2.attention.head_count_kv", [1, 2, 2, 2, 2, 2, 2]))
    with pytest.raises(UnsupportedError, match="full layers with different KV head counts"):
        _load(mixed)
