"""GGUF files against the Hugging Face checkpoint they were converted from.

* F32 GGUF: the same weights (Q/K rows permuted for llama.cpp and restored on load), so the
  logits must equal the checkpoint's to F32 rounding, at every position.
* Q8_0 / Q4_0 / Q4_1 GGUF with ``activation_precision="float32"``: weights dequantized row by
  row, float dot products, as transformers runs a GGUF. Must equal transformers on the
  GGUF's weights dequantized to F32 (``dequantized_hf_dir``) to F32 rounding (measured
  ~1e-6 of the largest logit).
* Q8_0 / Q4_0 / Q4_1 GGUF with the default int8 activations, two oracles:
  1. ggml's arithmetic: transformers on the GGUF's weights dequantized to F32, with every
     activation that meets a quantized weight rounded to Q8_0 (Q8_1 for Q4_1) blocks the way
     llama.cpp's reference quantizer does (``modelfactory.transformers_model_ggml``: x times
     the reciprocal of the scale, rounded half away from zero). colibri must compute the
     same thing: bit-for-bit up to summation order (relative RMS ~1.5e-7) on most prompts.
     When float noise of 1e-7 moves an activation across a rounding boundary, one element
     changes by a whole quantization step and the (chaotic, random-weight) tiny model
     amplifies it: measured over 16 prompts of 12 tokens per family and type, 9-16 of 16
     prompts are exact (the fewest: qwen2_moe Q4_1), the worst is 1.5e-2 relative RMS and
     the top-1 agreement is >= 99.5% on average. Bounds: at least half of 8 prompts exact
     (<= 1e-5), none above 0.05, top-1 >= 95%.
  2. the original F32 model: the end-to-end cost of quantization (weights and
     activations), measured over 20 prompts of 32 tokens in groups of 4 as tested:

     ======  =============================================  ==================
     type    worst median relative RMS / mean top-1          bound
     ======  =============================================  ==================
     Q8_0    0.103 / 0.91                                    0.20 / >= 0.80
     Q4_0    0.410 / 0.44                                    0.60 / >= 0.30
     Q4_1    0.424 / 0.48                                    0.60 / >= 0.30
     ======  =============================================  ==================

     The tiny models have random weights (std 0.15, nothing to absorb rounding), so they are
     far more sensitive than trained ones: weight rounding alone costs 0.03-0.05 relative
     RMS for Q8_0 and 0.31-0.46 for Q4_0 and Q4_1. A wrong block layout, scale or nibble
     order gives errors of order 1 and fails both oracles.
"""

from __future__ import annotations

import numpy as np
import pytest

import colibri
from support.modelfactory import (
    TinyModel,
    dequantized_hf_dir,
    prompt_ids,
    reference_logits,
    transformers_model,
    transformers_model_ggml,
)

PROMPT_SEEDS = (0, 1, 2, 3)
F32_RTOL = 1e-4  # of max |logit|, as for the checkpoint itself


def load(path: object) -> colibri.Model:
    return colibri.Model.load(path, engine=colibri.EngineConfig(context_length=128))


def rel_rms(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref**2)))


def top1(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.mean(np.argmax(got, -1) == np.argmax(ref, -1)))


def test_f32_gguf_equals_checkpoint(tiny_model: TinyModel) -> None:
    hf = load(tiny_model.hf_dir)
    gg = load(tiny_model.gguf["F32"])
    assert gg.config == hf.config
    for seed in PROMPT_SEEDS:
        ids = prompt_ids(seed=seed)
        a = gg.session().forward(ids, all_logits=True)
        b = hf.session().forward(ids, all_logits=True)
        err = float(np.abs(a - b).max())
        assert err <= F32_RTOL * float(np.abs(b).max()), (tiny_model.family, seed, err)


def test_f32_gguf_matches_transformers(tiny_model: TinyModel) -> None:
    ids = prompt_ids()
    ref = reference_logits(transformers_model(str(tiny_model.hf_dir)), ids)
    got = load(tiny_model.gguf["F32"]).session().forward(ids, all_logits=True)
    err = float(np.abs(got - ref).max())
    assert err <= F32_RTOL * float(np.abs(ref).max()), (tiny_model.family, err)


def _errors(model: colibri.Model, reference: object) -> tuple[list[float], list[float]]:
    errs, agree = [], []
    for seed in PROMPT_SEEDS:
        ids = prompt_ids(seed=seed)
        got = model.session().forward(ids, all_logits=True)
        ref = reference_logits(reference, ids)  # type: ignore[arg-type]
        errs.append(rel_rms(got, ref))
        agree.append(top1(got, ref))
    return errs, agree


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_float_activations_equal_dequantized_checkpoint(tiny_model: TinyModel, qtype: str) -> None:
    oracle = transformers_model(str(dequantized_hf_dir(tiny_model, qtype)))
    model = colibri.Model.load(
        tiny_model.gguf[qtype],
        engine=colibri.EngineConfig(context_length=128, activation_precision="float32"),
    )
    for seed in PROMPT_SEEDS:
        ids = prompt_ids(seed=seed)
        got = model.session().forward(ids, all_logits=True)
        ref = reference_logits(oracle, ids)
        err = float(np.abs(got - ref).max())
        assert err <= F32_RTOL * float(np.abs(ref).max()), (tiny_model.family, qtype, seed, err)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_quantized_matches_ggml_arithmetic(tiny_model: TinyModel, qtype: str) -> None:
    oracle = transformers_model_ggml(tiny_model, qtype)
    # The oracle keeps keys and values in float32: so does colibri here (the default KV
    # type with int8 activations is f16, which rounds them; test_kv_types.py measures it).
    model = colibri.Model.load(tiny_model.gguf[qtype], engine=colibri.EngineConfig(
        context_length=128, kv_cache_type="f32", activation_precision="int8"))
    errs, agree = [], []
    for seed in range(8):
        ids = prompt_ids(n=12, seed=100 + seed)
        got = model.session().forward(ids, all_logits=True)
        ref = reference_logits(oracle, ids)
        errs.append(rel_rms(got, ref))
        agree.append(top1(got, ref))
    what = f"{tiny_model.family} {qtype}: rel RMS {errs}, top-1 {agree}"
    assert sum(e <= 1e-5 for e in errs) >= 4, what
    assert max(errs) <= 0.05, what
    assert np.mean(agree) >= 0.95, what


@pytest.mark.parametrize(
    ("qtype", "max_median", "min_top1"),
    [("Q8_0", 0.20, 0.80), ("Q4_0", 0.60, 0.30), ("Q4_1", 0.60, 0.30)],
)
def test_quantized_tracks_f32(
    tiny_model: TinyModel, qtype: str, max_median: float, min_top1: float
) -> None:
    full = transformers_model(str(tiny_model.hf_dir))
    errs, agree = _errors(load(tiny_model.gguf[qtype]), full)
    what = f"{tiny_model.family} {qtype}: rel RMS {np.round(errs, 3)}, top-1 {np.round(agree, 2)}"
    assert np.median(errs) <= max_median, what
    assert np.mean(agree) >= min_top1, what


def test_transformers_reads_our_llama_gguf_identically(tiny_models: dict[str, TinyModel]) -> None:
    """An independent check of the fixture writer: transformers' own GGUF loader (which
    un-permutes Q/K like llama.cpp's conventions require) gives the checkpoint's logits."""
    import torch
    import transformers

    t = tiny_models["llama"]
    path = t.gguf["F32"]
    g = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = prompt_ids()
    np.testing.assert_array_equal(
        reference_logits(g, ids), reference_logits(transformers_model(str(t.hf_dir)), ids)
    )
