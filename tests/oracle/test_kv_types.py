"""KV cache types (EngineConfig.kv_cache_type) on the real SmolLM2 weights, and the cache's
state API.

Faithfulness: SmolLM2-135M Q4_1 over 1024 tokens of a real text (the GPL-3 shipped under
/usr/share/common-licenses), full-vocabulary logits at every position with each KV type,
against the same run with an F32 cache, both with float32 activations so that the KV
storage is the only difference. (With int8 activations any perturbation flips some
activation roundings, and every type then differs from the f32 run by about that noise,
~0.004, whatever its own rounding.) Measured on the development machine (AVX2):

    =====  ==========  ======  ==================
    type   mean KLD    top-1   bound
    =====  ==========  ======  ==================
    f16    9.5e-07     99.9%   3.5e-06 (1/1000)
    bf16   6.2e-05     99.5%   1.75e-04 (1/20)
    q8_0   7.3e-04     98.4%   1.17e-03 (1/3)
    =====  ==========  ======  ==================

The bounds are fractions of what the weights' own quantization costs on the same text
(colibri Q4_1 with int8 activations vs float: KLD 0.0035, docs/tuning.md), set from the
rounding of each format: f16 keeps 11 significant bits per value (relative error 2^-11),
bf16 8 (2^-8, 8x f16's, ~64x in KLD which goes with the square), q8_0 8 bits of one scale
shared by 32 values, so a block with an outlier (RoPE'd keys have a few large channels)
rounds its small values much more coarsely than bf16 does. A cache that stored garbage,
the wrong head or an unscaled block gives a KLD of order 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.engine.budget import kv_bytes
from colibri.errors import ColibriError, UnsupportedError
from colibri.settings.config import EngineConfig, ThreadConfig
from support.modelfactory import TinyModel
from support.realmodel import smollm2_gguf

TEXT = Path("/usr/share/common-licenses/GPL-3")
N_TOKENS = 1024
WEIGHT_KLD = 0.0035  # colibri Q4_1 + int8 activations vs float (docs/tuning.md)
BOUNDS = {"f16": WEIGHT_KLD / 1000, "bf16": WEIGHT_KLD / 20, "q8_0": WEIGHT_KLD / 3}


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _load(kv_type: str, context_length: int = N_TOKENS + 8,
          precision: str = "int8") -> colibri.Model:
    return colibri.Model.load(smollm2_gguf(), engine=EngineConfig(
        threads=ThreadConfig(n=2), context_length=context_length, kv_cache_type=kv_type,
        activation_precision=precision))


@pytest.fixture(scope="module")
def text_ids() -> list[int]:
    if not TEXT.is_file():
        pytest.skip(f"{TEXT} not found")
    m = _load("f32")
    ids = m.tokenizer.encode(TEXT.read_text(), add_special_tokens=False)[:N_TOKENS]
    assert len(ids) == N_TOKENS
    return ids


@pytest.fixture(scope="module")
def f32_logprobs(text_ids: list[int]) -> np.ndarray:
    m = _load("f32", precision="float32")
    s = m.session()
    assert s.kv_cache_type == "f32"
    return _log_softmax(s.forward(text_ids, all_logits=True))


@pytest.mark.parametrize("kv_type", ["f16", "bf16", "q8_0"])
def test_kld_against_f32_cache(kv_type: str, text_ids: list[int], f32_logprobs: np.ndarray) -> None:
    m = _load(kv_type, precision="float32")
    s = m.session()
    assert s.kv_cache_type == kv_type
    got = _log_softmax(s.forward(text_ids, all_logits=True))
    kld = float(np.mean(np.sum(np.exp(f32_logprobs) * (f32_logprobs - got), axis=-1)))
    top1 = float(np.mean(got.argmax(-1) == f32_logprobs.argmax(-1)))
    print(f"\nKV {kv_type}: mean KLD vs f32 {kld:.3g}, top-1 agreement {top1:.2%} "
          f"over {N_TOKENS} tokens")
    assert 0 < kld <= BOUNDS[kv_type], kld  # 0 would mean the type was not applied
    assert top1 >= 0.98


@pytest.mark.parametrize("kv_type,per_value", [("f32", 4.0), ("f16", 2.0), ("bf16", 2.0),
                                               ("q8_0", 34 / 32)])
def test_kv_bytes_at_the_chosen_type(kv_type: str, per_value: float) -> None:
    ctx = 4096
    m = _load(kv_type, ctx)
    c = m.config
    mem = m.stats().memory
    assert mem is not None and mem.kv_cache_type == kv_type == m.kv_cache_type
    want = kv_bytes(c.n_layers, c.n_kv_heads, c.head_dim, ctx, kv_type)
    assert mem.kv_bytes == want == int(2 * 30 * 192 * ctx * per_value)
    s = m.session()
    assert s._core.kv_bytes(ctx) == want  # the core counts the same bytes
    s.forward([1, 2, 3])
    assert 0 < s._core.kv_allocated_bytes < want  # grown for what is used, not the context


def test_auto_type_follows_the_exact_path(tiny_models: dict[str, TinyModel]) -> None:
    # Quantized weights with int8 activations: f16. Float weights, or float32 activations: f32.
    q = colibri.Model.load(smollm2_gguf(), engine=EngineConfig(
        context_length=64, activation_precision="int8"))
    assert q.kv_cache_type == "f16" and q.session().kv_cache_type == "f16"
    q.set_activation_precision("float32")
    assert q.kv_cache_type == "f32" and q.session().kv_cache_type == "f32"
    assert q.stats().memory.kv_bytes == kv_bytes(30, 3, 64, 64, "f32")  # type: ignore[union-attr]
    q.set_activation_precision("int8")
    assert q.stats().memory.kv_bytes == kv_bytes(30, 3, 64, 64, "f16")  # type: ignore[union-attr]
    # "auto" resolves for the model: float32 for SmolLM2's 98 MB of weights, so f32 again.
    q.set_activation_precision("auto")
    assert q.engine_config.activation_precision.value == "float32" and q.kv_cache_type == "f32"
    f = colibri.Model.load(tiny_models["llama"].hf_dir, engine=EngineConfig(context_length=64))
    assert f.kv_cache_type == "f32"


def test_q8_0_needs_whole_blocks(tiny_models: dict[str, TinyModel]) -> None:
    # The tiny models have 16-value heads.
    with pytest.raises(UnsupportedError, match="q8_0.*16"):
        colibri.Model.load(tiny_models["llama"].hf_dir, engine=EngineConfig(kv_cache_type="q8_0"))


@pytest.mark.parametrize("kv_type", ["f32", "q8_0"])
def test_state_export_import_and_prefix_copy(kv_type: str, text_ids: list[int]) -> None:
    m = _load(kv_type, 256)
    a = m.session()
    full = a.forward(text_ids[:120], all_logits=True)
    state = a._core.export_kv()
    assert isinstance(state, bytes) and len(state) == a._core.kv_bytes() == a._core.kv_bytes(120)
    # Import into a fresh session: the next token's logits are the same bits.
    b = m.session()
    b._core.import_kv(state, text_ids[:120])
    assert b.n_tokens == 120
    np.testing.assert_array_equal(b._core.forward(np.array([5], np.int32), False),
                                  a._core.forward(np.array([5], np.int32), False))
    # A prefix copied from another session continues like the session it came from.
    c = m.session()
    c._core.copy_prefix_from(a._core, 70)
    assert c.n_tokens == 70
    rest = c._core.forward(np.array(text_ids[70:120], np.int32), True)
    np.testing.assert_array_equal(rest, full[70:120])
    # Wrong sizes, too many positions, another KV type: refused, the session unchanged.
    with pytest.raises(ColibriError, match="bytes"):
        c._core.import_kv(state[:-1], text_ids[:120])
    with pytest.raises(ColibriError):
        c._core.copy_prefix_from(a._core, 500)
    with pytest.raises(ColibriError):
        a._core.export_kv(1000)
    other = _load("f16" if kv_type != "f16" else "f32", 256).session()
    other.forward(text_ids[:10])
    with pytest.raises(ColibriError, match="type"):
        c._core.copy_prefix_from(other._core, 5)
    assert c.n_tokens == 120
