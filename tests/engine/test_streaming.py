"""Placement never changes tokens (docs/streaming.md): with routed experts
streamed through a cache that holds only a few of them, the logits are bit-identical to a
run with every expert resident, whatever the I/O workers, O_DIRECT, prefetch, cache policy
or team size; and the expert counters say what happened (misses, evictions, bytes read,
prefetches, batch union in a prefill).

The full grid of settings runs on one model (a native container of the tiny Qwen3-MoE);
every other source (each tiny MoE family from its Hugging Face checkpoint, quantized GGUFs,
a quantized container, a synthetic Qwen3-MoE with 128 experts per layer and top-8 as real
models have, the demo MoE built from SmolLM2 with distinct experts, and one source per
DeepSeek / GLM family: MLA, DSA, sigmoid group-limited and V2 routers, MTP layers) runs a
base streamed setting and one change of one axis at a time.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import colibri as co
from colibri.convert import write_container
from colibri.sources import open_model_source
from support.deepseek_factory import build_tiny
from support.modelfactory import REPO, TinyModel
from support.streaming_helpers import (
    Trace,
    assert_same_trace,
    budget_for_slots,
    distinct_routed,
    engine,
    prompt,
    route_counts,
    run_trace,
    write_history,
)

# name -> how to get its path from the tiny models and a scratch directory
SOURCES: dict[str, Callable[[dict[str, TinyModel], Path], Path]] = {
    "qwen3_moe-container": lambda t, d: _container(t["qwen3_moe"].hf_dir, d / "qwen3.colibri"),
    "qwen3_moe-hf": lambda t, d: t["qwen3_moe"].hf_dir,
    "qwen2_moe-hf": lambda t, d: t["qwen2_moe"].hf_dir,
    "olmoe-hf": lambda t, d: t["olmoe"].hf_dir,
    "mixtral-hf": lambda t, d: t["mixtral"].hf_dir,
    "qwen2_moe-Q4_0": lambda t, d: t["qwen2_moe"].gguf["Q4_0"],
    "mixtral-Q8_0": lambda t, d: t["mixtral"].gguf["Q8_0"],
    "olmoe-container-q4_0": lambda t, d: _container(t["olmoe"].hf_dir, d / "olmoe.colibri",
                                                    "q4_0"),
    # K-quant experts: the synthetic MoE with rows of 256 (benchmarks/synthetic_moe.py,
    # preset tiny-k), as a container written by colibri's q4_k_m (Q4_K / Q6_K experts,
    # Q8_0 / Q5_K / Q6_K dense) and as GGUFs written by llama.cpp's own quantizer.
    "tiny-k-container-q4_k_m": lambda t, d: _container(_tiny_k(d), d / "tiny-k.colibri",
                                                       "q4_k_m"),
    "tiny-k-Q4_K_M": lambda t, d: _llama_quantized(d, "Q4_K_M"),
    "tiny-k-Q2_K": lambda t, d: _llama_quantized(d, "Q2_K"),
    "qwen2_moe-container-q5_k_m": lambda t, d: _container(t["qwen2_moe"].hf_dir,
                                                          d / "qwen2.colibri", "q5_k_m"),
    "synthetic-wide": lambda t, d: _synthetic("wide", d / "wide.gguf"),
    # The DeepSeek / GLM family (deepseek_factory): one source per family, sigmoid grouped
    # routing with a selection bias, MTP layers' experts in the store, DSA selections.
    "deepseek_v3-hf": lambda t, d: _deepseek("deepseek_v3"),
    "kimi_k2-container-q8_0": lambda t, d: _container(_deepseek("kimi_k2"), d / "kimi.colibri",
                                                      "q8_0"),
    "deepseek_v2_lite-hf": lambda t, d: _deepseek("deepseek_v2_lite"),
    "deepseek_v2_glg-hf": lambda t, d: _deepseek("deepseek_v2_glg"),
    "deepseek_v32-gguf-Q8_0": lambda t, d: _deepseek("deepseek_v32", "Q8_0"),
    "glm_moe_dsa-hf": lambda t, d: _deepseek("glm_moe_dsa"),
    "glm4_moe-gguf-Q8_0": lambda t, d: _deepseek("glm4_moe", "Q8_0"),
    "glm4_moe_lite-container": lambda t, d: _container(_deepseek("glm4_moe_lite"),
                                                       d / "lite.colibri"),
}
_EXPERT = re.compile(r"^blk\.(\d+)\.ffn_(?:gate|up|down)_exps\.(\d+)$")
# The grid on K-quant experts too, and on MLA with sigmoid group-limited routing, a
# selection bias and an MTP layer whose experts share the cache.
GRID_SOURCES = ["qwen3_moe-container", "tiny-k-container-q4_k_m", "deepseek_v3-hf"]
GRID_SOURCE = GRID_SOURCES[0]


def _synthetic(preset: str, dst: Path) -> Path:
    """benchmarks/synthetic_moe.py's preset (random Q4_0 weights), written to `dst`."""
    name = "synthetic_moe"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[2] / "benchmarks" / "synthetic_moe.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    sys.modules[name].write_synthetic_gguf(preset, dst, seed=0)
    return dst


