"""DeepSeek-V4 against transformers on tiny random float32 checkpoints
(support/deepseek_v4_factory.py): 3 layers, every one ``sliding_attention`` with a
5-position window (the prompt is 12 tokens), layer 0 hash-routed and layers 1-2 routed by
sqrt-softplus scores with a correction bias that changes choices, a SwiGLU clamp that
bites, hyper-connections of 3 streams with 5 Sinkhorn iterations (and a model with one
stream).

Every logit at every position within 1e-4 of the largest, for one prefill and for a
prefill followed by token-by-token decode; the same greedy 20 tokens; a checkpoint with
one parameter changed (a hyper-connection base, a sink, a hash table row) missing that
bound, so the comparison sees each part; and the inputs colibri does not run refused:
an unknown layer type, an unknown MLP type, a hash table of the wrong
shape or naming an expert the layer does not have.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import colibri
from colibri.convert import write_container
from colibri.engine.streaming import kv_floats_per_token
from colibri.errors import ModelFormatError
from colibri.generate.batching import forward_batch
from support.checkpoint_edits import with_config, with_tensor
from support.deepseek_v4_factory import VOCAB, build_deepseek_v4, clamp_and_bias_bite
from support.logit_checks import assert_decode_matches, assert_greedy_matches, assert_within
from support.modelfactory import prompt_ids, reference_greedy, reference_logits

RTOL = 1e-4
N_PROMPT, N_GREEDY = 12, 20
Tiny = tuple[Path, torch.nn.Module]


@pytest.fixture(scope="module", params=[3, 1], ids=["hc3", "hc1"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    hc = request.param
    return build_deepseek_v4(tmp_path_factory.mktemp(f"deepseek-v4-hc{hc}"), seed=3, hc_mult=hc)


def _err(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    return float(np.abs(got - ref).max()), RTOL * float(np.abs(ref).max())


def _close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert_within(got, ref, what, RTOL)


def _load(d: Path) -> colibri.Model:
    return colibri.Model.load(d, engine=colibri.EngineConfig(context_length=64))


def test_the_model_exercises_what_it_should(tiny: Tiny) -> None:
    d, model = tiny
    cfg = _load(d).config
    assert (cfg.arch, cfg.attention, cfg.router, cfg.activation) == (
        "deepseek_v4", "v4_sliding", "sqrt_softplus", "swiglu_clamp")  # fmt: skip
    assert (cfg.hash_layers, cfg.router_bias, cfg.sliding_window) == ((True, False, False), True, 5)
    assert (cfg.hc_mult, cfg.hc_sinkhorn_iters, cfg.rotary_dim, cfg.o_groups) == (
        model.config.hc_mult, 5, 8, 2)  # fmt: skip
    assert cfg.sliding_window < N_PROMPT
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ids += reference_greedy(model, ids, N_GREEDY)[0]
    clamped, changed = clamp_and_bias_bite(model, ids)
    assert clamped > 0, "the SwiGLU clamp never changes a value"
    assert changed > 0, "the correction bias never changes a choice"


def test_the_kv_cache_keeps_one_row_per_position(tiny: Tiny) -> None:
    """K = V: one head_dim row per position and layer, in the core and in the budget."""
    m = _load(tiny[0])
    c = m.config
    assert m._require_core().kv_layouts == [(1, c.head_dim, 0, 0)] * c.n_layers
    assert kv_floats_per_token(c) == c.head_dim * c.n_layers


def test_prefill_and_decode_match_transformers(tiny: Tiny) -> None:
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    m = _load(d)
    _close(m.session().forward(ids, all_logits=True), ref, "prefill")
    assert_decode_matches(m.session(), ids, ref, "hf")


def test_the_hyper_connections_have_their_own_phase(tiny: Tiny) -> None:
    m = _load(tiny[0])
    m.session().forward(prompt_ids(N_PROMPT, vocab=VOCAB))
    phases = m.stats().phases
    assert phases.hyper_conn > 0 and phases.attention > 0, phases


def test_sigmoid_scoring_matches_transformers(tmp_path: Path) -> None:
    """scoring_func "sigmoid" (DeepSeek-V3's rule with one group), hash layer included."""
    d, model = build_deepseek_v4(tmp_path / "sigmoid", seed=4, scoring_func="sigmoid")
    m = _load(d)
    assert m.config.router == "sigmoid_grouped"
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    _close(m.session().forward(ids, all_logits=True), reference_logits(model, ids), "sigmoid")


def test_greedy_continuation_matches_transformers(tiny: Tiny) -> None:
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref_tokens, ref_logits = reference_greedy(model, ids, N_GREEDY)
    assert_greedy_matches(_load(d).session(), ids, ref_tokens, ref_logits)


def test_hash_layers_are_prefetched_exactly(tmp_path: Path) -> None:
    """Every layer hash-routed, experts streamed through 8 cache slots: the experts of
    each decode step's layers are read ahead from the token id alone (the first layer's
    before its attention, the others by the lookahead), every one of them used, and the
    logits still those of transformers, bit for bit those of the resident model."""
    d, model = build_deepseek_v4(tmp_path / "hash", seed=3, mlp_layer_types=["hash_moe"] * 3)
    no_history = colibri.CacheConfig(history=False)
    probe = colibri.Model.load(d, engine=colibri.EngineConfig(context_length=64, cache=no_history))
    mem = probe.stats().memory
    assert mem is not None
    engine = colibri.EngineConfig(
        context_length=64, cache=no_history, io=colibri.IOConfig(workers=1, prefetch=True),
        ram_budget=mem.dense_bytes + mem.kv_bytes + mem.work_bytes + 8 * mem.slot_bytes,
    )  # fmt: skip
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    resident = probe.session()
    resident.forward(ids[:4])
    with colibri.Model.load(d, engine=engine) as m:
        s = m.session()
        s.forward(ids[:4])
        for pos in range(4, N_PROMPT):
            got = s.forward([ids[pos]])
            _close(got, ref[pos], f"streamed decode position {pos}")
            assert np.array_equal(got, resident.forward([ids[pos]])), pos  # streamed == resident
        e = m.stats().experts
    assert e.prefetch_candidates > 0, e
    assert e.prefetch_candidates_used == e.prefetch_candidates and e.prefetch_wasted == 0, e


def test_batched_rows_equal_alone(tiny: Tiny) -> None:
    """Three sessions in one forward (continuous batching) get the logits each gets alone,
    bit for bit: the hyper-connections, the hash lookup and the attention are per row."""
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


def _release_name(name: str) -> str:
    """transformers' save_pretrained name -> the name DeepSeek's release uses (the source
    side of transformers' conversion mapping for deepseek_v4)."""
    name = name.removeprefix("model.")
    return {"embed_tokens.weight": "embed.weight", "hc_head.hc_fn": "hc_head_fn",
            "hc_head.hc_base": "hc_head_base", "hc_head.hc_scale": "hc_head_scale"}.get(name, name)


def test_the_release_naming_loads_the_same(tiny: Tiny, tmp_path: Path) -> None:
    d = _copy(tiny[0], tmp_path / "release")
    sd = load_file(tiny[0] / "model.safetensors")
    renamed = {_release_name(k): v for k, v in sd.items()}
    assert "embed.weight" in renamed and "layers.0.attn.wq_a.weight" in renamed
    save_file(renamed, d / "model.safetensors", metadata={"format": "pt"})
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    _close(_load(d).session().forward(ids, all_logits=True), reference_logits(tiny[1], ids),
           "release naming")


def test_saved_forked_and_rolled_back_sessions_continue_exactly(tiny: Tiny, tmp_path: Path) -> None:
    """The K = V cache through a session file, a fork and a rollback: the next logits are
    the ones the session itself gives, bit for bit."""
    m = _load(tiny[0])
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    s = m.session()
    s.forward(ids[:-1])
    s.save(tmp_path / "v4.session")
    fork = s.fork()
    want = s.forward(ids[-1:]).copy()
    assert np.array_equal(m.load_session(tmp_path / "v4.session").forward(ids[-1:]), want)
    assert np.array_equal(fork.forward(ids[-1:]), want)
    s.forward([7, 9])
    s.rollback(2)
    assert np.array_equal(s.forward([5]), fork.forward([5]))


def test_the_container_runs_it(tiny: Tiny, tmp_path: Path) -> None:
    """``colibri convert``: kept as it is, the same logits bit for bit; in Q8_0, the
    hyper-connection projections and the hash tables stay F32 (the core reads them so) and
    the model runs."""
    d = tiny[0]
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    want = _load(d).session().forward(ids, all_logits=True)
    write_container(d, tmp_path / "keep")
    assert np.array_equal(_load(tmp_path / "keep").session().forward(ids, all_logits=True), want)
    write_container(d, tmp_path / "q8", quant="q8_0")
    m = _load(tmp_path / "q8")
    types = {n: t.dtype for n, t in m.manifest.tensors.items()}
    assert types["blk.0.attn_q_a"] == "Q8_0"  # 32 columns: whole Q8_0 blocks
    assert {types[n] for n in ("output_hc_fn", "blk.1.hc_attn_fn", "blk.2.hc_ffn_fn",
                               "blk.0.ffn_hash_eid")} == {"F32"}  # fmt: skip
    got = m.session().forward(ids, all_logits=True)
    assert np.isfinite(got).all() and got.shape == want.shape


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


_MUTATIONS = {
    # A hyper-connection's comb base of the last layer, the first layer's sinks, one token's
    # hash-table row (the prompt's first token routed to two other experts).
    "hc_base": ("model.layers.2.hc_ffn_base", lambda t: t + 0.5),
    "sinks": ("model.layers.0.attn.attn_sink", lambda t: t + 1.0),
    "tid2eid": ("model.layers.0.ffn.gate.tid2eid", None),
}


@pytest.mark.parametrize("what", sorted(_MUTATIONS))
def test_a_changed_parameter_misses_the_bound(tiny: Tiny, tmp_path: Path, what: str) -> None:
    """Not vacuous: colibri on a checkpoint with one parameter changed is outside the
    bound against transformers on the original."""
    d, model = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    name, change = _MUTATIONS[what]
    value = load_file(d / "model.safetensors")[name].clone()
    if change is None:  # the prompt's first token to experts its row does not hold
        row = [e for e in range(model.config.n_routed_experts) if e not in value[ids[0]].tolist()]
        value[ids[0]] = torch.tensor(row[: value.shape[1]])
    else:
        value = change(value)
    bad = with_tensor(d, tmp_path / "changed", name, value)
    got = _load(bad).session().forward(ids, all_logits=True)
    err, tol = _err(got, reference_logits(model, ids))
    assert err > tol, f"{what}: changing it moved no logit past the bound ({err:.3g})"


@pytest.mark.parametrize(
    ("key", "types", "error", "match"),
    [
        ("layer_types", ["sliding_attention", "full_attention", "sliding_attention"],
         ModelFormatError, "unknown layer types full_attention"),
        ("mlp_layer_types", ["hash_moe", "dense", "moe"], ModelFormatError,
         "unknown layer types dense"),
        ("mlp_layer_types", ["moe", "moe", "moe"], ModelFormatError,
         "layer 0 is not a hash_moe layer"),
    ],
)  # fmt: skip
def test_layer_types_colibri_does_not_run_are_refused(
    tiny: Tiny, tmp_path: Path, key: str, types: list[str], error: type[Exception], match: str
) -> None:
    d = with_config(tiny[0], tmp_path / "bad", **{key: types})
    with pytest.raises(error, match=match):
        _load(d)


def test_a_hash_table_of_the_wrong_shape_is_refused(tiny: Tiny, tmp_path: Path) -> None:
    name = "model.layers.0.ffn.gate.tid2eid"
    table = load_file(tiny[0] / "model.safetensors")[name]
    d = with_tensor(tiny[0], tmp_path / "rows", name, table[: VOCAB - 1].clone())
    with pytest.raises(ModelFormatError, match=rf"has shape \({VOCAB - 1}, 2\).*vocab_size"):
        _load(d)
    d = with_tensor(tiny[0], tmp_path / "cols", name, table[:, :1].clone())
    with pytest.raises(ModelFormatError, match=r"has shape \(128, 1\)"):
        _load(d)


def test_a_hash_table_naming_a_missing_expert_is_refused(tiny: Tiny, tmp_path: Path) -> None:
    name = "model.layers.0.ffn.gate.tid2eid"
    table = load_file(tiny[0] / "model.safetensors")[name].clone()
    table[7, 1] = 8  # the layers have experts 0..7
    d = with_tensor(tiny[0], tmp_path / "bad", name, table)
    with pytest.raises(ModelFormatError, match="names expert 8, outside the layer's 8 experts"):
        _load(d)
