"""gpt-oss's FFN side and loading: the clamped SwiGLU against a scalar reference, its
routing (top-k of the biased logits, softmax over the k) against transformers', the fused
float experts re-laid out for the engine, the whole MoE stack against transformers with
attention neutralized (from the checkpoint, and from llama.cpp's converter's GGUF of it),
and bad input.

The full oracle (sinks, sliding windows and the o_proj bias included) is
tests/oracle/test_oracle_gpt_oss.py. The models here have every o_proj weight and bias zero
(support/gpt_oss_factory.py): attention adds exactly nothing to the residual stream, so
what they check is the FFN side and the loading alone.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import colibri
from colibri import _core
from colibri.convert import write_container
from colibri.errors import ModelFormatError, ModelIOError, UnsupportedError
from colibri.sources import load_hf
from colibri.sources.validate import check_config
from support import streaming_helpers as sh
from support.deepseek_factory import convert_with_llama_cpp
from support.gpt_oss_factory import (
    LIMIT,
    VOCAB,
    build_gpt_oss,
    clamp_shares,
    write_mxfp4_pair,
)
from support.logit_checks import assert_decode_matches, assert_greedy_matches, assert_within
from support.modelfactory import prompt_ids, reference_greedy, reference_logits

N_PROMPT, N_GREEDY = 12, 20


@pytest.fixture(autouse=True)
def _side_files_in_tmp(tmp_path_factory: pytest.TempPathFactory,
                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # The experts' side files (sources/fused_experts.py) go under XDG_CACHE_HOME.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg"))


@pytest.fixture(scope="module")
def neutral(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    return build_gpt_oss(tmp_path_factory.mktemp("gpt-oss-neutral"), neutral_attention=True)


# --------------------------------------------------------------------------- pieces


def test_swiglu_oai_matches_the_scalar_formula() -> None:
    rng = np.random.default_rng(0)
    gate = rng.normal(0, 3, 4096).astype(np.float32)
    up = rng.normal(0, 3, 4096).astype(np.float32)
    limit, alpha = 2.0, 1.702
    got = _core.swiglu_oai(gate, up, limit, alpha)
    g = np.minimum(gate.astype(np.float64), limit)
    u = np.clip(up.astype(np.float64), -limit, limit)
    want = (u + 1) * g / (1 + np.exp(-alpha * g))
    assert (gate > limit).any() and (np.abs(up) > limit).any()  # both clamps act
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_routing_is_softmax_over_the_top_k_of_the_biased_logits() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, (64, 8)).astype(np.float32)
    bias = rng.normal(0, 1, 8).astype(np.float32)
    experts, weights = _core.route(_core.RouterKind.softmax_topk, logits + bias, 2,
                                   norm_topk_prob=True)  # fmt: skip
    top, idx = torch.topk(torch.from_numpy(logits + bias), 2, dim=-1)
    np.testing.assert_array_equal(experts, idx.numpy())
    np.testing.assert_allclose(weights, torch.softmax(top, dim=1).numpy(), rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- loading


def test_config_and_relaid_out_experts(neutral: tuple[Path, torch.nn.Module]) -> None:
    d, model = neutral
    m = load_hf(d)
    cfg = m.config
    assert (cfg.arch, cfg.activation, cfg.swiglu_limit) == ("gpt_oss", "swiglu_oai", LIMIT)
    assert cfg.sliding_layers == (True, False, True, False) and cfg.sliding_window == 4
    assert cfg.attention_sinks and cfg.attention_bias and cfg.attention_out_bias
    assert cfg.router_logit_bias and cfg.expert_bias and cfg.norm_topk_prob
    assert cfg.rope_scaling is not None and cfg.rope_scaling["truncate"] is False

    def read(name: str) -> np.ndarray:
        t = m.tensors[name]
        (e,) = t.extents
        raw = np.fromfile(m.files[e.file], dtype=np.float32, count=e.length // 4, offset=e.offset)
        return raw.reshape(t.shape)

    experts = model.model.layers[1].mlp.experts
    gu, gub = experts.gate_up_proj[3].numpy(), experts.gate_up_proj_bias.numpy()
    np.testing.assert_array_equal(read("blk.1.ffn_gate_exps.3"), gu[:, ::2].T)
    np.testing.assert_array_equal(read("blk.1.ffn_up_exps.3"), gu[:, 1::2].T)
    np.testing.assert_array_equal(read("blk.1.ffn_down_exps.3"), experts.down_proj[3].numpy().T)
    np.testing.assert_array_equal(read("blk.1.ffn_gate_exps.bias"), gub[:, ::2])
    np.testing.assert_array_equal(read("blk.1.ffn_up_exps.bias"), gub[:, 1::2])
    np.testing.assert_array_equal(read("blk.1.ffn_down_exps.bias"), experts.down_proj_bias.numpy())
    side = m.files[-1]
    before = side.stat().st_mtime_ns
    assert load_hf(d).files[-1] == side and side.stat().st_mtime_ns == before  # reused


def test_bf16_experts_are_moved_exactly(
    neutral: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """BF16 (the float release's dtype): matrices keep their 16 bits, biases are widened
    to F32 exactly."""
    _, model = neutral
    d = tmp_path / "bf16"
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    m = load_hf(d)
    experts = model.model.layers[2].mlp.experts
    gu = experts.gate_up_proj[5].to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    t = m.tensors["blk.2.ffn_up_exps.5"]
    (e,) = t.extents
    assert t.dtype == "BF16"
    got = np.fromfile(m.files[e.file], dtype="<u2", count=e.length // 2, offset=e.offset)
    np.testing.assert_array_equal(got.reshape(t.shape), gu[:, 1::2].T)
    b = m.tensors["blk.2.ffn_down_exps.bias"]
    (e,) = b.extents
    assert b.dtype == "F32"
    got_b = np.fromfile(m.files[e.file], dtype="<f4", count=e.length // 4, offset=e.offset)
    want_b = experts.down_proj_bias.to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(got_b.reshape(b.shape), want_b)


# --------------------------------------------------------------------------- the MoE stack


def _load(d: Path) -> colibri.Model:
    return colibri.Model.load(d, engine=colibri.EngineConfig(context_length=64))


def test_moe_stack_matches_transformers(
    neutral: tuple[Path, torch.nn.Module],
) -> None:
    d, model = neutral
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    gate_share, up_share = clamp_shares(model, ids)
    assert 0.05 < gate_share < 0.95 and 0.05 < up_share < 0.95, (gate_share, up_share)
    ref = reference_logits(model, ids)
    m = _load(d)
    assert_within(m.session().forward(ids, all_logits=True), ref, "prefill")
    assert_decode_matches(m.session(), ids, ref, "hf")
    ref_tokens, ref_greedy_logits = reference_greedy(model, ids, N_GREEDY)
    assert_greedy_matches(m.session(), ids, ref_tokens, ref_greedy_logits)


def test_llama_cpp_gguf_matches_transformers(
    tmp_path: Path,
) -> None:
    """The same MoE stack through llama.cpp's converter (F32): its names, its de-interleaved
    and transposed experts, its metadata; llama.cpp fixes the clamp at 7.0 (its files do not
    carry it), so this model has that limit and experts scaled for the clamp to act."""
    d, model = build_gpt_oss(tmp_path / "hf", neutral_attention=True, swiglu_limit=7.0,
                             expert_scale=10.0)  # fmt: skip
    out = tmp_path / "gpt-oss.f32.gguf"
    convert_with_llama_cpp(d, out, "f32")
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    gate_share, up_share = clamp_shares(model, ids)
    assert 0.05 < gate_share < 0.95 and 0.05 < up_share < 0.95, (gate_share, up_share)
    m = _load(out)
    cfg = m.config
    assert (cfg.arch, cfg.swiglu_limit, cfg.sliding_window, cfg.sliding_layers) == (
        "gpt_oss",
        7.0,
        4,
        (True, False, True, False),
    )
    assert cfg.attention_sinks and cfg.attention_out_bias and cfg.expert_bias
    assert_within(m.session().forward(ids, all_logits=True), reference_logits(model, ids), "gguf")


# --------------------------------------------------------------------------- bad input


def _rewrite(d: Path, name: str, value: torch.Tensor) -> None:
    f = d / "model.safetensors"
    sd = load_file(f)
    sd[name] = value
    save_file(sd, f, metadata={"format": "pt"})


def test_expert_bias_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    d, _ = build_gpt_oss(tmp_path / "m", neutral_attention=True)
    _rewrite(d, "model.layers.2.mlp.experts.gate_up_proj_bias", torch.zeros(8, 30))
    with pytest.raises(ModelFormatError, match=r"gate_up_proj_bias.*\(8, 30\).*\(8, 32\)"):
        load_hf(d)


def test_router_bias_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    d, _ = build_gpt_oss(tmp_path / "m", neutral_attention=True)
    _rewrite(d, "model.layers.0.mlp.router.bias", torch.zeros(7))
    with pytest.raises(ModelFormatError, match=r"ffn_gate_inp\.bias.*\(7,\).*\(8,\)"):
        load_hf(d)


def test_unknown_activation_and_bad_limits_are_refused(
    neutral: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    cfg = load_hf(neutral[0]).config
    with pytest.raises(UnsupportedError, match="activation 'gelu' is not implemented"):
        check_config(dataclasses.replace(cfg, activation="gelu"), "here")  # type: ignore[arg-type]
    for limit in (0.0, -1.0, float("inf")):
        with pytest.raises(ModelFormatError, match="swiglu_limit"):
            check_config(dataclasses.replace(cfg, swiglu_limit=limit), "here")
    d, _ = build_gpt_oss(tmp_path / "m", neutral_attention=True)
    raw = json.loads((d / "config.json").read_text())
    raw["swiglu_limit"] = "7"
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelFormatError, match="swiglu_limit"):
        load_hf(d)


def test_a_cache_without_room_for_the_side_file_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-laid-out experts need their size free in the cache directory: checked before
    anything is written, and nothing is left behind."""
    import shutil

    from colibri.sources import fused_experts

    d, _ = build_gpt_oss(tmp_path / "m", neutral_attention=True)
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    full = shutil.disk_usage(tmp_path)._replace(free=1000)
    monkeypatch.setattr(fused_experts.shutil, "disk_usage", lambda _p: full)
    with pytest.raises(ModelIOError, match=r"GiB free; set XDG_CACHE_HOME"):
        load_hf(d)
    assert not any(p.is_file() for p in cache.rglob("*"))


def test_mxfp4_scales_that_do_not_match_their_blocks_are_refused(tmp_path: Path) -> None:
    d, _ = build_gpt_oss(tmp_path / "f", neutral_attention=True, intermediate_size=32)
    mx = tmp_path / "mx"
    write_mxfp4_pair(d, mx, tmp_path / "deq")
    _rewrite(mx, "model.layers.1.mlp.experts.down_proj_scales",
             torch.zeros(8, 32, 2, dtype=torch.uint8))  # fmt: skip
    with pytest.raises(ModelFormatError, match="scales shape .* does not match blocks"):
        load_hf(mx)


# --------------------------------------------------------------------------- MXFP4


def test_mxfp4_checkpoint_runs_as_its_dequantized_float(
    tmp_path: Path,
) -> None:
    """MXFP4 experts as released (``*_blocks`` / ``*_scales``) against the float32
    checkpoint of their exact dequantization, both with float32 activations: the core's
    MXFP4 rows decode to those very floats, so only summation order may differ (measured:
    not at all, 0.0; bound: the float oracles' 1e-5, tests/oracle/test_oracle_hf.py); and
    that float checkpoint against transformers. (With int8 activations the two differ by
    about 4e-3 of the largest logit: the activations' rounding, as in llama.cpp.)"""
    d, model = build_gpt_oss(tmp_path / "f", neutral_attention=True, intermediate_size=32)
    mx, deq = tmp_path / "mx", tmp_path / "deq"
    values = write_mxfp4_pair(d, mx, deq)
    m = load_hf(mx)
    assert m.tensors["blk.0.ffn_gate_exps.0"].dtype == "MXFP4"
    engine = colibri.EngineConfig(context_length=64, activation_precision="float32")
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    got = colibri.Model.load(mx, engine=engine).session().forward(ids, all_logits=True)
    want = colibri.Model.load(deq, engine=engine).session().forward(ids, all_logits=True)
    err = float(np.abs(got - want).max())
    assert err <= 1e-5 * float(np.abs(want).max()), err
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            for part in ("gate_up_proj", "down_proj"):
                key = f"model.layers.{i}.mlp.experts.{part}"
                getattr(layer.mlp.experts, part).copy_(torch.from_numpy(values[key]))
    assert_within(want, reference_logits(model, ids), "dequantized float vs transformers")


def test_mxfp4_streams_bit_identically_to_resident(
    tmp_path: Path,
) -> None:
    """The side file's experts through an expert cache of 3 slots (8 experts, top-2):
    the same logits, bit for bit, as with every expert resident."""
    d, _ = build_gpt_oss(tmp_path / "f", neutral_attention=True, intermediate_size=32)
    mx = tmp_path / "mx"
    write_mxfp4_pair(d, mx, tmp_path / "deq")
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    for precision in ("float32", "int8"):
        resident = colibri.Model.load(mx, engine=sh.engine(precision=precision,
                                                           context_length=64))  # fmt: skip
        want = sh.run_trace(resident, ids)
        budget = sh.budget_for_slots(mx, 3, precision=precision, context_length=64)
        streamed = colibri.Model.load(mx, engine=sh.engine(budget=budget, precision=precision,
                                                           context_length=64))  # fmt: skip
        stats = streamed.stats().memory
        assert stats is not None and stats.cache_slots == 3
        sh.assert_same_trace(sh.run_trace(streamed, ids, want.decode_ids), want, precision)


def test_native_container_keeps_the_model(tmp_path: Path) -> None:
    """``colibri convert`` (quant keep) of the MXFP4 checkpoint: the config round-trips
    (sliding_layers as a tuple, the activation and its clamp) and the logits are the same
    bits."""
    d, _ = build_gpt_oss(tmp_path / "f", neutral_attention=True, intermediate_size=32)
    mx = tmp_path / "mx"
    write_mxfp4_pair(d, mx, tmp_path / "deq")
    out = tmp_path / "gpt-oss.colibri"
    write_container(mx, out)
    engine = colibri.EngineConfig(context_length=64, activation_precision="float32")
    a, b = colibri.Model.load(mx, engine=engine), colibri.Model.load(out, engine=engine)
    assert b.config == a.config and b.config.sliding_layers == (True, False, True, False)
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    np.testing.assert_array_equal(b.session().forward(ids, all_logits=True),
                                  a.session().forward(ids, all_logits=True))  # fmt: skip