def _deepseek(variant: str, gguf: str | None = None) -> Path:
    """A DeepSeek/GLM-family tiny model: its checkpoint, or a GGUF llama.cpp's converter
    wrote."""
    if gguf is None:
        return build_tiny(variant, with_gguf=False).hf_dir
    return build_tiny(variant).gguf[gguf]


def _container(src: Path, dst: Path, quant: str = "keep") -> Path:
    write_container(src, dst, quant=quant)
    return dst


def _tiny_k(d: Path) -> Path:
    name = "synthetic_moe"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    path = d / "tiny-k.gguf"
    sys.modules[name].write_synthetic_gguf("tiny-k", path, seed=0)
    return path


def _llama_quantized(d: Path, mix: str) -> Path:
    from support.llamacpp_quant import quantize_gguf  # needs llama-cpp-python

    return quantize_gguf(_tiny_k(d), mix, d / f"tiny-k-{mix}.gguf")


class Bench:
    """One source: its path, resident reference trace, routing history and budgets."""

    def __init__(self, path: Path, scratch: Path) -> None:
        self.path = path
        self.scratch = scratch
        self.ids = prompt()
        # Resident reference: every expert read at load, no streaming at all.
        hist = scratch / "history.json"
        ref = co.Model.load(path, engine=engine(workers=0, prefetch=False, preload=True,
                                                history_path=hist))
        self.config = ref.config
        self.top_k = ref.config.n_experts_per_tok
        mem = ref.stats().memory
        assert mem is not None and mem.cache_slots == mem.total_experts > 0
        self.reference: Trace = run_trace(ref, self.ids)
        assert ref.stats().experts.misses == 0  # resident: nothing was read after load
        ref.save_routing_history()  # counts of this run: what the pinned policy pins
        assert hist.is_file()
        self._history = hist
        self._budgets: dict[tuple[int, int], int] = {}
        # The smallest expert (gate + up + down): a mix can hold experts of several types
        # (llama.cpp's Q4_K_M gives some layers' down projections Q6_K).
        sizes: dict[tuple[int, int], int] = {}
        for t in open_model_source(path).tensors.values():
            if (mt := _EXPERT.match(t.name)) is not None:
                key = (int(mt[1]), int(mt[2]))
                sizes[key] = sizes.get(key, 0) + t.nbytes
        self.min_expert_bytes = min(sizes.values())

    def budget(self, slots: int, threads: int) -> int:
        key = (slots, threads)
        if key not in self._budgets:
            self._budgets[key] = budget_for_slots(self.path, slots, threads=threads)
        return self._budgets[key]

    def history_copy(self, tag: str) -> Path:
        dst = self.scratch / f"history-{tag}.json"
        shutil.copyfile(self._history, dst)
        return dst


@pytest.fixture(scope="module")
def benches(tiny_models: dict[str, TinyModel],
            tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Bench]:
    made: dict[str, Bench] = {}

    def get(name: str) -> Bench:
        if name not in made:
            d = tmp_path_factory.mktemp(name)
            made[name] = Bench(SOURCES[name](tiny_models, d), d)
        return made[name]

    return get


def _streamed_run(b: Bench, *, slots: int, workers: int = 4, direct: bool = True,
                  prefetch: bool = True, policy: str = "lfru", threads: int = 1,
                  wait_policy: str = "auto", tag: str = "") -> tuple[co.Model, Trace]:
    hist = b.history_copy(tag or "run") if policy == "pinned" else None
    m = co.Model.load(b.path, engine=engine(
        budget=b.budget(slots, threads), workers=workers, direct=direct, prefetch=prefetch,
        policy=policy, threads=threads, wait_policy=wait_policy, history_path=hist,
    ))  # fmt: skip
    return m, run_trace(m, b.ids, b.reference.decode_ids)


