"""ExpertStats.ready_hits: hits that did not wait on a prefetch. Without prefetch every
hit is a ready hit; with it some hits are experts whose prefetch was still reading."""

from __future__ import annotations

from pathlib import Path

import colibri as co
from support.modelfactory import build_tiny_model, prompt_ids


def _streamed(prefetch: bool) -> tuple[Path, co.EngineConfig]:
    """The tiny Qwen3-MoE and an engine streaming its experts through 8 cache slots."""
    src = build_tiny_model("qwen3_moe").hf_dir
    probe = co.Model.load(src, engine=co.EngineConfig(cache=co.CacheConfig(history=False)))
    mem = probe.stats().memory
    assert mem is not None
    budget = mem.dense_bytes + mem.kv_bytes + mem.work_bytes + 8 * mem.slot_bytes
    engine = co.EngineConfig(
        ram_budget=budget, io=co.IOConfig(workers=1, prefetch=prefetch),
        cache=co.CacheConfig(history=False),
    )  # fmt: skip
    return src, engine


def _run(prefetch: bool) -> co.ExpertStats:
    src, engine = _streamed(prefetch)
    with co.Model.load(src, engine=engine) as m:
        s = m.session()
        s.forward(prompt_ids(16))
        for t in prompt_ids(24, seed=7):
            s.append(t)
        return m.stats().experts


def test_ready_hits_without_prefetch_are_all_hits() -> None:
    e = _run(prefetch=False)
    assert e.hits > 0 and e.ready_hits == e.hits
    assert e.ready_hit_rate == e.hit_rate


def test_ready_hits_with_prefetch_never_exceed_hits() -> None:
    e = _run(prefetch=True)
    assert e.prefetch_issued > 0
    assert 0 < e.ready_hits <= e.hits
    # A hit that was not ready can only be an expert a prefetch was still reading.
    assert e.hits - e.ready_hits <= e.prefetch_used
    assert e.ready_hit_rate <= e.hit_rate


def test_io_trace_counts_the_expert_reads_and_changes_no_logit() -> None:
    """Engine.start_io_trace / io_trace (benchmarks/_stream_child.py): one record per
    expert read of the traced forwards, matching the store's own counts, demand reads
    flagged; tracing changes no logit."""
    import numpy as np

    src, engine = _streamed(prefetch=True)
    ids, more = prompt_ids(16), prompt_ids(8, seed=7)
    logits = []
    for traced in (False, True):
        with co.Model.load(src, engine=engine) as m:
            core = m._require_core()
            assert core is not None
            if traced:
                core.start_io_trace(1 << 16)
            before = m.stats().experts
            s = m.session()
            out = [s.forward(ids)] + [s.forward([t]) for t in more]
            logits.append(np.stack([np.asarray(x) for x in out]))
            after = m.stats().experts
            tr = core.io_trace()
            if not traced:
                assert len(tr["started"]) == 0
                continue
            reads = after.reads - before.reads
            assert reads > 0 and len(tr["started"]) == reads
            assert int(tr["bytes"].sum()) == after.bytes_read - before.bytes_read
            misses = after.misses - before.misses
            assert int(tr["urgent"].sum()) == misses  # demand reads: one per miss
            assert (tr["started"] <= tr["finished"]).all() and not tr["failed"].any()
    np.testing.assert_array_equal(logits[0], logits[1])
