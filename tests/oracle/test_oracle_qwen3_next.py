"""Qwen3-Next against transformers on a tiny random float32 checkpoint
(support/qwen3_next_factory.py): Gated DeltaNet linear-attention layers (layers 0 and 2)
and gated full-attention layers (1 and 3) with partial RoPE and zero-centred norms, a MoE
FFN with a gated shared expert. The prompt (140 tokens) is longer than two of the 64-token
chunks transformers' prefill computes the delta rule in (torch_chunk_gated_delta_rule);
its decode runs the recurrent form (torch_recurrent_gated_delta_rule). colibri runs the
recurrent form throughout (today the faster); its chunked form, switched on here for
forwards of 64 tokens or more, is checked against transformers and the recurrent form.

Every logit at every position within 1e-4 of the largest, for one prefill, for a prefill
in chunks and for a prefill followed by token-by-token decode; the same greedy 20 tokens;
a mutation (the short convolution zeroed) moves the logits far past that bound, so the
bound is not met by accident.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from support.checkpoint_edits import with_tensor
from support.linear_attn_models import assert_forms_agree, load
from support.logit_checks import assert_decode_matches, assert_greedy_matches, assert_within
from support.modelfactory import prompt_ids, reference_greedy, reference_logits
from support.qwen3_next_factory import VOCAB, build_qwen3_5_multimodal, build_qwen3_next

RTOL = 1e-4
N_PROMPT, N_GREEDY = 140, 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    return build_qwen3_next(tmp_path_factory.mktemp("qwen3-next"), seed=0)


def close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert_within(got, ref, what, RTOL)


def test_the_model_exercises_what_it_should(tiny: tuple[Path, torch.nn.Module]) -> None:
    d, model = tiny
    cfg = load(d).config
    assert cfg.arch == "qwen3_next"
    assert cfg.linear_layers == (True, False, True, False)
    assert (cfg.rotary_dim, cfg.head_dim, cfg.qk_norm) == (4, 16, "head")
    assert cfg.attention_output_gate and cfg.norm_weight_offset == 1.0
    assert cfg.shared_expert_intermediate_size == 12 and cfg.shared_expert_gated
    la = model.model.layers[0].linear_attn
    assert la.num_v_heads // la.num_k_heads == 2  # value heads share key heads
    assert float(la.A_log.std()) > 0.1 and float(la.dt_bias.std()) > 0.1


@pytest.mark.parametrize("chunked", [False, True], ids=["recurrent", "chunked"])
def test_prefill_and_decode_match_transformers(
    tiny: tuple[Path, torch.nn.Module], chunked: bool
) -> None:
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    m = load(d, chunked=chunked)
    close(m.session().forward(ids, all_logits=True), ref, "prefill")
    assert_decode_matches(m.session(), ids, ref, "hf")  # 70 tokens at once, then one by one


def test_chunked_prefill_matches_transformers(tiny: tuple[Path, torch.nn.Module]) -> None:
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    s = load(d, prefill_chunk=48).session()
    close(s.forward(ids, all_logits=True), ref, "prefill in chunks of 48")


def test_the_chunked_and_recurrent_forms_agree(tiny: tuple[Path, torch.nn.Module]) -> None:
    """The chunked form over 140 tokens (chunks of 64, the last one short) and the
    recurrent one: the same logits to within rounding."""
    assert_forms_agree(tiny[0], prompt_ids(N_PROMPT, vocab=VOCAB))


def test_greedy_continuation_matches_transformers(tiny: tuple[Path, torch.nn.Module]) -> None:
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref_tokens, ref_logits = reference_greedy(model, ids, N_GREEDY)
    assert_greedy_matches(load(d).session(), ids, ref_tokens, ref_logits)


def test_a_native_container_computes_the_same_bits(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """``colibri convert`` keeps the cut projections, the convolution vector and the new
    config fields: the container's logits are the checkpoint's, bit for bit."""
    from colibri.convert import verify_container, write_container

    d, _ = tiny
    write_container(d, tmp_path / "native")
    verify_container(tmp_path / "native")
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    native = load(tmp_path / "native")
    assert native.config.linear_layers == (True, False, True, False)
    a = load(d).session().forward(ids, all_logits=True)
    np.testing.assert_array_equal(native.session().forward(ids, all_logits=True), a)


@pytest.mark.parametrize(
    "name",
    ["model.layers.0.linear_attn.conv1d.weight", "model.layers.2.linear_attn.A_log",
     "model.layers.0.linear_attn.norm.weight", "model.layers.3.input_layernorm.weight"],
)  # fmt: skip
def test_a_mutated_parameter_moves_the_logits_past_the_bound(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path, name: str
) -> None:
    """The bound is not met by accident: zeroing one small parameter of the checkpoint
    moves colibri's logits by far more than RTOL of the largest."""
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    shape = dict(model.named_parameters())[name].shape
    bad = with_tensor(d, tmp_path / "mutated", name, torch.zeros(shape))
    got = load(bad).session().forward(ids, all_logits=True)
    assert float(np.abs(got - ref).max()) > 100 * RTOL * float(np.abs(ref).max())


