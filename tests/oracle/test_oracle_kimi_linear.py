"""Kimi-Linear against transformers on a tiny random float32 checkpoint
(support/kimi_linear_factory.py): Kimi Delta Attention layers (0, 1 and 3: channel-wise
decay, sigmoid output gate) and a NoPE MLA layer (2), a dense first FFN then a MoE FFN
with sigmoid group-limited routing, a selection bias and a shared expert. The prompt (140
tokens) is longer than two of the 64-token chunks transformers' prefill computes the delta
rule in (chunk_kimi_delta_attention); its decode runs the recurrent form
(recurrent_kimi_delta_attention), which colibri runs throughout; its chunked form,
switched on here for forwards of 64 tokens or more, is checked against transformers and
the recurrent form.

Every logit at every position within 1e-4 of the largest, for one prefill, for a prefill
in chunks and for a prefill followed by token-by-token decode; the same greedy 20 tokens;
a mutation of one small parameter moves the logits far past that bound, so the bound is
not met by accident.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import colibri
from support.checkpoint_edits import with_tensor
from support.kimi_linear_factory import VOCAB, build_kimi_linear
from support.linear_attn_models import assert_forms_agree, load
from support.logit_checks import assert_decode_matches, assert_greedy_matches, assert_within
from support.modelfactory import prompt_ids, reference_greedy, reference_logits

RTOL = 1e-4
N_PROMPT, N_GREEDY = 140, 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    return build_kimi_linear(tmp_path_factory.mktemp("kimi-linear"), seed=0)


def test_the_model_exercises_what_it_should(tiny: tuple[Path, torch.nn.Module]) -> None:
    d, model = tiny
    cfg = load(d).config
    assert cfg.arch == "kimi_linear" and cfg.linear_kda and cfg.is_mla and cfg.mla_no_rope
    assert cfg.linear_layers == (True, True, False, True)
    assert cfg.moe_layers == (False, True, True, True)
    assert (cfg.router, cfg.router_bias, cfg.n_group) == ("sigmoid_grouped", True, 2)
    assert cfg.shared_expert_intermediate_size == 8 and cfg.q_lora_rank == 0
    fg = model.model.layers[0].self_attn.forget_gate
    assert float(fg.A_log.std()) > 0.1 and float(fg.dt_bias.std()) > 0.1


@pytest.mark.parametrize("chunked", [False, True], ids=["recurrent", "chunked"])
def test_prefill_and_decode_match_transformers(
    tiny: tuple[Path, torch.nn.Module], chunked: bool
) -> None:
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    m = load(d, chunked=chunked)
    assert_within(m.session().forward(ids, all_logits=True), ref, "prefill", RTOL)
    assert_decode_matches(m.session(), ids, ref, "hf")  # 70 tokens at once, then one by one


def test_chunked_prefill_matches_transformers(tiny: tuple[Path, torch.nn.Module]) -> None:
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    s = load(d, prefill_chunk=48).session()
    assert_within(s.forward(ids, all_logits=True), ref, "prefill in chunks of 48", RTOL)


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
    """``colibri convert`` keeps the joined convolution vector, A_log as a vector and the
    new config fields (linear_kda, mla_no_rope): the container's logits are the
    checkpoint's, bit for bit."""
    from colibri.convert import verify_container, write_container

    d, _ = tiny
    write_container(d, tmp_path / "native")
    verify_container(tmp_path / "native")
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    native = load(tmp_path / "native")
    assert native.config.linear_kda and native.config.mla_no_rope
    a = load(d).session().forward(ids, all_logits=True)
    np.testing.assert_array_equal(native.session().forward(ids, all_logits=True), a)


def test_a_bf16_checkpoint_matches_transformers_on_its_values(tmp_path: Path) -> None:
    """BF16 files: the three convolutions joined at 2 bytes a value and widened to F32 with
    A_log and dt_bias. Against transformers running the very BF16 values in float32."""
    _, model = build_kimi_linear(tmp_path / "f32", seed=2)
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16", safe_serialization=True)
    ref_model = model.float()
    ids = prompt_ids(80, vocab=VOCAB)
    got = load(tmp_path / "bf16").session().forward(ids, all_logits=True)
    assert_within(got, reference_logits(ref_model, ids), "bf16 prefill", RTOL)


def test_the_released_names_of_the_dense_mlp_load(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """transformers saves the dense layers' MLP under ``block_sparse_moe.`` (it renames
    every ``mlp.`` on save); the released checkpoints name it ``mlp.``: both load alike."""
    d, _ = tiny
    dst = tmp_path / "released"
    dst.mkdir()
    for f in d.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    sd = load_file(d / "model.safetensors")
    sd = {k.replace("layers.0.block_sparse_moe.", "layers.0.mlp."): v for k, v in sd.items()}
    assert "model.layers.0.mlp.down_proj.weight" in sd
    save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(40, vocab=VOCAB)
    np.testing.assert_array_equal(load(dst).session().forward(ids, all_logits=True),
                                  load(d).session().forward(ids, all_logits=True))  # fmt: skip


@pytest.mark.parametrize(
    "name",
    ["model.layers.0.self_attn.k_conv1d.weight", "model.layers.1.self_attn.A_log",
     "model.layers.3.self_attn.dt_bias", "model.layers.0.self_attn.o_norm.weight",
     "model.layers.1.self_attn.g_b_proj.weight", "model.layers.2.self_attn.kv_a_layernorm.weight",
     "model.layers.2.block_sparse_moe.gate.e_score_correction_bias"],
)  # fmt: skip
def test_a_mutated_parameter_moves_the_logits_past_the_bound(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path, name: str
) -> None:
    """The bound is not met by accident: zeroing one small parameter of the checkpoint
    moves colibri's logits by far more than RTOL of the largest."""
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    shape = load_file(d / "model.safetensors")[name].shape
    bad = with_tensor(d, tmp_path / "mutated", name, torch.zeros(shape))
    got = load(bad).session().forward(ids, all_logits=True)
    assert float(np.abs(got - ref).max()) > 100 * RTOL * float(np.abs(ref).max())


def test_a_layer_neither_list_names_is_refused(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """Without layer_types, linear_attn_config's lists give the schedule: a layer in
    neither is refused, not guessed."""
    d, _ = tiny
    dst = tmp_path / "gap"
    dst.mkdir()
    for f in d.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((d / "config.json").read_text())
    del cfg["layer_types"]
    cfg["linear_attn_config"]["kda_layers"] = [1, 2]  # layer 4 (index 3) in neither list
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(colibri.errors.UnsupportedError, match="layer 3 has kind None"):
        load(dst)


def test_an_unknown_layer_kind_is_refused(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    d, _ = tiny
    dst = tmp_path / "odd"
    dst.mkdir()
    for f in d.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((d / "config.json").read_text())
    cfg["layer_types"][1] = "sliding_attention"
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(colibri.errors.UnsupportedError, match="sliding_attention"):
        load(dst)
