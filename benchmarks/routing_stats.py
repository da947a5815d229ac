"""Routing statistics of a model, measured from its own router on real text: how local is
the routing a streaming benchmark feeds the expert cache?

From ``Session.last_routing()`` (the experts each token chose, per layer: a prefill routes
exactly as token-by-token decoding does, the engine being batch-invariant) over the
benchmark's passages (bench_streaming.PASSAGES, tokenized by the model's own tokenizer):

* distinct experts per layer per window of 32 tokens (uniform top-k of E: E(1-(1-k/E)^32));
* hit rate of a per-layer LRU holding 25 % and 50 % of a layer's experts, and of one LRU
  over all layers holding the benchmark's cache size in slots (``--cache-slots``);
* previous-token reuse: the share of a token's experts the previous token also chose;
* popularity: the most used expert's share of a layer's choices over the uniform share;
* next-layer recall: the lookahead's recall (the next layer's router applied to this
  layer's hidden state), from the engine's own counters on a streamed run (``--recall``);
* with ``--cache-slots``, what a read issued during a token's LM head could fetch for the
  next token's first MoE layer by predictors known then (``gap_predictors``: the previous
  token's experts, the last 4 tokens', the most popular): accuracy and coverage of the
  misses.

    PYTHONPATH=python:build/dev/streaming .venv/bin/python benchmarks/routing_stats.py \\
        build/bench-data/synthetic-moe-8g-realistic-v2-s0.Q4_0.gguf --cache-slots 478
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Routing = npt.NDArray[np.int32]  # [tokens, layers, top_k], -1 for dense layers
WINDOW = 32


def moe_layers(routing: Routing) -> list[int]:
    return [i for i in range(routing.shape[1]) if routing.shape[0] and routing[0, i, 0] >= 0]


def distinct_per_window(routing: Routing, layer: int, window: int = WINDOW) -> float:
    """Mean distinct experts a layer uses per window of ``window`` consecutive tokens."""
    r = routing[:, layer, :]
    counts = [len(np.unique(r[s:s + window])) for s in range(0, len(r) - window + 1, window)]
    return float(np.mean(counts)) if counts else float("nan")


def uniform_distinct(n_experts: int, top_k: int, window: int = WINDOW) -> float:
    """Expected distinct experts per window when every token picks k experts uniformly."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** window)


def lru_hits(keys: list[int], capacity: int) -> float:
    """Hit rate of an LRU of ``capacity`` entries over the access sequence ``keys``."""
    lru: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for k in keys:
        if k in lru:
            hits += 1
            lru.move_to_end(k)
        else:
            lru[k] = None
            if len(lru) > capacity:
                lru.popitem(last=False)
    return hits / len(keys) if keys else float("nan")


def layer_lru(routing: Routing, layer: int, capacity: int) -> float:
    return lru_hits([int(e) for e in routing[:, layer, :].reshape(-1)], capacity)


def global_lru(routing: Routing, n_experts: int, capacity: int) -> float:
    """One LRU over every layer's experts (keys layer * E + expert), accessed in the order
    a forward pass needs them: token by token, layer by layer."""
    layers = moe_layers(routing)
    keys = [layer * n_experts + int(e) for t in range(routing.shape[0]) for layer in layers
            for e in routing[t, layer]]  # fmt: skip
    return lru_hits(keys, capacity)


def previous_token_reuse(routing: Routing, layer: int) -> float:
    r = routing[:, layer, :]
    k = r.shape[1]
    shared = [len(set(r[t].tolist()) & set(r[t - 1].tolist())) / k for t in range(1, len(r))]
    return float(np.mean(shared)) if shared else float("nan")


def popularity_skew(routing: Routing, layer: int, n_experts: int) -> float:
    """The most chosen expert's count over the uniform count (1 = perfectly even)."""
    counts = np.bincount(routing[:, layer, :].reshape(-1), minlength=n_experts)
    return float(counts.max() / (counts.sum() / n_experts))