def test_a_bf16_checkpoint_matches_transformers_on_its_values(tmp_path: Path) -> None:
    """The released files are BF16: the fused projections are cut at 2 bytes a value and
    the convolution (a vector to the loader) widened to F32. Against transformers running
    the very BF16 values in float32."""
    _, model = build_qwen3_next(tmp_path / "f32", seed=2)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16", safe_serialization=True)
    ref_model = model.float()
    ids = prompt_ids(80, vocab=VOCAB)
    got = load(tmp_path / "bf16").session().forward(ids, all_logits=True)
    close(got, reference_logits(ref_model, ids), "bf16 prefill")


def test_qwen3_5_moe_text_model_matches_transformers(tmp_path: Path) -> None:
    """Qwen3.5-MoE's text model (Qwen3_5MoeForCausalLM): the same units, its linear
    projections stored apart, multimodal RoPE that is plain RoPE for text. Prefill,
    token-by-token decode and a greedy continuation."""
    d, model = build_qwen3_next(tmp_path / "q35", seed=3, qwen3_5=True)
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    m = load(d)
    assert (m.config.arch, m.config.linear_layers) == ("qwen3_5_moe", (True, False, True, False))
    close(m.session().forward(ids, all_logits=True), ref, "qwen3.5 prefill")
    close(load(d, chunked=True).session().forward(ids, all_logits=True), ref, "chunked prefill")
    s = m.session()
    s.forward(ids[:100])
    for pos in range(100, N_PROMPT):
        close(s.forward([ids[pos]]), ref[pos], f"qwen3.5 decode position {pos}")
    ref_tokens, _ = reference_greedy(model, ids, 8)
    s = m.session()
    logits = s.forward(ids)
    got = []
    for _ in range(8):
        got.append(int(np.argmax(logits)))
        logits = s.forward([got[-1]])
    assert got == ref_tokens


def test_qwen3_5_moe_multimodal_checkpoint_runs_its_text_model(tmp_path: Path) -> None:
    """The released form (Qwen3_5MoeForConditionalGeneration): text_config, the text
    model under model.language_model, the vision tower skipped; text prompts match
    transformers' multimodal model fed token ids only."""
    d, model = build_qwen3_5_multimodal(tmp_path / "q35-mm", seed=4)
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    m = load(d)
    assert m.config.arch == "qwen3_5_moe" and m.config.hidden_size == 32
    s = m.session()
    ref = reference_logits(model, ids)
    close(s.forward(ids[:-1], all_logits=True), ref[:-1], "qwen3.5 multimodal prefill")
    close(s.forward(ids[-1:]), ref[-1], "qwen3.5 multimodal decode")
