"""The RAM budget holds (docs/streaming.md, "The budget": one budget for the whole engine;
the process never exceeds it by more than a documented margin), and a budget too small
for the model is refused at load with a ConfigError that states a minimum that works.

The peak-RSS check runs in a fresh interpreter, so the peak is this model's alone: a
synthetic Qwen3-MoE (benchmarks/synthetic_moe.py, random Q4_0 weights and a random
router) with 216 MiB of routed experts, streamed with O_DIRECT through a cache of 24
experts (21 MiB, a tenth of them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import colibri as co
from colibri.errors import ConfigError
from support.modelfactory import TinyModel
from support.streaming_helpers import engine

REPO = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join(str(Path(p).parent) for p in co.__path__)
MiB = 1 << 20

MARGIN = 32 * MiB
"""How far above ``ram_budget`` the process's peak RSS may go. The budget counts the
engine's memory (dense weights, KV cache, work buffers, the expert cache's slots); it does
not count what Python creates while loading and running: the manifest and GGUF metadata
(tensor records, the token list), the RoPE table and the logits arrays handed back, the
malloc arenas of the compute and I/O threads (glibc gives each thread its own) and their
stacks, page tables, and freed memory the allocator keeps. Measured on this model: about
5 MiB above the dense weights and the cache together. 32 MiB leaves room for other
allocators and kernels, and is still far below what a leak of the streamed experts would
show (216 MiB of experts, read about three times over) or a fully resident load (~230 MiB;
checked below, so the test can fail)."""

THREADS = 2
SLOTS = 24  # experts in the streamed run's cache: 24 of 256

# Runs in a fresh interpreter: baseline RSS after the imports, then load, prefill 32
# random tokens, decode 16 greedy ones; prints the RSS figures and the stats as JSON.
CHILD = r"""
import json, sys

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(key + " not in /proc/self/status")

import colibri as co
import numpy as np
from colibri.settings.config import CacheConfig, IOConfig

baseline = status("VmRSS")
path, budget, preload = sys.argv[1], int(sys.argv[2]) or None, sys.argv[3] == "1"
m = co.Model.load(path, engine=co.EngineConfig(
    threads=co.ThreadConfig(n=int(sys.argv[4])), ram_budget=budget, context_length=1024,
    activation_precision="int8", io=IOConfig(workers=4, direct=True, prefetch=True),
    cache=CacheConfig(policy="lru", history=False, preload=preload),
))
rng = np.random.default_rng(0)
s = m.session()
logits = s.forward([int(x) for x in rng.integers(0, 256, 32)])
for _ in range(16):
    logits = s.forward([int(np.argmax(logits))])
st = m.stats()
print(json.dumps({"baseline": baseline, "hwm": status("VmHWM"),
                  "memory": st.memory.to_dict(), "experts": st.experts.to_dict()}))
"""


def _synthetic_moe() -> ModuleType:
    name = "synthetic_moe"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "synthetic_moe.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 layers x 32 experts (top-4) of 864 KiB: 216 MiB of experts, ~4 MiB dense."""
    sm = _synthetic_moe()
    preset = sm.Preset(
        "budget-test", n_layers=8, hidden=512, n_heads=8, n_kv_heads=2, head_dim=64,
        n_experts=32, top_k=4, expert_ffn=1024, vocab=1024, context_length=1024,
    )  # fmt: skip
    path: Path = tmp_path_factory.mktemp("budget") / "synthetic.gguf"
    sm.write_synthetic_gguf(preset, path, seed=1)
    assert preset.expert_bytes == 216 * MiB
    return path


def _child(path: Path, budget: int | None, preload: bool) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(budget or 0), "1" if preload else "0",
         str(THREADS)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": PYTHONPATH},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_peak_rss_within_budget(synthetic: Path) -> None:
    # Same settings as the child (int8 activations: an f16 KV cache under "auto").
    probe = co.Model.load(synthetic, engine=engine(threads=THREADS, context_length=1024,
                                                   precision="int8"))
    mem = probe.stats().memory
    assert mem is not None
    resident = mem.dense_bytes + mem.kv_bytes + mem.work_bytes
    budget = resident + SLOTS * mem.slot_bytes
    probe.close()

    r = _child(synthetic, budget, preload=False)
    m, ex = r["memory"], r["experts"]
    assert m["budget"] == budget and m["cache_slots"] == SLOTS
    assert m["expert_bytes"] >= 4 * m["cache_bytes"]  # experts: 10x the cache part
    # Many different experts went through the cache, several times its size in bytes.
    assert ex["misses"] > 4 * SLOTS and ex["evictions"] > 4 * SLOTS
    assert ex["bytes_read"] > 2 * m["expert_bytes"] > 16 * m["cache_bytes"]
    assert ex["read_errors"] == 0
    grown = r["hwm"] - r["baseline"]
    assert grown <= budget + MARGIN, (
        f"peak RSS grew {grown / MiB:.1f} MiB over a budget of {budget / MiB:.1f} MiB "
        f"(+ margin {MARGIN / MiB:.0f} MiB)"
    )

    # The same model with every expert resident goes well past that: the check can fail.
    full = _child(synthetic, None, preload=True)
    fm = full["memory"]
    assert fm["cached_experts"] == fm["total_experts"] == 256
    assert full["experts"]["misses"] == 0
    assert full["hwm"] - full["baseline"] > budget + MARGIN + 64 * MiB


# --- a budget too small for the model -------------------------------------------------------