def gap_predictors(routing: Routing, n_experts: int, capacity: int, reads: int = 4
                   ) -> dict[str, dict[str, float]]:  # fmt: skip
    """What a read issued during token t's LM head (before token t+1 exists) could fetch
    for token t+1's first MoE layer. Simulates one LRU of ``capacity`` slots over all
    layers (as global_lru); at each token boundary, the first MoE layer's experts of the
    next token that miss it are the *misses*, and each predictor names candidates that are
    not cached (a cached one needs no read):

    * ``previous``: the experts this token chose in that layer (routing repeats a little);
    * ``previous4``: those of the last 4 tokens;
    * ``popular``: the ``reads`` most chosen experts of that layer so far.

    Per predictor: candidates per token, accuracy (candidates the next token chose, over
    candidates) and coverage (misses it names, over misses); ``misses`` per token too."""
    layers = moe_layers(routing)
    first = layers[0]
    lru: OrderedDict[int, None] = OrderedDict()
    counts = np.zeros(n_experts, dtype=np.int64)
    names = ("previous", "previous4", "popular")
    cand = dict.fromkeys(names, 0)
    used = dict.fromkeys(names, 0)
    covered = dict.fromkeys(names, 0)
    misses = boundaries = 0

    def touch(key: int) -> None:
        if key in lru:
            lru.move_to_end(key)
        else:
            lru[key] = None
            if len(lru) > capacity:
                lru.popitem(last=False)

    for t in range(routing.shape[0]):
        if t > 0:  # the boundary between token t-1 and token t: t-1's LM head runs now
            nxt = {int(e) for e in routing[t, first]}
            miss = {e for e in nxt if first * n_experts + e not in lru}
            pop = [int(e) for e in np.argsort(-counts, kind="stable")
                   if first * n_experts + int(e) not in lru][:reads]
            preds = {
                "previous": {int(e) for e in routing[t - 1, first]},
                "previous4": {int(e) for u in range(max(0, t - 4), t) for e in routing[u, first]},
                "popular": set(pop),
            }
            for name, pred in preds.items():
                c = {e for e in pred if first * n_experts + e not in lru}
                cand[name] += len(c)
                used[name] += len(c & nxt)
                covered[name] += len(c & miss)
            misses += len(miss)
            boundaries += 1
        for layer in layers:
            for e in routing[t, layer]:
                touch(layer * n_experts + int(e))
        counts += np.bincount(routing[t, first], minlength=n_experts)
    out: dict[str, dict[str, float]] = {"misses": {
        "per_token": misses / max(boundaries, 1)}}
    for name in names:
        out[name] = {"candidates_per_token": cand[name] / max(boundaries, 1),
                     "accuracy": used[name] / cand[name] if cand[name] else float("nan"),
                     "coverage": covered[name] / misses if misses else float("nan")}
    return out


def _mean_or_nan(xs: list[float]) -> float:
    """The mean of the figures that are not NaN; NaN when none is (no candidates at all)."""
    vals = [x for x in xs if not np.isnan(x)]
    return float(np.mean(vals)) if vals else float("nan")


