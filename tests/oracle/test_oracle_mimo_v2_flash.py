"""MiMo-V2-Flash against transformers on a tiny random float32 checkpoint
(support/mimo_v2_flash_factory.py): full and sliding layers with different KV heads (1, 2),
RoPE bases (5e6, 1e4) and sinks (sliding only), values narrower than the query/key heads
(8 vs 16) and scaled by 0.6, q/k/v biases, partial RoPE, a dense first layer, grouped
sigmoid routing with a correction bias; a 12-token prompt over a window of 5, and a
20-token continuation.

Every logit at every position within 1e-4 of the largest (issue 33's bound), for one
prefill and for a prefill followed by token-by-token decode; the same greedy 20 tokens.
Each per-layer-type feature is needed: with any one of them read wrongly (config.json
edited) the logits leave the bound. A per-layer tensor of the wrong size is refused at
load with a ModelFormatError naming the tensor and its shape; the multi-token-prediction
weights (model.mtp.*) are ignored as transformers ignores them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import colibri
from colibri.convert import write_container
from colibri.engine.streaming import kv_layer_widths
from colibri.errors import ModelFormatError
from colibri.generate.batching import forward_batch
from support.logit_checks import (
    FAMILY_RTOL,
    assert_decode_matches,
    assert_greedy_matches,
    assert_within,
)
from support.mimo_v2_flash_factory import VOCAB, WINDOW, build_mimo
from support.modelfactory import prompt_ids, reference_greedy, reference_logits

N_PROMPT, N_GREEDY = 12, 20
SEED = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    return build_mimo(tmp_path_factory.mktemp("mimo"), seed=SEED)


def _load(d: Path) -> colibri.Model:
    return colibri.Model.load(d, engine=colibri.EngineConfig(context_length=64))


def _copy(src: Path, dst: Path, cfg_over: dict[str, Any] | None = None,
          tensors: dict[str, torch.Tensor] | None = None) -> Path:  # fmt: skip
    """A copy of the checkpoint with config.json keys and tensors replaced or added."""
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    if cfg_over:
        cfg = json.loads((src / "config.json").read_text())
        cfg.update(cfg_over)
        (dst / "config.json").write_text(json.dumps(cfg))
    if tensors:
        sd = load_file(src / "model.safetensors")
        sd.update(tensors)
        save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_the_model_exercises_what_it_should(tiny: tuple[Path, torch.nn.Module]) -> None:
    d, model = tiny
    assert model.config._attn_implementation == "eager"  # the one with sinks
    cfg = _load(d).config
    assert (cfg.arch, cfg.router, cfg.router_bias, cfg.n_group) == (
        "mimo_v2_flash", "sigmoid_grouped", True, 2)  # fmt: skip
    assert (cfg.n_kv_heads, cfg.sliding_n_kv_heads, cfg.head_dim, cfg.v_head_dim) == (1, 2, 16, 8)
    assert (cfg.rope_theta, cfg.sliding_rope_theta, cfg.rotary_dim) == (5e6, 1e4, 8)
    assert cfg.sliding_layers == (False, True, True, False) and cfg.sliding_window == WINDOW
    assert cfg.moe_layers == (False, True, True, True) and cfg.shared_expert_intermediate_size == 0
    assert cfg.attention_sinks and cfg.sinks_sliding_only and cfg.attention_value_scale == 0.6
    assert N_PROMPT > WINDOW
    attn = [layer.self_attn for layer in model.model.layers]
    assert attn[0].sinks is None and attn[1].sinks is not None
    assert float(attn[1].sinks.abs().min()) > 0.01


def test_kv_rows_per_layer_in_the_core_and_the_budget(tiny: tuple[Path, torch.nn.Module]) -> None:
    """Full layers keep 1 head of 16 + 8, sliding layers 2 heads (in a ring): the core's
    layouts and the budget's widths agree layer by layer."""
    m = _load(tiny[0])
    full, swa = (1, 16, 1, 8), (2, 16, 2, 8)
    assert m._require_core().kv_layouts == [full, swa, swa, full]
    assert kv_layer_widths(m.config) == [(16, 8), (32, 16), (32, 16), (16, 8)]


def test_prefill_and_decode_match_transformers(tiny: tuple[Path, torch.nn.Module]) -> None:
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    m = _load(d)
    assert_within(m.session().forward(ids, all_logits=True), ref, "prefill")
    assert_decode_matches(m.session(), ids, ref, "hf")


def test_greedy_continuation_matches_transformers(tiny: tuple[Path, torch.nn.Module]) -> None:
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref_tokens, ref_logits = reference_greedy(model, ids, N_GREEDY)
    assert_greedy_matches(_load(d).session(), ids, ref_tokens, ref_logits)