def _check_streamed_stats(m: co.Model, b: Bench, *, slots: int, policy: str,
                          prefetch: bool) -> None:
    st = m.stats()
    mem, ex = st.memory, st.experts
    assert mem is not None
    assert mem.cache_slots == slots and mem.cache_bytes == slots * mem.slot_bytes
    assert mem.total_experts > slots
    assert 0 < mem.cached_experts <= slots
    assert ex.misses > 0 and ex.evictions > 0 and ex.bytes_read > 0
    assert ex.bytes_read >= ex.misses * b.min_expert_bytes  # each miss read its expert
    assert ex.read_errors == 0 and ex.checksum_failures == 0
    assert 0.0 <= ex.hit_rate < 1.0
    if policy == "pinned":
        assert mem.pinned_experts > 0
        assert mem.pinned_experts <= int(0.5 * slots)  # CacheConfig.pin_fraction = 0.5
    else:
        assert mem.pinned_experts == 0
    if not prefetch:
        assert ex.prefetch_issued == ex.prefetch_used == ex.prefetch_wasted == 0
    elif slots - mem.pinned_experts > b.top_k:
        # Room beyond one layer's top-k in the unpinned slots: the lookahead reads ahead.
        assert ex.prefetch_issued > 0
        assert ex.prefetch_used + ex.prefetch_wasted <= ex.prefetch_issued


# --- the full grid on one model ---------------------------------------------------------------

GRID = list(itertools.product(
    (0, 1, 4),  # workers
    (True, False),  # direct
    (True, False),  # prefetch
    ("lru", "lfru", "pinned"),  # policy
    (1, 2),  # threads
))  # fmt: skip


@pytest.mark.parametrize("source", GRID_SOURCES)
@pytest.mark.parametrize(("workers", "direct", "prefetch", "policy", "threads"), GRID)
def test_grid_bit_identical_to_resident(benches: Callable[[str], Bench], source: str,
                                       workers: int, direct: bool, prefetch: bool, policy: str,
                                       threads: int) -> None:
    b = benches(source)
    slots = b.top_k + 2  # 4 of qwen3's 24 experts, 4 of tiny-k's 32, 6 of deepseek_v3's 48
    tag = f"{source}-{workers}-{direct}-{prefetch}-{policy}-{threads}"
    m, got = _streamed_run(b, slots=slots, workers=workers, direct=direct, prefetch=prefetch,
                           policy=policy, threads=threads, tag=tag)
    assert_same_trace(got, b.reference, tag)
    _check_streamed_stats(m, b, slots=slots, policy=policy, prefetch=prefetch)


# --- every source: a base streamed setting, then one axis at a time ---------------------------

BASE: dict[str, object] = dict(workers=4, direct=True, prefetch=True, policy="lfru", threads=1)
AXES: list[dict[str, object]] = [
    {},
    {"workers": 0},
    {"workers": 1},
    {"direct": False},
    {"prefetch": False},
    {"policy": "lru"},
    {"policy": "pinned"},
    {"threads": 2},
    {"threads": 2, "wait_policy": "spin"},
    {"threads": 2, "wait_policy": "passive"},
]


@pytest.mark.parametrize("name", list(SOURCES))
@pytest.mark.parametrize("extra_slots", [0, 1], ids=["top_k-slots", "top_k+1-slots"])
def test_sources_bit_identical_to_resident(benches: Callable[[str], Bench], name: str,
                                          extra_slots: int) -> None:
    b = benches(name)
    slots = b.top_k + extra_slots  # the smallest cache the budget allows, or one more slot
    for change in AXES:
        settings = {**BASE, **change}
        tag = f"{name} {settings}"
        m, got = _streamed_run(b, slots=slots, tag=f"axes-{extra_slots}",
                               **settings)  # type: ignore[arg-type]
        assert_same_trace(got, b.reference, tag)
        _check_streamed_stats(m, b, slots=slots, policy=str(settings["policy"]),
                              prefetch=bool(settings["prefetch"]))


@pytest.mark.parametrize("chunk", [1, 2, 3, 8])
def test_prompt_in_chunks(benches: Callable[[str], Bench], chunk: int) -> None:
    # Batches of up to 8 tokens make lookahead prefetches and may need waves of experts.
    b = benches(GRID_SOURCE)
    for slots, policy in ((b.top_k, "lru"), (b.top_k + 1, "lfru"), (b.top_k + 3, "lru")):
        m = co.Model.load(b.path, engine=engine(budget=b.budget(slots, 2), threads=2,
                                                policy=policy))
        s = m.session()
        rows = [s.forward(b.ids[i:i + chunk], all_logits=True)
                for i in range(0, len(b.ids), chunk)]
        assert np.array_equal(np.concatenate(rows), b.reference.prefill), (slots, policy)
        assert m.stats().experts.read_errors == 0


