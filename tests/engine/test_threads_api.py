"""The thread-safety contract (docs/api.md): many threads may generate on one model, each
in its own session; forwards serialize on the engine, and every generation's figures are
its own. Checked on a tiny MoE with a small expert cache, where concurrent generations
interleave token by token and share the cache."""

from __future__ import annotations

import threading
import time

import colibri as co
from support.modelfactory import TinyModel, prompt_ids

MAX_TOKENS = 24


def _lookups(e: co.ExpertStats | None) -> int:
    assert e is not None
    return e.hits + e.misses


def _model(tiny: TinyModel) -> co.Model:
    src = tiny.gguf["F32"]
    probe = co.Model.load(src, engine=co.EngineConfig(cache=co.CacheConfig(history=False)))
    mem = probe.stats().memory
    assert mem is not None
    # Room for 6 experts: misses and evictions in every generation.
    budget = mem.dense_bytes + mem.kv_bytes + mem.work_bytes + 6 * mem.slot_bytes
    return co.Model.load(src, engine=co.EngineConfig(
        ram_budget=budget, threads=co.ThreadConfig(n=1), io=co.IOConfig(workers=1),
        cache=co.CacheConfig(history=False), context_length=128,
    ))  # fmt: skip


def test_concurrent_generations_keep_their_own_expert_stats(
    tiny_models: dict[str, TinyModel],
) -> None:
    prompts = [prompt_ids(20, seed=1), prompt_ids(12, seed=2)]
    with _model(tiny_models["qwen3_moe"]) as m:
        alone = [m.generate(p, max_tokens=MAX_TOKENS) for p in prompts]
        assert all(_lookups(g.stats.experts) > 0 for g in alone)
        assert _lookups(alone[0].stats.experts) != _lookups(alone[1].stats.experts)

        barrier = threading.Barrier(2)
        results: dict[int, co.Generation] = {}
        spans: dict[int, tuple[float, float]] = {}

        def run(i: int) -> None:
            barrier.wait()
            t0 = time.perf_counter()
            results[i] = m.generate(prompts[i], max_tokens=MAX_TOKENS)
            spans[i] = (t0, time.perf_counter())

        before = m.stats().experts
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = m.stats().experts.minus(before)
    # The two generations ran at the same time (forwards serialize on the engine, so their
    # tokens interleaved); otherwise this test would prove nothing.
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]
    for i in range(2):
        assert results[i].token_ids == alone[i].token_ids
        assert _lookups(results[i].stats.experts) == _lookups(alone[i].stats.experts)
    # Nothing lost or counted twice: the model-wide delta is the sum of the two.
    assert _lookups(total) == sum(_lookups(results[i].stats.experts) for i in range(2))