def test_batched_rows_equal_alone(tiny: tuple[Path, torch.nn.Module]) -> None:
    """Three sessions in one forward (continuous batching; prompts shorter and longer than
    the window) get the logits each gets alone, bit for bit: per-layer KV heads, value
    widths and RoPE in the batched projections and per-session attention."""
    m = _load(tiny[0])
    prompts = [prompt_ids(n, seed=n, vocab=VOCAB) for n in (3, 12, 7)]
    want = []
    for p in prompts:
        s = m.session()
        want.append([s.forward(p, all_logits=True).copy(), s.forward([5]).copy()])
    sessions = [m.session() for _ in prompts]
    first = forward_batch(sessions, prompts, all_logits=True)
    second = forward_batch(sessions, [[5]] * len(prompts))
    for i, w in enumerate(want):
        assert np.array_equal(first[i], w[0]) and np.array_equal(second[i], w[1]), i


_DEFAULT_ROPE = {"rope_type": "default", "partial_rotary_factor": 0.5}


@pytest.mark.parametrize(
    "over",
    [
        {"attention_value_scale": 1.0},  # the value scale
        {"rope_parameters": {"full_attention": {**_DEFAULT_ROPE, "rope_theta": 5e6},
                             "sliding_attention": {**_DEFAULT_ROPE, "rope_theta": 5e6}}},
        {"sliding_window": WINDOW + 3},  # the window
    ],
    ids=["value-scale", "sliding-rope", "window"],
)
def test_each_per_layer_feature_matters(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path, over: dict[str, Any]
) -> None:
    """The bound is not vacuous: colibri running the checkpoint with one feature read
    differently is far outside it."""
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    got = _load(_copy(d, tmp_path / "mutated", cfg_over=over)).session().forward(
        ids, all_logits=True)
    err = float(np.max(np.abs(got - ref))) / float(np.max(np.abs(ref)))
    assert err > 10 * FAMILY_RTOL, err


def test_zero_sinks_matter(tiny: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    d, model = tiny
    name = "model.layers.1.self_attn.attention_sink_bias"
    bad = _copy(d, tmp_path / "nosinks", tensors={name: torch.full((4,), -30.0)})
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    got = _load(bad).session().forward(ids, all_logits=True)
    err = float(np.max(np.abs(got - ref))) / float(np.max(np.abs(ref)))
    assert err > 10 * FAMILY_RTOL, err


def test_mtp_weights_are_ignored(tiny: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    d, model = tiny
    extra = {"model.mtp.layers.0.self_attn.q_proj.weight": torch.ones(3, 5),
             "model.mtp.layers.0.final_layernorm.weight": torch.ones(7)}  # fmt: skip
    m = _load(_copy(d, tmp_path / "mtp", tensors=extra))
    assert m.config.n_mtp_layers == 0
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    assert_within(m.session().forward(ids, all_logits=True), reference_logits(model, ids), "mtp")


@pytest.mark.parametrize(
    ("name", "shape", "canonical"),
    [
        # a sliding layer's k/v with the full layers' single KV head
        ("model.layers.1.self_attn.k_proj.weight", (16, 32), "blk.1.attn_k"),
        ("model.layers.2.self_attn.v_proj.weight", (8, 32), "blk.2.attn_v"),
        # a full layer's k with the sliding layers' two; values head_dim wide
        ("model.layers.3.self_attn.k_proj.weight", (32, 32), "blk.3.attn_k"),
        ("model.layers.0.self_attn.v_proj.weight", (16, 32), "blk.0.attn_v"),
        ("model.layers.0.self_attn.o_proj.weight", (32, 64), "blk.0.attn_output"),
        ("model.layers.2.self_attn.v_proj.bias", (8,), "blk.2.attn_v.bias"),
        ("model.layers.2.self_attn.attention_sink_bias", (2,), "blk.2.attn_sinks"),
        ("model.layers.1.mlp.gate.e_score_correction_bias", (9,), "blk.1.exp_probs_b"),
    ],
)
def test_a_tensor_of_the_wrong_size_is_refused(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path, name: str, shape: tuple[int, ...],
    canonical: str,
) -> None:
    d = _copy(tiny[0], tmp_path / "bad", tensors={name: torch.ones(shape)})
    shown = "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    with pytest.raises(ModelFormatError, match=rf"'{canonical}' has shape {re.escape(shown)}"):
        _load(d)


def test_a_sink_on_a_full_layer_is_refused(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """transformers has no sink on full layers; a checkpoint carrying one is not this
    model."""
    d = _copy(tiny[0], tmp_path / "bad",
              tensors={"model.layers.0.self_attn.attention_sink_bias": torch.ones(4)})  # fmt: skip
    with pytest.raises(ModelFormatError, match="blk.0.attn_sinks"):
        _load(d)


def test_native_container_matches_transformers(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """``colibri convert`` keeps the per-layer-type fields: the container runs the same."""
    d, model = tiny
    out = tmp_path / "mimo.colibri"
    write_container(d, out)
    m = _load(out)
    assert (m.config.sliding_n_kv_heads, m.config.sliding_rope_theta, m.config.v_head_dim,
            m.config.attention_value_scale, m.config.sinks_sliding_only) == (2, 1e4, 8, 0.6, True)
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    assert_within(m.session().forward(ids, all_logits=True), reference_logits(model, ids),
                  "container")  # fmt: skip
