"""Readable reprs (sizes in binary units, rates and durations to 3 significant digits) and
the notebook forms (``_repr_pretty_``, ``_repr_html_``) of the objects users print."""

from __future__ import annotations

import re
from typing import Any

import pytest

import colibri as co
from colibri.display import duration, sig3
from colibri.engine.stats import ExpertStats, MemoryStats, PhaseTimes
from support.realmodel import smollm2_gguf

# A float printed with Python's full precision (e.g. 0.6870443190000515) or a raw byte
# count of a size (e.g. 96576768): what the reprs must not show.
LONG_FLOAT = re.compile(r"\d\.\d{5,}")
RAW_BYTES = re.compile(r"\d{7,}")


class _Printer:
    """The part of IPython's RepresentationPrinter that _repr_pretty_ uses."""

    def __init__(self) -> None:
        self.out = ""

    def text(self, s: str) -> None:
        self.out += s


def _check(obj: Any, *needles: str) -> str:
    r = repr(obj)
    assert len(r) < 400, r
    assert not LONG_FLOAT.search(r) and not RAW_BYTES.search(r), r
    for n in needles:
        assert n in r, (n, r)
    p = _Printer()
    obj._repr_pretty_(p, False)
    assert p.out.startswith(type(obj).__name__) and "\n" in p.out
    html = obj._repr_html_()
    assert html.startswith("<table>") and html.endswith("</table>")
    return r


def test_formatting_helpers() -> None:
    assert [sig3(x) for x in (241.33, 42.61, 0.0024512, 0, 12345.6)] == [
        "241", "42.6", "0.00245", "0", "12,346"]
    assert [duration(x) for x in (1.2549, 0.1204, 2.45e-6, 0)] == [
        "1.25 s", "120 ms", "2.45 µs", "0 s"]


def test_stats_reprs_are_short_and_readable() -> None:
    e = ExpertStats(hits=1200, misses=80, ready_hits=1100, reads=100, bytes_read=1 << 30,
                    read_seconds=1.2549, stall_seconds=0.4, prefetch_issued=300,
                    prefetch_used=250, prefetch_wasted=50, predicted_routed=250,
                    routed_after_prediction=300, evictions=12)
    _check(e, "1200 of 1280 (93.8%", "1.0 GiB in 100 reads", "1.25 s", "816 MiB/s",
           "recall 83.3%", "evictions 12")
    _check(ExpertStats(), "no routed experts")
    _check(PhaseTimes(attention=0.1204, expert_wait=2.45e-6), "attention 120 ms",
           "expert wait 2.45 µs", "total 120 ms")
    m = MemoryStats(budget=12 << 30, dense_bytes=3_328_599_654, kv_bytes=768 << 20,
                    work_bytes=87_031_808, cache_bytes=8 << 30, cache_slots=655,
                    slot_bytes=13_107_200, cached_experts=600, pinned_experts=120,
                    total_experts=6144, expert_bytes=61_096_000_000)
    _check(m, "11.9 GiB of a 12.0 GiB budget: dense 3.1 GiB + KV 768 MiB + work 83.0 MiB + "
              "expert cache 8.0 GiB", "655 slots of 12.5 MiB", "120 pinned", "56.9 GiB on disk")
    # A small dense model under the default budget (issue 38, item 3): what it takes and
    # the budget, told apart.
    small = MemoryStats(budget=int(19.9 * (1 << 30)), dense_bytes=96_570_000,
                        kv_bytes=90 << 20, work_bytes=18_980_000, cache_bytes=0, cache_slots=0,
                        slot_bytes=0, cached_experts=0, pinned_experts=0, total_experts=0,
                        expert_bytes=0)
    _check(small, "200 MiB of a 19.9 GiB budget: dense 92.1 MiB + KV 90.0 MiB + work "
                  "18.1 MiB + expert cache 0 B")
    first = ExpertStats(hits=10, misses=6, first_candidates=8,
                        first_candidates_used=3)
    _check(first, "8 uncached experts guessed (37.5% routed to); 0 read: 0 used, 0 wasted")


def test_model_session_generation_reprs() -> None:
    model = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=128))
    r = _check(model, "SmolLM2-135M-Instruct.Q4_1.gguf", "llama (dense)", "30 layers",
               "context 128 tokens", "dense 92.1 MiB")
    assert "object at 0x" not in r
    g = model.generate("The capital of France is", max_tokens=4)
    _check(g.stats, "prompt 5 tokens", "tok/s", "generated 4 tokens")
    _check(g, "finish length", "4 generated after 5 prompt")
    _check(model.stats(), "generations 1", "prompt 5 tokens")
    s = model.session()
    s.forward([1, 2, 3])
    assert repr(s) == "Session(3 of 128 tokens, model 'SmolLM2-135M-Instruct.Q4_1.gguf')"
    model.close()
    assert repr(model) == "Model(name 'SmolLM2-135M-Instruct.Q4_1.gguf', closed)"


@pytest.mark.parametrize("obj", [
    co.Sampling(temperature=0.7, top_p=0.9, seed=1, logit_bias={3: -1.0}),
    co.EngineConfig(ram_budget="1536MiB", threads={"n": 2}, cache={"policy": "lru"}),
    co.IOConfig(workers=8, checksums="always"),
])
def test_settings_reprs_are_valid_python(obj: Any) -> None:
    r = repr(obj)
    assert len(r) < 120 and eval(r, vars(co)) == obj
