"""The device cap on reads in flight (IOConfig.max_in_flight, ReadPool.max_in_flight):
never more reads on the device than the cap, whatever the workers; a waiter's read goes
ahead of queued prefetches when a place frees; the same bytes and the same logits."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import colibri as co
from colibri import _core as core
from support.modelfactory import build_tiny_model, prompt_ids

cio: Any = core.io


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes]:
    p = tmp_path_factory.mktemp("cap") / "f.bin"
    data = random.Random(5).randbytes(4 * 1024 * 1024 + 777)
    p.write_bytes(data)
    return str(p), data


def _max_overlap(trace: dict[str, Any]) -> int:
    events = [(float(t), 1) for t in trace["started"]]
    events += [(float(t), -1) for t in trace["finished"]]
    events.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    depth = most = 0
    for _, d in events:
        depth += d
        most = max(most, depth)
    return most


@pytest.mark.parametrize("cap", [1, 2])
def test_cap_bounds_reads_on_the_device(data_file: tuple[str, bytes], cap: int) -> None:
    path, data = data_file
    with cio.ReadPool([path], workers=4, direct=True, fault="slow_read") as pool:
        assert pool.max_in_flight == 0
        pool.max_in_flight = cap
        assert pool.max_in_flight == cap
        pool.start_trace(1000)
        rng = random.Random(cap)
        reqs = [(rng.randrange(len(data) - 70000), rng.randrange(1, 70000)) for _ in range(24)]
        tickets = [(pool.submit(0, o, n, urgent=i % 3 == 0), o, n) for i, (o, n) in enumerate(reqs)]
        rng.shuffle(tickets)
        for t, o, n in tickets:
            assert pool.wait(t).tobytes() == data[o:o + n]
        trace = pool.trace()
        s = pool.stats()
    assert len(trace["started"]) == 24
    assert _max_overlap(trace) <= cap
    assert s["reads"] == 24 and s["errors"] == 0
    assert 0 < s["busy_seconds"]


def test_a_waiter_goes_ahead_of_queued_prefetches(data_file: tuple[str, bytes]) -> None:
    path, data = data_file
    with cio.ReadPool([path], workers=2, direct=True, fault="slow_read") as pool:
        pool.max_in_flight = 1
        pool.start_trace(1000)
        prefetches = [pool.submit(0, i * 65536, 65536) for i in range(12)]
        wanted = prefetches[-1]  # queued last: without the waiter it would run last
        assert pool.wait(wanted).tobytes() == data[11 * 65536:12 * 65536]
        for t in prefetches[:-1]:
            pool.wait(t)
        trace = pool.trace()
        s = pool.stats()
    order = list(np.argsort(trace["started"]))
    offsets = [int(trace["offset"][i]) for i in order]
    # The wanted read starts within the first few (the reads the workers started before
    # the waiter came: a loaded machine may delay it a few 3 ms reads), not twelfth.
    assert offsets.index(11 * 65536) <= 5
    assert s["cap_waits"] <= 1  # one waiter: it waits for a place at most once per read
    assert _max_overlap(trace) <= 1


def test_cap_is_validated(data_file: tuple[str, bytes]) -> None:
    with cio.ReadPool([data_file[0]], workers=1) as pool:
        with pytest.raises(Exception, match="reads in flight"):
            pool.max_in_flight = -1
    with pytest.raises(co.errors.ConfigError):
        co.IOConfig(max_in_flight=-1)
    with pytest.raises(co.errors.ConfigError):
        co.IOConfig(max_in_flight="some")  # type: ignore[arg-type]
    io = co.IOConfig(max_in_flight="auto")
    assert co.IOConfig.from_dict(io.to_dict()) == io and io.max_in_flight == "auto"
    assert co.IOConfig().max_in_flight == 0


def _budget(src: Path, slots: int) -> int:
    probe = co.Model.load(src, engine=co.EngineConfig(cache=co.CacheConfig(history=False)))
    mem = probe.stats().memory
    probe.close()
    assert mem is not None
    return mem.dense_bytes + mem.kv_bytes + mem.work_bytes + slots * mem.slot_bytes


def test_capped_models_give_the_same_logits() -> None:
    """max_in_flight = 0, 1 and auto stream the same experts in a different order: the same
    bits; auto caps at the best depth of its measured curve (ties within 3%: the smaller)."""
    src = build_tiny_model("qwen3_moe").hf_dir
    budget = _budget(src, 10)
    outs = []
    for cap in (0, 1, "auto"):
        engine = co.EngineConfig(ram_budget=budget, io=co.IOConfig(workers=2, max_in_flight=cap),
                                 cache=co.CacheConfig(history=False))
        with co.Model.load(src, engine=engine) as m:
            c = m._require_core()
            curve = list(c.io_depth_curve)
            if cap == "auto":
                best = max(g for _, g in curve)
                want = min(d for d, g in curve if g >= 0.97 * best)
                assert c.io_max_in_flight == want and c.io_workers == 2
                assert m.stats().io.startswith(f"2 workers, {want} read")
                assert "(auto;" in m.stats().io
            else:
                assert curve == [] and c.io_max_in_flight == cap
            s = m.session()
            outs.append(np.stack([s.forward(prompt_ids(12)).copy()]
                                 + [s.forward([t]).copy() for t in prompt_ids(10, seed=3)]))
            e = m.stats().experts
            assert e.busy_seconds > 0 and e.busy_throughput > 0
            if cap == 0:
                assert e.cap_waits == 0
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