def test_sessions_share_the_cache(benches: Callable[[str], Bench]) -> None:
    # Two sessions on one streamed model, interleaved step by step, each as if alone.
    b = benches("qwen2_moe-hf")
    m = co.Model.load(b.path, engine=engine(budget=b.budget(b.top_k + 1, 2), threads=2))
    s1, s2 = m.session(), m.session()
    other = prompt(seed=99)
    want2 = run_trace(co.Model.load(b.path, engine=engine(preload=True)), other)
    assert np.array_equal(s1.forward(b.ids, all_logits=True), b.reference.prefill)
    assert np.array_equal(s2.forward(other, all_logits=True), want2.prefill)
    for i in range(len(b.reference.decode_ids)):
        assert np.array_equal(s2.forward([want2.decode_ids[i]]), want2.decode[i]), i
        assert np.array_equal(s1.forward([b.reference.decode_ids[i]]),
                              b.reference.decode[i]), i
    ex = m.stats().experts
    assert ex.misses > 0 and ex.evictions > 0


# --- resident runs --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen2_moe-hf", "mixtral-Q8_0"])
def test_resident_default_budget(benches: Callable[[str], Bench], name: str) -> None:
    b = benches(name)
    m = co.Model.load(b.path, engine=engine())  # default budget: every expert fits
    mem = m.stats().memory
    assert mem is not None and mem.cache_slots == mem.total_experts
    assert mem.cached_experts == 0  # nothing read at load without preload
    assert_same_trace(run_trace(m, b.ids, b.reference.decode_ids), b.reference, name)
    first, after = m.stats().experts, m.stats().memory
    assert after is not None
    # Each expert routed was read once, when needed or by a lookahead; none was dropped.
    assert 0 < first.misses <= after.cached_experts
    assert after.cached_experts <= first.misses + first.prefetch_issued - first.prefetch_cancelled
    assert first.evictions == 0

    # Warm: the same forward again reads nothing.
    m.reset_stats()
    s = m.session()
    again = s.forward(b.ids, all_logits=True)
    assert np.array_equal(again, b.reference.prefill)
    ex = m.stats().experts
    assert ex.misses == 0 and ex.bytes_read == 0 and ex.evictions == 0
    assert ex.hits == distinct_routed(s.last_routing())
    assert ex.hit_rate == 1.0


def test_preload_reads_everything_at_load(benches: Callable[[str], Bench]) -> None:
    b = benches("olmoe-hf")
    m = co.Model.load(b.path, engine=engine(preload=True))
    mem = m.stats().memory
    assert mem is not None and mem.cached_experts == mem.cache_slots == mem.total_experts
    m.reset_stats()
    assert_same_trace(run_trace(m, b.ids, b.reference.decode_ids), b.reference)
    ex = m.stats().experts
    assert ex.misses == 0 and ex.bytes_read == 0 and ex.hits > 0 and ex.hit_rate == 1.0


# --- batch union ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen2_moe-hf", "qwen3_moe-container", "mixtral-Q8_0"])
def test_prefill_reads_each_distinct_expert_once(benches: Callable[[str], Bench],
                                                 name: str) -> None:
    b = benches(name)
    k = b.top_k
    n_moe = sum(1 for x in b.config.moe_layers if x)
    for slots in (None, k, k + 1):  # every expert fits; the smallest cache; one slot more
        budget = None if slots is None else b.budget(slots, 1)
        m = co.Model.load(b.path, engine=engine(budget=budget, workers=4, prefetch=True))
        s = m.session()
        logits = s.forward(b.ids, all_logits=True)
        assert np.array_equal(logits, b.reference.prefill), slots
        routing = s.last_routing()
        assert routing.shape == (len(b.ids), b.config.n_layers, k)
        distinct = distinct_routed(routing)
        assert distinct < len(b.ids) * n_moe * k  # the prompt does share experts
        ex = m.stats().experts
        # Cold cache: each distinct (layer, expert) of the prompt is requested once, a miss.
        # (A prefill of 20 tokens makes no lookahead prefetch.)
        assert ex.misses == distinct, (slots, ex)
        assert ex.hits == 0 and ex.prefetch_issued == 0, (slots, ex)
        if slots is None:
            assert ex.evictions == 0
        # Decode: each token requests its top-k in each MoE layer, once.
        for tok in b.reference.decode_ids[:3]:
            before = m.stats().experts
            s.forward([tok])
            d = m.stats().experts.minus(before)
            assert d.hits + d.misses == n_moe * k, (slots, d)