def summarize(runs: list[Routing], n_experts: int, cache_slots: int | None = None
              ) -> dict[str, Any]:  # fmt: skip
    """Per-layer statistics averaged over passages (each passage's routing separately),
    then over layers: mean, min and max across layers."""
    top_k = runs[0].shape[2]
    layers = moe_layers(runs[0])
    per: dict[str, list[float]] = {"distinct32": [], "lru25": [], "lru50": [], "reuse": [],
                                   "skew": []}  # fmt: skip
    for layer in layers:
        per["distinct32"].append(float(np.mean([distinct_per_window(r, layer) for r in runs])))
        per["lru25"].append(float(np.mean([layer_lru(r, layer, n_experts // 4) for r in runs])))
        per["lru50"].append(float(np.mean([layer_lru(r, layer, n_experts // 2) for r in runs])))
        per["reuse"].append(float(np.mean([previous_token_reuse(r, layer) for r in runs])))
        cat = np.concatenate(runs)
        per["skew"].append(popularity_skew(cat, layer, n_experts))
    out: dict[str, Any] = {
        "n_experts": n_experts, "top_k": top_k, "moe_layers": len(layers),
        "tokens": [int(r.shape[0]) for r in runs],
        "uniform_distinct32": uniform_distinct(n_experts, top_k),
    }  # fmt: skip
    for key, vals in per.items():
        out[key] = {"mean": float(np.mean(vals)), "min": float(np.min(vals)),
                    "max": float(np.max(vals)),
                    "per_layer": [round(v, 4) for v in vals]}  # fmt: skip
    if cache_slots:
        out["global_lru"] = {"slots": cache_slots, "hit_rate": float(np.mean(
            [global_lru(r, n_experts, cache_slots) for r in runs]))}  # fmt: skip
        gaps = [gap_predictors(r, n_experts, cache_slots) for r in runs]
        out["lm_head_predictors"] = {
            name: {k: _mean_or_nan([g[name][k] for g in gaps]) for k in gaps[0][name]}
            for name in gaps[0]}  # fmt: skip
    return out


def measure(path: Path, n_tokens: int = 96, cache_slots: int | None = None,
            recall: bool = False) -> dict[str, Any]:  # fmt: skip
    """Route the benchmark passages through the model at ``path`` and summarize."""
    import colibri
    from bench_streaming import PASSAGES
    from colibri.sources import open_model_source

    n_experts = int(open_model_source(path).config.n_experts)
    model = colibri.Model.load(path, _quarter_budget(path))  # routing ignores the budget
    runs = []
    for text in PASSAGES:
        ids = model.tokenizer.encode(text)[:n_tokens]
        s = model.session()
        s.forward(ids)
        runs.append(s.last_routing())
    model.close()
    out = summarize(runs, n_experts, cache_slots)
    if recall:
        out["next_layer_recall"] = streamed_recall(path, runs[0].shape[0], PASSAGES[0])
    return out


def _quarter_budget(path: Path, prefetch: bool = False) -> Any:
    """An engine config whose expert cache holds a quarter of the model's experts."""
    import colibri
    from colibri.sources import open_model_source

    m = open_model_source(path)
    experts = sum(t.nbytes for t in m.tensors.values() if "_exps" in t.name)
    dense = sum(t.nbytes for t in m.tensors.values()) - experts
    return colibri.EngineConfig(context_length=512, ram_budget=dense + experts // 4 + (320 << 20),
                                io=colibri.IOConfig(prefetch=prefetch))  # fmt: skip


def streamed_recall(path: Path, n_tokens: int, text: str) -> float:
    """The lookahead's recall from the engine's counters, on a run streamed with a small
    expert cache (the prediction only runs when experts stream)."""
    import colibri

    model = colibri.Model.load(path, _quarter_budget(path, prefetch=True))
    s = model.session()
    ids = model.tokenizer.encode(text)[:n_tokens]
    s.forward(ids[:4])
    for t in ids[4:]:
        s.forward([t])
    recall = float(model.stats().experts.prefetch_recall)
    model.close()
    return recall


def table(name: str, st: dict[str, Any]) -> str:
    def f(key: str, pct: bool = True) -> str:
        d = st[key]
        k = 100 if pct else 1
        return f"{d['mean'] * k:.0f} ({d['min'] * k:.0f}-{d['max'] * k:.0f})"

    row = (f"{name:<12} distinct/32 {f('distinct32', False)} of {st['n_experts']} "
           f"(uniform {st['uniform_distinct32']:.0f}); LRU 25% {f('lru25')}%, 50% "
           f"{f('lru50')}%; prev-token reuse {f('reuse')}%; top expert "
           f"{st['skew']['mean']:.1f}x uniform")  # fmt: skip
    if "global_lru" in st:
        g = st["global_lru"]
        row += f"; global LRU {g['slots']} slots {100 * g['hit_rate']:.0f}%"
    if "lm_head_predictors" in st:
        lp = st["lm_head_predictors"]
        row += (f"; next token's first-layer misses {lp['misses']['per_token']:.2f}/token, "
                "read during the LM head by " + ", ".join(
                    f"{n}: {lp[n]['candidates_per_token']:.2f} candidates/token, accuracy "
                    f"{100 * lp[n]['accuracy']:.0f}%, coverage {100 * lp[n]['coverage']:.0f}%"
                    for n in ("previous", "previous4", "popular")))
    if "next_layer_recall" in st:
        row += f"; next-layer recall {100 * st['next_layer_recall']:.0f}%"
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("models", nargs="+", type=Path, help="GGUF files or native containers")
    ap.add_argument("--tokens", type=int, default=96, help="tokens of each passage")
    ap.add_argument("--cache-slots", type=int, help="also an LRU over all layers this size")
    ap.add_argument("--recall", action="store_true", help="next-layer recall (streamed run)")
    ap.add_argument("--json", type=Path, help="write the statistics here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    doc = {}
    for p in args.models:
        st = measure(p, args.tokens, args.cache_slots, args.recall)
        doc[str(p)] = st
        print(table(p.name, st), flush=True)
    if args.json:
        args.json.write_text(json.dumps(doc, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
