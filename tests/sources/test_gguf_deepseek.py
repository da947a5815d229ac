"""The DeepSeek / GLM family from GGUF files written by llama.cpp's own converter
(``convert_hf_to_gguf.py`` of the llama-cpp-python 0.3.36 sdist, run on the tiny
checkpoints: architectures ``deepseek2``, ``deepseek32``, ``glm-dsa``, ``glm4moe``, with the
split ``attn_k_b``/``attn_v_b``, ``exp_probs_b``, the indexer tensors and ``nextn`` layers).

* F32 files with float32 activations equal transformers on the original checkpoint within
  1e-4 of the largest logit (measured ~1e-6).
* Q8_0 files: with float32 activations they equal transformers on the file's own weights
  dequantized (the quantization modelled exactly) within the same 1e-4 (measured ~7e-7).
  With the default int8 activations (each activation row rounded to 8-bit blocks, at most
  1/254 of its largest value per element) they track that reference with a median
  per-position error of 1.4-1.9% of the largest logit on these 64-wide models and a mean
  KL divergence of at most 9e-3 (measured), the larger deviations at the few positions
  where a rounding flips a near-tie in the expert or DSA key selection. The bounds below
  (3%, 0.02) leave about 2x margin. (The quantization itself moves these tiny random
  models' logits by up to 45%: the selections amplify small weight changes; the float32
  check above shows colibri computes what the file holds.)
* llama.cpp (llama-cpp-python) runs the same F32 files for the variants it supports and
  agrees within 2e-3 (measured 3-4e-4, its KV cache being F16); it aborts on the tiny
  deepseek32 / glm-dsa files and refuses V2-Lite without q_lora_rank, and scores the
  groups of DeepSeek-V2's softmax "group_limited_greedy" by their best two experts instead
  of the best one, so those are checked against transformers only.
"""

from __future__ import annotations

import numpy as np
import pytest

import colibri
from colibri.sources import open_model_source
from support.deepseek_factory import (
    GGUF_ARCH,
    VARIANTS,
    TinyDeepseek,
    build_tiny,
    dequantized_hf_dir,
    prompt_ids,
    transformers_model,
)
from support.logit_checks import assert_logits_close
from support.modelfactory import reference_logits

N_PROMPT = 32
CONTEXT = 128
INT8_MEDIAN = 0.03  # of max |logit|, per position (measured <= 1.9%)
INT8_MEAN_KL = 0.02  # nats (measured <= 9.3e-3)
LLAMA_CPP_RTOL = 2e-3  # measured 3-4e-4 (llama.cpp's F16 KV cache)
LLAMA_CPP_RUNS = ("deepseek_v3", "kimi_k2", "glm4_moe", "glm4_moe_lite")


@pytest.fixture(scope="module", params=list(VARIANTS))
def tiny(request: pytest.FixtureRequest) -> TinyDeepseek:
    return build_tiny(request.param)


def load(path: object, precision: str = "float32") -> colibri.Model:
    return colibri.Model.load(path, engine=colibri.EngineConfig(
        context_length=CONTEXT, activation_precision=precision))  # fmt: skip


def test_converter_wrote_the_expected_architecture(tiny: TinyDeepseek) -> None:
    m = open_model_source(tiny.gguf["F32"])
    assert m.metadata["general.architecture"] == GGUF_ARCH[tiny.family]
    hf = open_model_source(tiny.hf_dir).config
    c = m.config
    for field in ("n_layers", "n_heads", "n_experts", "n_experts_per_tok", "moe_layers",
                  "router", "router_bias", "n_group", "topk_group", "norm_topk_prob",
                  "shared_expert_intermediate_size", "attention", "q_lora_rank",
                  "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                  "rope_interleaved", "rotary_dim", "qk_norm", "attention_bias",
                  "index_n_heads", "index_head_dim", "index_topk"):
        assert getattr(c, field) == getattr(hf, field), field
    assert c.routed_scaling_factor == pytest.approx(hf.routed_scaling_factor, rel=1e-6)
    assert c.attention_scale == pytest.approx(hf.attention_scale, rel=1e-6)
    if hf.indexer_types:
        assert c.indexer_types == hf.indexer_types
    # llama.cpp keeps the MTP layer for glm4moe / deepseek32 / glm-dsa, drops it for deepseek2.
    assert c.n_mtp_layers == (hf.n_mtp_layers if GGUF_ARCH[tiny.family] != "deepseek2" else 0)


