"""The DeepSeek-V3 / GLM family against transformers, on tiny F32 checkpoints of every
variant (deepseek_factory.VARIANTS): MLA with and without q-LoRA, DSA with keys really
dropped, the sigmoid group-limited and DeepSeek-V2 routers with a non-zero selection bias,
GLM-4.5's GQA with partial rotary, QK-norm and biases.

Same weights, same F32 arithmetic up to summation order (and MLA's absorbed form, which
reassociates the key and value up-projections): every logit at every position of a
32-token input within 1e-4 of the largest logit, prefilled at once and prefilled then
decoded token by token, and the same greedy 20-token continuation.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import colibri
from colibri.engine.streaming import kv_floats_per_token
from support.deepseek_factory import (
    FAMILY,
    N_LAYERS,
    VARIANTS,
    TinyDeepseek,
    config_variant,
    prompt_ids,
    transformers_model,
)
from support.logit_checks import assert_logits_close, assert_same_greedy
from support.modelfactory import reference_greedy, reference_logits

N_PROMPT = 32
SIGMOID_VARIANTS = [v for v in VARIANTS if FAMILY[v] != "deepseek_v2"]
MTP_VARIANTS = [v for v in VARIANTS if VARIANTS[v][3]]
N_GREEDY = 20
CONTEXT = 128


def load(path: object, **kw: object) -> colibri.Model:
    return colibri.Model.load(path, engine=colibri.EngineConfig(
        context_length=CONTEXT, activation_precision="float32", **kw))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def reference(deepseek_model: TinyDeepseek) -> tuple[list[int], np.ndarray]:
    ids = prompt_ids(N_PROMPT)
    return ids, reference_logits(transformers_model(str(deepseek_model.hf_dir)), ids)


def test_prefill_matches_transformers(deepseek_model: TinyDeepseek,
                                      reference: tuple[list[int], np.ndarray]) -> None:
    ids, ref = reference
    s = load(deepseek_model.hf_dir).session()
    assert_logits_close(s.forward(ids, all_logits=True), ref, f"{deepseek_model.variant} prefill")


def test_prefill_then_decode_matches_transformers(
    deepseek_model: TinyDeepseek, reference: tuple[list[int], np.ndarray]
) -> None:
    """Half the prompt at once, then token by token: decode runs the absorbed form over
    the latent cache (and the indexer over its key cache)."""
    ids, ref = reference
    half = N_PROMPT // 2
    s = load(deepseek_model.hf_dir).session()
    got = [s.forward(ids[:half], all_logits=True)]
    got += [s.forward([t])[None] for t in ids[half:]]
    assert_logits_close(np.concatenate(got), ref, f"{deepseek_model.variant} prefill + decode")


def test_prefill_equals_token_by_token(deepseek_model: TinyDeepseek) -> None:
    """One arithmetic for prefill and decode: bit-identical, whatever the batching."""
    ids = prompt_ids(N_PROMPT)
    m = load(deepseek_model.hf_dir)
    whole = m.session().forward(ids, all_logits=True)
    s = m.session()
    steps = np.stack([s.forward([t]) for t in ids])
    np.testing.assert_array_equal(steps, whole)


def test_greedy_continuation_matches_transformers(deepseek_model: TinyDeepseek) -> None:
    ids = prompt_ids(N_PROMPT)
    ref_tokens, ref_logits = reference_greedy(
        transformers_model(str(deepseek_model.hf_dir)), ids, N_GREEDY
    )
    s = load(deepseek_model.hf_dir).session()
    logits = s.forward(ids)
    got: list[int] = []
    for _ in range(N_GREEDY):
        got.append(int(np.argmax(logits)))
        logits = s.forward([got[-1]])
    assert_same_greedy(got, ref_tokens, ref_logits, deepseek_model.variant)


def _transformers_routing(model: torch.nn.Module, ids: list[int]) -> dict[int, np.ndarray]:
    """layer -> [tokens, top_k] experts transformers' routers select (sorted per token)."""
    picked: dict[int, np.ndarray] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(gate, "top_k"):
            continue

        def hook(_m: object, _inp: object, out: tuple[torch.Tensor, ...], i: int = i) -> None:
            picked[i] = np.sort(out[2].numpy(), axis=-1)

        hooks.append(gate.register_forward_hook(hook))
    try:
        reference_logits(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return picked


def test_routing_selects_the_same_experts(deepseek_model: TinyDeepseek) -> None:
    """The experts themselves, not only the logits: each router rule (with the non-zero
    selection bias and the groups) picks what transformers' router picks."""
    ids = prompt_ids(N_PROMPT)
    ref = _transformers_routing(transformers_model(str(deepseek_model.hf_dir)), ids)
    assert ref, "no MoE layer"
    s = load(deepseek_model.hf_dir).session()
    s.forward(ids)
    got = s.last_routing()
    for layer, want in ref.items():
        np.testing.assert_array_equal(np.sort(got[:, layer, :], axis=-1), want,
                                      err_msg=f"{deepseek_model.variant} layer {layer}")


@pytest.mark.parametrize("variant", SIGMOID_VARIANTS)
def test_selection_bias_is_in_the_checkpoint(deepseek_models: dict[str, TinyDeepseek],
                                             variant: str) -> None:
    """transformers initializes e_score_correction_bias to zeros; the factory does not.
    (The DeepSeek-V2 variants route by softmax, which has no selection bias.)"""
    deepseek_model = deepseek_models[variant]
    m = load(deepseek_model.hf_dir)
    assert m.config.router == "sigmoid_grouped"
    assert m.config.router_bias
    gate = transformers_model(str(deepseek_model.hf_dir)).model.layers[1].mlp.gate
    assert float(gate.e_score_correction_bias.abs().min()) > 0


@pytest.mark.parametrize("variant", ["deepseek_v32", "glm_moe_dsa"])
def test_indexer_really_drops_keys(deepseek_models: dict[str, TinyDeepseek], variant: str,
                                   tmp_path: Path) -> None:
    """index_topk 8 < 32 tokens: attending to every key instead (index_topk 1000) gives
    other logits beyond the tolerance, so the selection is exercised by the oracle tests;
    and transformers agrees with colibri at index_topk 1000 too."""
    tiny = deepseek_models[variant]
    ids = prompt_ids(N_PROMPT)
    ref = reference_logits(transformers_model(str(tiny.hf_dir)), ids)
    dense = config_variant(tiny, tmp_path / "all-keys", index_topk=1000)
    got = load(dense).session().forward(ids, all_logits=True)
    assert float(np.abs(got - ref).max()) > 100 * 1e-4 * float(np.abs(ref).max())
    ref_dense = reference_logits(transformers_model(str(dense)), ids)
    assert_logits_close(got, ref_dense, f"{variant} with every key")
    # Below index_topk tokens of context every key is kept: the first 8 positions agree.
    np.testing.assert_allclose(got[:8], ref[:8], atol=1e-4 * float(np.abs(ref).max()), rtol=0)


def test_kimi_k2_model_type_is_deepseek_v3(deepseek_models: dict[str, TinyDeepseek],
                                           tmp_path: Path) -> None:
    """Kimi-K2 ships model_type "kimi_k2" with the DeepseekV3ForCausalLM architecture."""
    tiny = deepseek_models["kimi_k2"]
    kimi = config_variant(tiny, tmp_path / "kimi", model_type="kimi_k2")
    m = load(kimi)
    assert m.config.arch == "deepseek_v3" and m.config.n_group == 1 and m.config.n_experts == 64
    ids = prompt_ids(N_PROMPT)
    np.testing.assert_array_equal(m.session().forward(ids, all_logits=True),
                                  load(tiny.hf_dir).session().forward(ids, all_logits=True))


def test_kv_cache_holds_the_latent_and_rope_key(deepseek_model: TinyDeepseek) -> None:
    """The budget's KV figure is the layout the core allocates: for MLA
    (kv_lora_rank + qk_rope_head_dim) x layers (+ the indexer key on full indexer layers)
    x 4 bytes (F32) per position, at the full context."""
    m = load(deepseek_model.hf_dir)
    c = m.config
    mem = m.stats().memory
    assert mem is not None
    core = m._require_core()
    if c.is_mla:
        types = c.indexer_types or ("full",) * c.n_layers
        full = [i for i in range(c.n_layers) if c.has_indexer and types[i] == "full"]
        per_token = (c.kv_lora_rank + c.qk_rope_head_dim) * N_LAYERS + c.index_head_dim * len(full)
        # K: the latent row; V: the indexer's key on a full DSA layer, else nothing.
        latent = (1, c.kv_lora_rank + c.qk_rope_head_dim)
        indexer = (1, c.index_head_dim)
        assert core.kv_layouts == [latent + (indexer if i in full else (0, 0))
                                   for i in range(N_LAYERS)]  # fmt: skip
    else:
        per_token = 2 * c.n_kv_heads * c.head_dim * N_LAYERS
    assert kv_floats_per_token(c) == per_token
    assert core.kv_bytes_per_token == per_token * 4
    assert mem.kv_bytes == per_token * 4 * CONTEXT
    if deepseek_model.variant == "deepseek_v3":
        assert per_token == (32 + 8) * 3  # 40 floats per layer instead of 4 heads x (24 + 16)


@pytest.mark.parametrize("variant", MTP_VARIANTS)
def test_mtp_layers_are_loaded_not_run(deepseek_models: dict[str, TinyDeepseek],
                                       variant: str) -> None:
    """The checkpoint's multi-token-prediction layer is in the manifest, resident in the
    core and its experts in the store (they stream like any layer's); the trunk's logits
    (checked against transformers above, which ignores those keys) do not use it."""
    deepseek_model = deepseek_models[variant]
    assert deepseek_model.has_mtp
    m = load(deepseek_model.hf_dir, ram_budget=None)
    c = m.config
    assert c.n_mtp_layers == 1
    names = set(m.manifest.tensors)
    mtp = f"blk.{N_LAYERS}."
    for n in ("nextn.eh_proj", "nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm",
              "ffn_gate_inp", "ffn_gate_exps.0", "attn_norm"):
        assert mtp + n in names
    core = m._require_core()
    assert core.mtp_layers == 1
    moe_trunk = sum(c.moe_layers)
    assert core.streamed_experts == (moe_trunk + 1) * c.n_experts
    core.preload_experts()  # reads every expert, the MTP layer's included
    assert m.stats().memory is not None


BAD_CONFIGS = [
    ("deepseek_v3", {"scoring_func": "softmax"}, "scoring_func 'softmax'"),
    ("deepseek_v3", {"topk_method": "group_limited_greedy"}, "topk_method 'group_limited_greedy'"),
    ("deepseek_v2_lite", {"topk_method": "noaux_tc"}, "topk_method 'noaux_tc'"),
    ("deepseek_v2_lite", {"scoring_func": "sigmoid"}, "scoring_func 'sigmoid'"),
    ("glm_moe_dsa", {"indexer_types": ["full", "compressed", "full"]},
     "indexer type 'compressed'"),
    ("glm_moe_dsa", {"indexer_types": None, "index_topk_pattern": "FSX"}, "index_topk_pattern"),
]


@pytest.mark.parametrize(("variant", "change", "message"), BAD_CONFIGS)
def test_unsupported_routing_or_indexer_is_named(deepseek_models: dict[str, TinyDeepseek],
                                                 tmp_path: Path, variant: str,
                                                 change: dict[str, object], message: str) -> None:
    bad = config_variant(deepseek_models[variant], tmp_path / "bad", **change)
    with pytest.raises(colibri.errors.UnsupportedError, match=message):
        load(bad)


def test_missing_mla_tensor_is_named(deepseek_models: dict[str, TinyDeepseek],
                                     tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    tiny = deepseek_models["deepseek_v3"]
    dst = tmp_path / "missing"
    shutil.copytree(tiny.hf_dir, dst)
    sd = load_file(str(dst / "model.safetensors"))
    del sd["model.layers.1.self_attn.kv_a_proj_with_mqa.weight"]
    save_file(sd, str(dst / "model.safetensors"))
    with pytest.raises(colibri.errors.ModelFormatError, match="blk.1.attn_kv_a_mqa"):
        load(dst)


def test_team_size_does_not_change_logits(deepseek_model: TinyDeepseek) -> None:
    """Attention over the latent cache (heads split over the team in decode), the indexer
    (one query per task) and the per-head absorptions give the same bits for 1 and 2
    threads."""
    ids = prompt_ids(N_PROMPT)
    out = []
    for n in (1, 2):
        m = load(deepseek_model.hf_dir, threads=colibri.ThreadConfig(n=n))
        s = m.session()
        out.append(np.concatenate([s.forward(ids[:20], all_logits=True)]
                                  + [s.forward([t])[None] for t in ids[20:]]))  # fmt: skip
    np.testing.assert_array_equal(out[0], out[1])


@pytest.mark.parametrize("declared", [0, None])
def test_undeclared_mtp_layers_are_refused(deepseek_models: dict[str, TinyDeepseek],
                                           tmp_path: Path, declared: int | None) -> None:
    """Tensors of a layer after num_hidden_layers are an MTP layer only when config.json
    declares it (num_nextn_predict_layers); otherwise the checkpoint does not match."""
    bad = config_variant(deepseek_models["deepseek_v3"], tmp_path / "bad",
                        num_nextn_predict_layers=declared)  # fmt: skip
    with pytest.raises(colibri.errors.ModelFormatError, match="multi-token-prediction"):
        load(bad)