def _resident(path: Path) -> tuple[int, int, int]:
    """(resident bytes, slot bytes, top-k) of a model, from a first load."""
    m = co.Model.load(path, engine=engine())
    mem = m.stats().memory
    assert mem is not None
    return mem.dense_bytes + mem.kv_bytes + mem.work_bytes, mem.slot_bytes, \
        m.config.n_experts_per_tok


def _stated_minimum(err: ConfigError) -> int:
    found = re.search(r"the minimum is [^;(]+\((?:[^;)]*; )?(\d+) bytes\)", str(err))
    assert found, str(err)
    return int(found.group(1))


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
def test_budget_below_resident_part_is_refused(tiny_models: dict[str, TinyModel],
                                               family: str) -> None:
    path = tiny_models[family].gguf["Q8_0"]
    resident, slot, k = _resident(path)
    for budget in (1, resident // 2, resident - 1):
        with pytest.raises(ConfigError, match="EngineConfig.ram_budget") as exc:
            co.Model.load(path, engine=engine(budget=budget))
        msg = str(exc.value)
        assert "dense weights" in msg and "KV cache" in msg and "work buffers" in msg, msg
        assert _stated_minimum(exc.value) >= resident, msg
    # Room for the resident part but not for one layer's top-k experts.
    with pytest.raises(ConfigError, match=f"room for {k} experts") as exc:
        co.Model.load(path, engine=engine(budget=resident + k * slot - 1))
    assert _stated_minimum(exc.value) == resident + k * slot
    # The size-text form of a budget is read the same way.
    m = co.Model.load(path, engine=engine(budget=f"{resident + k * slot}B"))
    assert m.stats().memory.cache_slots == k  # type: ignore[union-attr]


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_stated_minimum_budget_loads(tiny_models: dict[str, TinyModel], family: str) -> None:
    """The minimum a ConfigError states is enough: loading with exactly that budget works
    (and one byte less is refused). Fails while a budget below the resident part gets
    the resident part alone as its 'minimum', without the smallest expert cache
    (streaming.check_resident_fits plans with min_slots=0), so following the advice only
    leads to a second ConfigError with a larger minimum."""
    path = tiny_models[family].gguf["Q4_0"]
    resident, _, _ = _resident(path)
    for budget in (resident // 2, resident):
        with pytest.raises(ConfigError) as exc:
            co.Model.load(path, engine=engine(budget=budget))
        minimum = _stated_minimum(exc.value)
        with pytest.raises(ConfigError):
            co.Model.load(path, engine=engine(budget=minimum - 1))
        try:
            co.Model.load(path, engine=engine(budget=minimum))
        except ConfigError as again:
            pytest.fail(f"budget {budget}: the stated minimum {minimum} is refused too: "
                        f"{again}")


# --- the split from the manifest alone (what benchmarks size their disk bound with) -------


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("source", ["Q4_0", "Q8_0", "hf"])
def test_plan_from_manifest_matches_the_load(tiny_models: dict[str, TinyModel], family: str,
                                             source: str) -> None:
    """streaming.plan_from_manifest, computed before any weight is read, gives the split
    the load then makes with the core's figures: the same dense bytes, slot size and slot
    count, at budgets on either side of a slot boundary (a 1-byte disagreement in the
    resident part or the slot size would move the count there). bench_streaming.py reads
    its disk bound into that many slabs (--bound-slabs auto)."""
    from colibri.engine.core_spec import resolved_context_length
    from colibri.engine.streaming import plan_from_manifest
    from colibri.sources import open_model_source

    tm = tiny_models[family]
    path = tm.hf_dir if source == "hf" else tm.gguf[source]
    resident, slot, k = _resident(path)
    manifest = open_model_source(path)
    for budget in (resident + k * slot, resident + (k + 3) * slot - 1,
                   resident + (k + 3) * slot, resident + (k + 5) * slot + slot // 2):
        cfg = engine(budget=budget)
        plan = plan_from_manifest(manifest, cfg, resolved_context_length(manifest.config, cfg))
        mem = co.Model.load(path, engine=cfg).stats().memory
        assert mem is not None
        assert (plan.dense_bytes, plan.slot_bytes, plan.cache_slots) == \
            (mem.dense_bytes, mem.slot_bytes, mem.cache_slots), budget
    assert plan.cache_slots == k + 5  # the budgets above do reach past the minimum
    with pytest.raises(ConfigError):  # and it refuses what the load refuses
        plan_from_manifest(manifest, engine(budget=resident + k * slot - 1),
                           resolved_context_length(manifest.config, engine()))


def test_bench_planned_slots_are_the_childs(tiny_models: dict[str, TinyModel]) -> None:
    """benchmarks/_stream_child.planned_cache_slots (the slabs of bench_streaming.py's disk
    bound) gives the slot count a child loading the same spec gets."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        spec_ = importlib.util.spec_from_file_location(
            "_stream_child", REPO / "benchmarks" / "_stream_child.py")
        assert spec_ is not None and spec_.loader is not None
        child = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(child)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    path = tiny_models["qwen3_moe"].gguf["Q4_0"]
    resident, slot, k = _resident(path)
    spec = {"path": str(path), "threads": 2, "ctx": 256, "wait_policy": "auto",
            "ram_budget": resident + (k + 7) * slot,
            "io": {"workers": 2, "direct": True, "prefetch": True},
            "cache": {"policy": "lfru", "history": False}}
    planned = child.planned_cache_slots(spec)
    mem = co.Model.load(path, engine=child.engine_config(spec)).stats().memory
    assert mem is not None and planned == mem.cache_slots
    assert planned > k  # more than the minimum: the figure is the budget's, not a floor
