"""The prefetch policy (issue 14, "use the device"): the governor that turns the lookahead
off when its recent accuracy is low and on again when it recovers, the read queue that
puts demand reads before prefetches, the read pool's in-flight count that the idle-capacity
throttle compares with the workers, and the engine's counters of all three. Each is
checked against a plain Python model of the rule (the oracle) or an exact invariant;
streamed logits stay bit-identical with the throttle and the governor at work."""

from __future__ import annotations

import random
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest

import colibri as co
from colibri import _core
from support.modelfactory import build_tiny_model, prompt_ids

cio = _core.io


def _oracle(outcomes: list[bool], window: int, min_samples: int, off_below: float,
            on_at: float) -> list[tuple[bool, float]]:
    """The governor's rule written plainly: (active, accuracy) after each outcome."""
    recent: deque[bool] = deque(maxlen=window)
    active, out = True, []
    for used in outcomes:
        recent.append(used)
        acc = sum(recent) / len(recent)
        if len(recent) >= min_samples:
            if active and acc < off_below:
                active = False
            elif not active and acc >= on_at:
                active = True
        out.append((active, acc))
    return out


def test_governor_turns_off_after_useless_prefetches_and_on_again() -> None:
    g = cio.PrefetchGovernor(window=64, min_samples=16, off_below=0.5, on_at=0.6)
    assert g.active and g.samples == 0
    for _ in range(15):  # useless, but too few to decide on
        g.record(False)
    assert g.active
    g.record(False)  # the 16th: accuracy 0 < 0.5
    assert not g.active and g.switched_off == 1
    # Good guesses bring it back only once the window's accuracy reaches on_at: the 16
    # misses stay in the window, so 24 hits are needed (24 / 40 = 0.6).
    for i in range(23):
        g.record(True)
        assert not g.active, i
    g.record(True)
    assert g.active and g.switched_on == 1
    assert g.accuracy == pytest.approx(24 / 40)


def test_governor_hysteresis_keeps_state_between_the_thresholds() -> None:
    g = cio.PrefetchGovernor(window=20, min_samples=20, off_below=0.5, on_at=0.6)
    for i in range(20):
        g.record(i % 20 < 11)  # 11 of 20: 0.55, between the thresholds
    assert g.active  # never below 0.5 after the 20th
    for _ in range(3):
        g.record(False)  # window now 8 of 20 used -> 0.4: off
    assert not g.active
    for _ in range(3):
        g.record(True)  # back to 11/20 = 0.55: still off (below on_at)
    assert not g.active and g.switched_on == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_governor_matches_the_plain_rule_on_random_outcomes(seed: int) -> None:
    rng = random.Random(seed)
    outcomes: list[bool] = []
    for _ in range(12):  # stretches of good and bad guessing
        p = rng.choice([0.2, 0.45, 0.58, 0.7, 0.9])
        outcomes += [rng.random() < p for _ in range(rng.randint(10, 120))]
    params = dict(window=50, min_samples=20, off_below=0.55, on_at=0.65)
    g = cio.PrefetchGovernor(**params)  # type: ignore[arg-type]
    want = _oracle(outcomes, **params)  # type: ignore[arg-type]
    flips = 0
    for used, (active, acc) in zip(outcomes, want, strict=True):
        before = g.active
        g.record(used)
        assert g.active == active and g.accuracy == pytest.approx(acc)
        flips += before != g.active
    assert flips == g.switched_off + g.switched_on
    g.reset()
    assert g.active and g.samples == 0


def test_governor_rejects_bad_settings() -> None:
    with pytest.raises(co.errors.InvalidRequestError):
        cio.PrefetchGovernor(window=8, min_samples=9)
    with pytest.raises(co.errors.InvalidRequestError):
        cio.PrefetchGovernor(off_below=0.7, on_at=0.6)


def test_read_queue_puts_demand_reads_first_fifo_within_each() -> None:
    rng = random.Random(3)
    q = cio.ReadQueue()
    pushed = [(t, rng.random() < 0.4) for t in range(1, 60)]
    for t, urgent in pushed[:30]:
        q.push(t, urgent)
    got = [q.pop() for _ in range(10)]
    for t, urgent in pushed[30:]:
        q.push(t, urgent)
    got += [q.pop() for _ in range(len(q))]
    # Oracle: at each pop, the oldest demand read if any, else the oldest prefetch.
    demand: deque[int] = deque()
    pre: deque[int] = deque()
    want = []
    for t, urgent in pushed[:30]:
        (demand if urgent else pre).append(t)
    for _ in range(10):
        want.append((demand or pre).popleft())
    for t, urgent in pushed[30:]:
        (demand if urgent else pre).append(t)
    while demand or pre:
        want.append((demand or pre).popleft())
    assert got == want
    with pytest.raises(co.errors.InvalidRequestError):
        q.pop()