# --- the demo MoE (SmolLM2's FFN as 2 pairs of complementary halves, 30 layers) --------------


@pytest.fixture(scope="module")
def demo_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """experts="halves": the 4 experts of each layer are all different (docs/demo-moe.md),
    so an expert served in place of another's changes the logits. Mutation check (issue 16,
    docs/testing.md): a prefetch in layers >= 4 reading the next expert's bytes (deeper
    than any tiny or synthetic model) fails test_demo_moe_small_budget_bit_identical; with
    the copied experts it used before, the same test passed."""
    from colibri.models.demo_moe import make_demo_moe
    from support.realmodel import smollm2_gguf

    src = smollm2_gguf()
    path: Path = make_demo_moe(src, tmp_path_factory.mktemp("demo") / "demo4.gguf",
                               n_experts=4, top_k=2, seed=3, experts="halves")
    return path


def test_demo_moe_small_budget_bit_identical(demo_moe: Path) -> None:
    ids = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
           411, 407, 19712, 8182, 2]
    resident = co.Model.load(demo_moe, engine=engine(precision="int8", threads=2, workers=0,
                                                     prefetch=False, preload=True))
    want = run_trace(resident, ids, n_decode=4)
    total = resident.stats().memory.total_experts  # type: ignore[union-attr]
    assert total == 30 * 4
    slots = 5  # of 120 experts
    budget = budget_for_slots(demo_moe, slots, threads=2, precision="int8")
    # (The tiny models cover the other settings; this is the costly one on a real model.)
    m = co.Model.load(demo_moe, engine=engine(budget=budget, precision="int8", threads=2,
                                              workers=4, prefetch=True, policy="lfru"))
    got = run_trace(m, ids, want.decode_ids)
    assert_same_trace(got, want)
    st = m.stats()
    assert st.memory is not None and st.memory.cache_slots == slots
    ex = st.experts
    assert ex.misses > 0 and ex.evictions > 0 and ex.read_errors == 0
    assert ex.bytes_read >= ex.misses * st.memory.slot_bytes // 2
    assert ex.prefetch_issued > 0


# --- the pinned policy ----------------------------------------------------------------------


def test_pinned_policy_pins_the_hottest_experts(benches: Callable[[str], Bench],
                                                tmp_path: Path) -> None:
    """CacheConfig(policy="pinned") pins the experts the routing history shows to be hot,
    up to pin_fraction of the cache: which experts those are must depend on the history's
    order, not on which of the experts it lists happen to enter the cache first. A real
    history lists nearly every expert (each seen at least once); adding such rarely-seen
    experts to a history must not change what is pinned.

    Fails while ExpertCache marks every listed key as pinnable and pins the first ones to
    be loaded (set_pins ignores the priority order for keys not cached yet): the prefill's
    first layer takes the pins and the decode's hot experts are never pinned (here: 0 decode
    hits instead of 16, fewer than plain LRU gets with more slots)."""
    b = benches("qwen3_moe-hf")
    c = b.config
    m = co.Model.load(b.path, engine=engine())
    s = m.session()
    s.forward(b.ids)
    decode_counts = np.zeros(c.n_layers * c.n_experts, dtype=np.uint64)
    for tok in b.reference.decode_ids:
        s.forward([tok])
        decode_counts += route_counts(s.last_routing(), c.n_layers, c.n_experts)
    slots = b.top_k + 2
    n_pins = slots // 2  # CacheConfig.pin_fraction = 0.5
    hot = np.argsort(-decode_counts.astype(np.float64), kind="stable")[:n_pins]
    assert np.all(decode_counts[hot] >= 2)

    results = {}
    for floor in (0, 1):  # the other experts: never seen / seen once
        counts = np.full(c.n_layers * c.n_experts, floor, dtype=np.uint64)
        counts[hot] = 1000
        hist = tmp_path / f"history-{floor}.json"
        write_history(hist, m, counts)
        pm = co.Model.load(b.path, engine=engine(
            budget=b.budget(slots, 1), workers=0, prefetch=False, policy="pinned",
            history_path=hist,
        ))  # fmt: skip
        ps = pm.session()
        ps.forward(b.ids)
        pm.reset_stats()
        for tok in b.reference.decode_ids:
            ps.forward([tok])
        mem = pm.stats().memory
        assert mem is not None
        results[floor] = (pm.stats().experts.hits, mem.pinned_experts)
    assert results[0][0] > 0 and results[0][1] == n_pins  # the hot experts stay: decode hits
    assert results[1] == results[0], f"(decode hits, pinned) by history floor: {results}"
