"""The MTP layer's own KV cache (speculative decoding with MTP drafts, model/mtp.hpp) counts
in the one RAM budget and in the KV accounting, like the trunk's cache.

On the tiny DeepSeek-V3 model (MLA, one MTP layer, no DSA indexer) the MTP layer keeps one
latent row of kv_lora_rank + qk_rope_head_dim values per position: the budget reserves that
row for the full context at the session's KV type (``MemoryStats.mtp_kv_bytes``, beside the
trunk's ``kv_bytes``), the core's cache holds exactly that many bytes per position it
allocated, and the server's per-position KV reservation and slot budget include it.
"""

from __future__ import annotations

import pytest

import colibri
from colibri.engine.budget import kv_layers_bytes
from colibri.engine.streaming import mtp_kv_layer_widths
from colibri.errors import ConfigError
from colibri.server.memory import slot_kv_budget
from colibri.server.scheduler import kv_position_bytes
from support.deepseek_factory import N_LAYERS, TinyDeepseek, prompt_ids

CONTEXT = 256
VALUE_BYTES = {"f32": 4, "f16": 2}


def load(tiny: TinyDeepseek, kv_type: str, budget: int | None = None) -> colibri.Model:
    return colibri.Model.load(tiny.hf_dir, engine=colibri.EngineConfig(
        context_length=CONTEXT, activation_precision="float32", kv_cache_type=kv_type,
        ram_budget=budget))


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_mtp_kv_cache_counts_in_the_budget(deepseek_models: dict[str, TinyDeepseek],
                                           kv_type: str) -> None:
    tiny = deepseek_models["deepseek_v3"]
    assert tiny.has_mtp
    with load(tiny, kv_type) as m:
        c = m.config
        row = c.kv_lora_rank + c.qk_rope_head_dim  # the MTP layer's latent + shared rope key
        want = row * VALUE_BYTES[kv_type] * CONTEXT
        mem = m.stats().memory
        assert mem is not None and c.n_mtp_layers == 1
        assert mem.mtp_kv_bytes == want, mem
        assert mem.kv_bytes == N_LAYERS * want  # the trunk's cache: unchanged by the MTP's
        assert mem.session_kv_bytes == (N_LAYERS + 1) * want
        core = m._require_core()
        assert core.mtp_kv_bytes_per_token == row * 4  # the core's layout, at F32
        assert kv_layers_bytes(mtp_kv_layer_widths(c), 1, "f32") == core.mtp_kv_bytes_per_token
        plan = m.runner.handle.plan
        assert plan is not None and plan.mtp_kv_bytes == want
        assert plan.resident_bytes == (plan.dense_bytes + plan.kv_bytes + want + plan.work_bytes
                                       + plan.prompt_cache_bytes)
        assert "MTP KV" in mem.summary() and "MTP KV" in plan.describe()

        # A session drafting with MTP holds exactly that row per position it allocated: one
        # draft after a 100-token prefill runs the MTP layer over those 100 positions.
        s = m.session()
        assert s._core.mtp_kv_allocated_bytes == 0
        s._core.enable_mtp()
        ids = prompt_ids(100)
        s.forward(ids)
        trunk = s._core.kv_allocated_bytes
        drafts, _ = s._core.mtp_draft(ids[-1], 1, False)
        assert len(drafts) == 1
        assert s._core.mtp_kv_allocated_bytes == row * VALUE_BYTES[kv_type] * 100
        assert s.kv_bytes == trunk + row * VALUE_BYTES[kv_type] * 100

        # The server reserves it per position and per slot.
        assert kv_position_bytes(m) == (N_LAYERS + 1) * row * VALUE_BYTES[kv_type]
        assert slot_kv_budget(m, 2) == 2 * mem.session_kv_bytes  # the default budget has room


def test_a_budget_without_room_for_the_mtp_cache_is_refused(
        deepseek_models: dict[str, TinyDeepseek]) -> None:
    """The resident part and top-k experts, but not the MTP layer's cache: ConfigError
    naming it (before, such a budget loaded and the MTP cache came on top of it)."""
    tiny = deepseek_models["deepseek_v3"]
    with load(tiny, "f32") as m:
        mem = m.stats().memory
        top_k = m.config.n_experts_per_tok
    assert mem is not None and mem.mtp_kv_bytes > 0
    budget = (mem.dense_bytes + mem.kv_bytes + mem.work_bytes + mem.prompt_cache_bytes
              + top_k * mem.slot_bytes)
    with pytest.raises(ConfigError, match="MTP-layer KV cache"):
        load(tiny, "f32", budget)
    with load(tiny, "f32", budget + mem.mtp_kv_bytes) as m:
        mem2 = m.stats().memory
        assert mem2 is not None and mem2.cache_slots == top_k


@pytest.mark.parametrize("variant", ["deepseek_v3", "glm_moe_dsa", "glm4_moe", "kimi_k2"])
def test_budget_mirror_matches_the_core_layout(deepseek_models: dict[str, TinyDeepseek],
                                               variant: str) -> None:
    """The budget's MTP row (computed before the model loads) is the core's layout: MLA's
    latent row, with the DSA indexer key on glm_moe_dsa (an MTP layer runs its own
    indexer), GQA's keys and values on glm4_moe, nothing on a model without MTP layers."""
    tiny = deepseek_models[variant]
    with load(tiny, "f32") as m:
        c, mem, core = m.config, m.stats().memory, m._require_core()
        assert mem is not None
        per_token = kv_layers_bytes(mtp_kv_layer_widths(c), 1, "f32")
        assert per_token == core.mtp_kv_bytes_per_token
        assert mem.mtp_kv_bytes == per_token * CONTEXT
        if not tiny.has_mtp:
            assert per_token == 0 and "MTP" not in mem.summary()
        elif c.has_indexer:
            assert per_token == (c.kv_lora_rank + c.qk_rope_head_dim + c.index_head_dim) * 4
        elif not c.is_mla:
            assert per_token == 2 * c.n_kv_heads * c.head_dim * 4
