"""The per-token time breakdown (ExpertStats' activity buckets, csrc/io/activity_clock.hpp):
the wall time of a decode split into a read on the device and compute, only the read, only
the compute, neither. The buckets partition the clock's time, so over a decode they add up
to its wall time; a resident model has no read on the device while decoding."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import colibri as co
from support.modelfactory import build_tiny_model, prompt_ids

# Rounding of the nanosecond buckets to float seconds and of time.monotonic(): far below 1 us.
_EPS = 1e-6


def _budget(src: Path, slots: int) -> int:
    probe = co.Model.load(src, engine=co.EngineConfig(cache=co.CacheConfig(history=False)))
    mem = probe.stats().memory
    probe.close()
    assert mem is not None
    return mem.dense_bytes + mem.kv_bytes + mem.work_bytes + slots * mem.slot_bytes


def _bracketed(m: co.Model) -> tuple[co.ExpertStats, float, float]:
    """A snapshot of the counters and the monotonic times just before and after it: the
    clock read its buckets somewhere in between."""
    t0 = time.monotonic()
    e = m.stats().experts
    t1 = time.monotonic()
    assert e is not None
    return e, t0, t1


def _decode(m: co.Model, tokens: int) -> tuple[co.ExpertStats, float, float]:
    """A decode of `tokens` steps after a prefill; the counters' delta over the decode and
    the least and the most wall time the delta can span (the snapshots' brackets)."""
    s = m.session()
    s.forward(prompt_ids(12))
    a, a0, a1 = _bracketed(m)
    for t in prompt_ids(tokens, seed=3):
        s.forward([t])
    b, b0, b1 = _bracketed(m)
    return b.minus(a), b0 - a1, b1 - a0


def _check_partition(d: co.ExpertStats, lo: float, hi: float) -> None:
    # The four buckets are the clock's whole time between the two snapshots: neither less
    # than the time between the snapshots' calls nor more than from the first call's start
    # to the second's end. No tolerance beyond rounding is needed.
    assert lo - _EPS <= d.wall_seconds <= hi + _EPS, (lo, d.wall_seconds, hi)
    parts = (d.io_and_compute_seconds, d.io_only_seconds, d.compute_only_seconds,
             d.neither_seconds)
    assert all(p >= 0 for p in parts)
    # disk busy + compute + neither, less the overlap counted twice, is the wall time
    total = d.disk_busy_seconds + d.compute_seconds + d.neither_seconds - d.io_and_compute_seconds
    assert abs(total - d.wall_seconds) <= _EPS


def _streamed_model(src: Path) -> Callable[[], co.Model]:
    engine = co.EngineConfig(ram_budget=_budget(src, 8), io=co.IOConfig(workers=1),
                             cache=co.CacheConfig(history=False))
    return lambda: co.Model.load(src, engine=engine)


def test_streamed_decode_splits_its_wall_time() -> None:
    src = build_tiny_model("qwen3_moe").hf_dir
    with _streamed_model(src)() as m:
        d, lo, hi = _decode(m, 24)
        assert d.reads > 0  # 8 slots: the decode streams
        _check_partition(d, lo, hi)
        assert d.compute_seconds > 0 and d.disk_busy_seconds > 0
        # The activity clock's disk bit follows the read pool's own busy time.
        assert abs(d.disk_busy_seconds - d.busy_seconds) <= 0.05 * d.wall_seconds + 1e-3


def test_resident_decode_has_no_disk_busy_time() -> None:
    src = build_tiny_model("qwen3_moe").hf_dir
    engine = co.EngineConfig(cache=co.CacheConfig(history=False, preload=True))
    with co.Model.load(src, engine=engine) as m:
        d, lo, hi = _decode(m, 24)
        _check_partition(d, lo, hi)
        assert d.reads == 0 and d.disk_busy_seconds == 0.0
        assert d.compute_seconds > 0


def test_compute_covers_the_forward_phases_but_the_waits() -> None:
    """Compute is the forward thread inside a forward, less its waits for experts: at least
    every timed phase but expert_wait (whose timer starts before the wait's mark)."""
    src = build_tiny_model("qwen3_moe").hf_dir
    with _streamed_model(src)() as m:
        a, p0 = m.stats().experts, m.stats().phases
        s = m.session()
        s.forward(prompt_ids(12))
        for t in prompt_ids(8, seed=3):
            s.forward([t])
        b, p1 = m.stats().experts, m.stats().phases
        assert a is not None and b is not None and p0 is not None and p1 is not None
        d, ph = b.minus(a), p1.minus(p0)
        assert d.compute_seconds >= ph.total - ph.expert_wait - 1e-3


def test_display_and_dict_carry_the_breakdown() -> None:
    e = co.ExpertStats(hits=1, io_and_compute_seconds=0.5, io_only_seconds=0.25,
                       compute_only_seconds=1.0, neither_seconds=0.25)
    assert e.wall_seconds == 2.0 and e.disk_busy_seconds == 0.75 and e.compute_seconds == 1.5
    d = e.to_dict()
    assert d["wall_seconds"] == 2.0 and d["neither_seconds"] == 0.25
    assert "disk busy 37.5%, compute 75.0%, neither 12.5% of" in repr(e)
