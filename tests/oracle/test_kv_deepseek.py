"""The MLA / DSA KV rows at every cache type, and through the session's state API.

The latent row (kv_lora_rank + qk_rope_head_dim) and the DSA indexer's key are stored at
the session's KV type: F16 / BF16 round them (the logits move by less than the bounds
below, measured on the tiny models: F16 <= 2e-3, BF16 <= 2e-2 of the largest logit, which
is what 11 / 8 significant bits of every cached value give through three layers); Q8_0
needs rows of whole 32-value blocks, which the tiny models' 40-wide latent is not (named in
the error). Exporting a session's KV state and importing it into a fresh one continues
bit-identically.
"""

from __future__ import annotations

import numpy as np
import pytest

import colibri
from colibri import _core
from support.deepseek_factory import TinyDeepseek, prompt_ids

VARIANTS = ("deepseek_v3", "glm_moe_dsa", "deepseek_v2_lite")
BOUND = {"f16": 2e-3, "bf16": 2e-2}
CONTEXT = 64


def _core_model(tiny: TinyDeepseek) -> _core.Engine:
    m = colibri.Model.load(tiny.hf_dir, engine=colibri.EngineConfig(
        context_length=CONTEXT, activation_precision="float32"))  # fmt: skip
    return m._require_core(), m  # type: ignore[return-value]


def _run(core: _core.Engine, kv_type: str, ids: list[int]) -> np.ndarray:
    s = _core.Session(core, CONTEXT, kv_type)
    prefill = s.forward(ids[:16], all_logits=True)
    return np.concatenate([prefill] + [s.forward([t])[None] for t in ids[16:]])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kv_type", ["f16", "bf16"])
def test_half_precision_kv_tracks_f32(deepseek_models: dict[str, TinyDeepseek], variant: str,
                                      kv_type: str) -> None:
    core, _m = _core_model(deepseek_models[variant])
    ids = prompt_ids(32)
    ref = _run(core, "f32", ids)
    got = _run(core, kv_type, ids)
    err = float(np.abs(got - ref).max()) / float(np.abs(ref).max())
    assert 0 < err <= BOUND[kv_type], err
    s = _core.Session(core, CONTEXT, kv_type)
    s.forward(ids[:5])
    per_token = core.kv_bytes_per_token // 2  # 2-byte rows
    assert s.kv_bytes(5) == 5 * per_token


def test_q8_0_kv_needs_whole_blocks(deepseek_models: dict[str, TinyDeepseek]) -> None:
    core, _m = _core_model(deepseek_models["deepseek_v3"])
    with pytest.raises(colibri.errors.UnsupportedError, match="40"):
        _core.Session(core, CONTEXT, "q8_0")


@pytest.mark.parametrize("variant", VARIANTS)
def test_exported_state_continues_bit_identically(deepseek_models: dict[str, TinyDeepseek],
                                                  variant: str) -> None:
    core, _m = _core_model(deepseek_models[variant])
    ids = prompt_ids(32)
    a = _core.Session(core, CONTEXT, "f32")
    a.forward(ids[:20])
    state = a.export_kv()
    assert len(state) == a.kv_bytes(20) == 20 * core.kv_bytes_per_token
    b = _core.Session(core, CONTEXT, "f32")
    b.import_kv(state, ids[:20])
    for t in ids[20:]:
        np.testing.assert_array_equal(b.forward([t]), a.forward([t]))


@pytest.mark.parametrize("kv_type", ["f16", "bf16"])
def test_budget_counts_the_rows_at_the_kv_type(deepseek_models: dict[str, TinyDeepseek],
                                               kv_type: str) -> None:
    """EngineConfig.kv_cache_type sizes the budget's KV figure as the core stores it: the
    latent row and the DSA indexer key (glm_moe_dsa has a full and a shared indexer layer)
    at 2 bytes a value, for the whole context."""
    tiny = deepseek_models["glm_moe_dsa"]
    m = colibri.Model.load(tiny.hf_dir, engine=colibri.EngineConfig(
        context_length=CONTEXT, activation_precision="float32", kv_cache_type=kv_type))
    core = m._require_core()
    mem = m.stats().memory
    assert mem is not None
    assert mem.kv_bytes == core.kv_bytes_per_token // 2 * CONTEXT  # the core's F32 figure
    s = m.session()
    assert s.kv_cache_type == kv_type
    s.forward(prompt_ids(5))
    assert s._core.kv_bytes(5) == 5 * core.kv_bytes_per_token // 2


def test_q8_0_kv_refused_at_load_naming_the_row(deepseek_models: dict[str, TinyDeepseek]) -> None:
    with pytest.raises(colibri.errors.UnsupportedError, match="40"):
        colibri.Model.load(deepseek_models["deepseek_v3"].hf_dir, engine=colibri.EngineConfig(
            context_length=CONTEXT, kv_cache_type="q8_0"))