def test_demand_read_overtakes_queued_prefetches(tmp_path: Path) -> None:
    """One worker, slow reads (3 ms each): a blocker, 16 prefetches, then a demand read.
    In submission order the demand read would finish after all 16 prefetches; demand
    first, it finishes right after the blocker (or before it, when the worker had not
    taken the blocker yet), with almost all prefetches still queued (a few may finish
    while this thread is descheduled, never all of them)."""
    p = tmp_path / "data.bin"
    p.write_bytes(np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
    with cio.ReadPool([str(p)], workers=1, direct=False, fault="slow_read") as pool:
        blocker = pool.submit(0, 0, 4096)
        prefetches = [pool.submit(0, 4096 * (i + 1), 4096) for i in range(16)]
        demand = pool.submit(0, 4096 * 20, 4096, urgent=True)
        assert pool.in_flight() == 18
        deadline = time.monotonic() + 30
        while not pool.done(demand):
            assert time.monotonic() < deadline
            time.sleep(0.0002)
        done_then = sum(pool.done(t) for t in prefetches)
        assert done_then < len(prefetches)
        left = [t for t in prefetches if not pool.cancel(t)]
        for t in [blocker, demand, *left]:
            pool.wait(t)
        assert pool.in_flight() == 0


def _budget(src: Path, slots: int) -> int:
    probe = co.Model.load(src, engine=co.EngineConfig(cache=co.CacheConfig(history=False)))
    mem = probe.stats().memory
    probe.close()
    assert mem is not None
    return mem.dense_bytes + mem.kv_bytes + mem.work_bytes + slots * mem.slot_bytes


def _decode(src: Path, budget: int, workers: int, prefetch: bool,
            fault: bool) -> tuple[np.ndarray, co.ModelStats]:
    engine = co.EngineConfig(ram_budget=budget, io=co.IOConfig(workers=workers, prefetch=prefetch),
                             cache=co.CacheConfig(history=False))
    with co.Model.load(src, engine=engine) as m:
        if fault:
            m.set_io_fault("slow_read")
        s = m.session()
        rows = [s.forward(prompt_ids(12)).copy()]
        for t in prompt_ids(40, seed=5):
            rows.append(s.forward([t]).copy())
        return np.stack(rows), m.stats()


@pytest.mark.parametrize("workers", [1, 2])
def test_throttled_prefetch_counters_and_bit_identical_logits(workers: int) -> None:
    """Slow reads with few workers leave little idle I/O capacity: some candidates are
    throttled. The counters add up, hit rates are reported both ways, and the logits equal
    those without prefetch bit for bit."""
    src = build_tiny_model("qwen3_moe").hf_dir
    budget = _budget(src, 10)
    off, s_off = _decode(src, budget, workers, prefetch=False, fault=True)
    on, s_on = _decode(src, budget, workers, prefetch=True, fault=True)
    assert np.array_equal(on, off)
    e = s_on.experts
    assert e.prefetch_candidates > 0
    assert e.prefetch_candidates_used <= e.prefetch_candidates
    # Every candidate is issued, throttled, suppressed (governor off) or found no free slot.
    assert e.prefetch_issued + e.prefetch_throttled + e.prefetch_suppressed <= e.prefetch_candidates
    assert e.prefetch_issued > 0
    if workers == 1:  # each layer's own misses (3 ms each) still hold the one worker
        assert e.prefetch_throttled > 0
    assert abs(e.prefetch_switched_off - e.prefetch_switched_on) <= 1
    assert 0 <= e.prefetch_accuracy <= 1
    assert e.ready_hit_rate <= e.hit_rate
    assert s_on.prefetch.startswith(("on (accuracy", "paused (accuracy"))
    assert s_off.prefetch == "off"
    assert s_off.experts.prefetch_candidates == 0 and s_off.experts.ready_hits == s_off.experts.hits


def test_workers_auto_uses_the_knee_of_its_measured_curve() -> None:
    """workers="auto": the core times reads at 1, 2, 4, 8 in flight at load and keeps the
    smallest depth within 90% of the best; the logits are those of a fixed worker count."""
    assert co.IOConfig(workers="auto").to_dict()["workers"] == "auto"
    assert co.IOConfig.from_dict(co.IOConfig(workers="auto").to_dict()).workers == "auto"
    with pytest.raises(co.errors.ConfigError):
        co.IOConfig(workers="many")  # type: ignore[arg-type]
    src = build_tiny_model("qwen3_moe").hf_dir
    budget = _budget(src, 10)
    outs = []
    for workers in ("auto", 2):
        engine = co.EngineConfig(ram_budget=budget, io=co.IOConfig(workers=workers),
                                 cache=co.CacheConfig(history=False))
        with co.Model.load(src, engine=engine) as m:
            core = m._require_core()
            curve = list(core.io_depth_curve)
            if workers == "auto":
                assert [d for d, _ in curve] == [1, 2, 4, 8]
                assert all(g > 0 for _, g in curve)
                best = max(g for _, g in curve)
                knee = min(d for d, g in curve if g >= 0.9 * best)
                assert core.io_workers == knee
                assert m.stats().io.startswith(f"{knee} workers (auto;")
            else:
                assert curve == [] and core.io_workers == 2
            s = m.session()
            outs.append(np.stack([s.forward(prompt_ids(12)).copy()]
                                 + [s.forward([t]).copy() for t in prompt_ids(10, seed=3)]))
    assert np.array_equal(outs[0], outs[1])
