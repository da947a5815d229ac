"""Helpers of the streaming-tier tests (test_streaming*.py): engine settings, a RAM budget
that holds exactly N routed experts, and a fixed prefill + decode trace to compare runs.

Every helper turns the routing history off unless a test asks for one (a history under
``~/.cache/colibri/routing`` would otherwise be read and written by the tests).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import colibri as co
from colibri.settings.config import CacheConfig, CachePolicy, Checksums, IOConfig, WaitPolicy

PREFILL = 20  # prompt tokens of a trace
DECODE = 8  # decode steps of a trace


def engine(
    *,
    budget: int | str | None = None,
    workers: int = 4,
    direct: bool = True,
    prefetch: bool = True,
    policy: str = "lru",
    checksums: Checksums = "first",
    threads: int = 1,
    wait_policy: str = "auto",
    history_path: Path | None = None,
    preload: bool = False,
    precision: str = "float32",
    context_length: int | None = None,
) -> co.EngineConfig:
    """An EngineConfig; the routing history is used only when `history_path` is given."""
    return co.EngineConfig(
        activation_precision=precision,
        threads=co.ThreadConfig(n=threads, wait_policy=WaitPolicy(wait_policy)),
        ram_budget=budget,
        context_length=context_length,
        io=IOConfig(workers=workers, direct=direct, prefetch=prefetch, checksums=checksums),
        cache=CacheConfig(policy=CachePolicy(policy), history=history_path is not None,
                          history_path=history_path, preload=preload),
    )  # fmt: skip


def budget_for_slots(path: Path, n_slots: int, *, threads: int = 1,
                     context_length: int | None = None, precision: str = "float32") -> int:
    """A ram_budget whose expert cache holds exactly `n_slots` experts: the resident part
    (dense weights + KV cache, the MTP layer's included + work buffers, which depend on the
    team size, the context and, through the "auto" KV type, the activation precision) of a
    first load, plus `n_slots` slots."""
    m = co.Model.load(path, engine=engine(threads=threads, context_length=context_length,
                                          precision=precision))
    mem = m.stats().memory
    assert mem is not None and mem.slot_bytes > 0, "not a model with routed experts"
    m.close()
    return mem.dense_bytes + mem.session_kv_bytes + mem.work_bytes + n_slots * mem.slot_bytes


def prompt(n: int = PREFILL, seed: int = 7, vocab: int = 256) -> list[int]:
    """Pseudo-random ids in 3..vocab-1 (no specials)."""
    return [int(x) for x in np.random.default_rng(seed).integers(3, vocab, size=n)]


@dataclass(frozen=True)
class Trace:
    """One run: all prefill logits ``[PREFILL, vocab]`` and each decode step's logits."""

    prefill: np.ndarray
    decode: list[np.ndarray]
    decode_ids: list[int]  # the tokens fed in the decode steps (greedy on the reference)


def run_trace(model: co.Model, ids: list[int], decode_ids: list[int] | None = None,
              n_decode: int = DECODE) -> Trace:
    """Prefill `ids`, then decode: `decode_ids` if given, else greedy from this run."""
    s = model.session()
    prefill = s.forward(ids, all_logits=True).copy()
    logits = prefill[-1]
    fed: list[int] = []
    steps: list[np.ndarray] = []
    for i in range(len(decode_ids) if decode_ids is not None else n_decode):
        tok = decode_ids[i] if decode_ids is not None else int(np.argmax(logits))
        logits = s.forward([tok]).copy()
        fed.append(tok)
        steps.append(logits)
    assert s.n_tokens == len(ids) + len(fed)
    return Trace(prefill, steps, fed)


def assert_same_trace(got: Trace, want: Trace, what: object = "") -> None:
    """Bit-identical logits at every position and step."""
    assert got.decode_ids == want.decode_ids, what
    assert np.array_equal(got.prefill, want.prefill), (what, "prefill", _diff(got.prefill,
                                                                             want.prefill))
    for i, (a, b) in enumerate(zip(got.decode, want.decode, strict=True)):
        assert np.array_equal(a, b), (what, f"decode step {i}", _diff(a, b))


def _diff(a: np.ndarray, b: np.ndarray) -> str:
    return f"max |diff| {float(np.abs(a - b).max()):.3g}"


def write_history(path: Path, model: co.Model, counts: np.ndarray) -> None:
    """A routing-history file (the format colibri.engine.streaming.RoutingHistory reads)."""
    c = model.config
    doc = {"format": "colibri-routing-history", "version": 1, "n_layers": c.n_layers,
           "n_experts": c.n_experts, "counts": [int(x) for x in counts.reshape(-1)]}
    path.write_text(json.dumps(doc))


def route_counts(routing: np.ndarray, n_layers: int, n_experts: int) -> np.ndarray:
    """[n_layers * n_experts] counts of a ``Session.last_routing()`` array (-1 skipped)."""
    counts = np.zeros(n_layers * n_experts, dtype=np.uint64)
    for layer in range(n_layers):
        sel = routing[:, layer, :].reshape(-1)
        for e in sel[sel >= 0]:
            counts[layer * n_experts + int(e)] += 1
    return counts


def distinct_routed(routing: np.ndarray) -> int:
    """Distinct (layer, expert) pairs in a ``Session.last_routing()`` array."""
    n_layers = routing.shape[1]
    return sum(len(set(routing[:, layer, :].reshape(-1).tolist()) - {-1})
               for layer in range(n_layers))