def test_f32_gguf_matches_transformers(tiny: TinyDeepseek) -> None:
    ids = prompt_ids(N_PROMPT)
    ref = reference_logits(transformers_model(str(tiny.hf_dir)), ids)
    s = load(tiny.gguf["F32"]).session()
    half = N_PROMPT // 2
    got = [s.forward(ids[:half], all_logits=True)] + [s.forward([t])[None] for t in ids[half:]]
    assert_logits_close(np.concatenate(got), ref, f"{tiny.variant} F32 GGUF")
    assert_logits_close(load(tiny.gguf["F32"]).session().forward(ids, all_logits=True), ref,
                        f"{tiny.variant} F32 GGUF prefill")  # fmt: skip


def test_q8_0_float_activations_equal_dequantized_transformers(tiny: TinyDeepseek) -> None:
    ids = prompt_ids(N_PROMPT)
    ref = reference_logits(transformers_model(str(dequantized_hf_dir(tiny, "Q8_0"))), ids)
    got = load(tiny.gguf["Q8_0"]).session().forward(ids, all_logits=True)
    assert_logits_close(got, ref, f"{tiny.variant} Q8_0, float32 activations")


def _mean_kl(ref: np.ndarray, got: np.ndarray) -> float:
    lr = ref - ref.max(1, keepdims=True)
    lr -= np.log(np.exp(lr).sum(1, keepdims=True))
    lg = got - got.max(1, keepdims=True)
    lg -= np.log(np.exp(lg).sum(1, keepdims=True))
    return float((np.exp(lr) * (lr - lg)).sum(1).mean())


def test_q8_0_int8_activations_track_within_measured_tolerance(tiny: TinyDeepseek) -> None:
    ids = prompt_ids(N_PROMPT)
    ref = reference_logits(transformers_model(str(dequantized_hf_dir(tiny, "Q8_0"))), ids)
    got = load(tiny.gguf["Q8_0"], "int8").session().forward(ids, all_logits=True)
    per_pos = np.abs(got - ref).max(1) / float(np.abs(ref).max())
    assert float(np.median(per_pos)) <= INT8_MEDIAN, per_pos
    assert _mean_kl(ref, got) <= INT8_MEAN_KL


@pytest.mark.parametrize("variant", LLAMA_CPP_RUNS)
def test_llama_cpp_runs_the_same_file_alike(variant: str) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    tiny = build_tiny(variant)
    ids = prompt_ids(N_PROMPT)
    ours = load(tiny.gguf["F32"]).session().forward(ids, all_logits=True)
    peer = llama_cpp.Llama(model_path=str(tiny.gguf["F32"]), n_ctx=CONTEXT, logits_all=True,
                           n_threads=1, verbose=False)  # fmt: skip
    peer.eval(ids)
    theirs = np.asarray(peer.scores[:N_PROMPT], dtype=np.float32)
    err = float(np.abs(theirs - ours).max())
    assert err <= LLAMA_CPP_RTOL * float(np.abs(ours).max()), err


def test_unsplit_kv_b_gguf_is_refused(tmp_path: object) -> None:
    """A GGUF with only attn_kv_b (written before llama.cpp split it) is named, not misread."""
    import gguf

    from colibri.errors import UnsupportedError

    src = build_tiny("deepseek_v3").gguf["F32"]
    reader = gguf.GGUFReader(src)
    out = tmp_path / "legacy.gguf"  # type: ignore[operator]
    w = gguf.GGUFWriter(str(out), "deepseek2")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0],
                        field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        name = t.name.replace("attn_k_b", "attn_kv_b")
        if "attn_v_b" in t.name:
            continue
        w.add_tensor(name, np.asarray(t.data), raw_shape=list(reversed(t.shape.tolist())),
                     raw_dtype=t.tensor_type)  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedError, match="attn_kv_b"):
        open_model_source(out)
