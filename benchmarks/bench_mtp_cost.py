"""The cost side of MTP speculative decoding on a streamed synthetic DeepSeek-V3-shaped MoE
(synthetic_deepseek.py's DeepSeek layout, scaled: hidden 1024, 8 layers, the first dense,
MLA, 128 experts of 512 top-8 in 4 of 8 groups + 1 shared expert, Q4_0), resident and
streamed through an expert cache at a 25% budget (O_DIRECT reads).

Random weights give no real acceptance, so this measures what a verify of k drafts costs
(k = 1..4: a forward of k + 1 tokens) relative to a one-token forward, in time and in
expert bytes read: each distinct routed expert is read once for all the positions (batch
union), but k + 1 tokens route to up to (k + 1) x top_k distinct experts. From the ratios,
the predicted speedup at a per-position acceptance a is E_k(a) / c_k with
E_k(a) = (1 - a^(k+1)) / (1 - a) tokens per verify and c_k the measured time ratio (the
MTP layer's own forward, one layer of 8 plus the head per depth, is not in c_k).

The decode is emulated as a real one with every draft rejected: each step forwards
[t, d1..dk] and rolls the drafts back (the session advances one token per step, the expert
cache sees the verifies' routing), with the modes interleaved step by step so load and
cache state hit all alike.

Then ``auto`` (the measured cost rule) with two drafters: an oracle that proposes the
tokens plain greedy decoding produces (acceptance 1) and a random one (acceptance ~0),
--auto-rounds rounds of (plain, oracle, random; the two drafters' order alternating
between rounds), the speedups per round against that round's plain run, medians; beside
them the best fixed draft length the measured curve predicts at that acceptance (what
auto should approach).

    PYTHONPATH=python:build/dev/<name> .venv/bin/python benchmarks/bench_mtp_cost.py
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import colibri
from _common import conditions, print_table, write_result
from colibri.generate.generation import stream_tokens
from colibri.speculative import SpecConfig, Speculator
from synthetic_deepseek import FAMILY_PRESETS, ensure_family_preset

PRESET = dataclasses.replace(
    FAMILY_PRESETS["ds3-small"], name="ds3-spec", n_layers=8, n_experts=128, top_k=8,
    n_group=8, topk_group=4, description="bench_mtp_cost: DeepSeek-V3 routing (128 experts "
    "top-8 in 4 of 8 groups) at hidden 1024, 7 MoE layers")
KS = (1, 2, 3, 4)


def load(path: Path, budget: int | None, threads: int) -> colibri.Model:
    # Resident: every expert read at load (preload), so no forward reads from the disk.
    return colibri.Model.load(path, engine=colibri.EngineConfig(
        ram_budget=budget, threads={"n": threads}, context_length=512,
        io={"direct": True}, cache={"preload": budget is None}))  # type: ignore[arg-type]


def verify_costs(m: colibri.Model, steps: int, seed: int) -> dict[int, dict[str, float]]:
    rng = random.Random(seed)
    vocab = m.config.vocab_size
    s = m.session()
    s.forward([rng.randrange(3, vocab) for _ in range(32)])
    t_by: dict[int, list[float]] = {k: [] for k in (0, *KS)}
    b_by: dict[int, list[float]] = {k: [] for k in (0, *KS)}
    order = [0, *KS]
    for step in range(steps):
        if step % len(order) == 0:
            rng.shuffle(order)
        k = order[step % len(order)]
        ids = [rng.randrange(3, vocab) for _ in range(k + 1)]
        e0 = s.forward_stats()[0].bytes_read
        t0 = time.perf_counter()
        s.forward(ids, all_logits=k > 0)
        dt = time.perf_counter() - t0
        b = s.forward_stats()[0].bytes_read - e0
        if k:
            s.rollback(k)
        if step >= len(order):  # the first round warms up
            t_by[k].append(dt)
            b_by[k].append(b)
    t1, b1 = statistics.median(t_by[0]), statistics.mean(b_by[0])
    return {k: {"seconds": statistics.median(t_by[k]), "time_ratio": statistics.median(
        t_by[k]) / t1, "bytes": statistics.mean(b_by[k]),
        "bytes_ratio": (statistics.mean(b_by[k]) / b1) if b1 else 0.0} for k in (0, *KS)}


class SequenceDrafter:
    """Proposes the continuation of a known token sequence (the oracle), or random ids."""

    def __init__(self, tokens: Sequence[int], vocab: int, oracle: bool, n_prompt: int) -> None:
        self.tokens, self.vocab, self.oracle, self.n_prompt = list(tokens), vocab, oracle, n_prompt
        self.rng = random.Random(7)

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        if not self.oracle:
            return [self.rng.randrange(3, self.vocab) for _ in range(k)]
        at = len(history) - self.n_prompt
        return self.tokens[at:at + k]


def auto_run(m: colibri.Model, prompt: list[int], n: int, plain: list[int] | None,
             oracle: bool) -> dict[str, object]:
    s = m.session()
    spec = None
    if plain is not None:
        spec = Speculator(SpecConfig(drafter="auto", max_draft=4),
                          SequenceDrafter(plain, m.config.vocab_size, oracle, len(prompt)))
    out: list[int] = []
    stats: dict[str, object] = {}

    def done(st: object, generated: list[int], finish: object) -> None:
        stats["stats"] = st

    t0 = time.perf_counter()
    for c in stream_tokens(s, m.tokenizer, prompt, max_tokens=n, sampling=colibri.Sampling(),
                           stop=(), on_done=done, speculator=spec):  # type: ignore[arg-type]
        if c.token_id is not None:
            out.append(c.token_id)
    wall = time.perf_counter() - t0
    st = stats["stats"]
    sp = st.spec  # type: ignore[attr-defined]
    return {"tokens": out, "decode_s": st.decode_seconds, "wall_s": wall,  # type: ignore[attr-defined]
            "spec": sp.to_dict() if sp is not None else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60, help="steps per residency (all modes)")
    ap.add_argument("--tokens", type=int, default=96, help="decode tokens of the auto runs")
    ap.add_argument("--auto-rounds", type=int, default=5,
                    help="rounds of (plain, oracle auto, random auto); medians of the ratios")
    args = ap.parse_args(argv)
    path = ensure_family_preset(PRESET)
    size = path.stat().st_size
    out: dict[str, object] = {"preset": dataclasses.asdict(PRESET), "file_bytes": size,
                              "conditions": conditions()}
    rows = []
    for label, budget in (("resident", None), ("streamed 25%", size // 4)):
        m = load(path, budget, args.threads)
        costs = verify_costs(m, args.steps, seed=1)
        out[label] = costs
        for k in KS:
            c = costs[k]
            rows.append([label, str(k), f"{1e3 * c['seconds']:.1f}", f"{c['time_ratio']:.2f}",
                         f"{c['bytes'] / 1e6:.1f}", f"{c['bytes_ratio']:.2f}"])
        rows.insert(len(rows) - len(KS), [label, "0", f"{1e3 * costs[0]['seconds']:.1f}", "1.00",
                                          f"{costs[0]['bytes'] / 1e6:.1f}", "1.00"])
        m.close()
    print_table(["model", "drafts k", "forward ms", "time / 1 token", "MB read",
                 "bytes / 1 token"], rows)

    alphas = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0)
    pred_rows = []
    for label in ("resident", "streamed 25%"):
        costs = out[label]  # type: ignore[assignment]
        for k in KS:
            c = costs[k]["time_ratio"]  # type: ignore[index]
            e = [(k + 1 if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)) for a in alphas]
            pred_rows.append([label, str(k)] + [f"{x / c:.2f}" for x in e])
    print()
    print_table(["model", "k", *[f"a={a}" for a in alphas]], pred_rows)
    out["predicted_speedup"] = {"alphas": alphas, "rows": pred_rows}

    auto_rows = []
    for label, budget in (("resident", None), ("streamed 25%", size // 4)):
        m = load(path, budget, args.threads)
        prompt = [random.Random(3).randrange(3, m.config.vocab_size) for _ in range(16)]
        auto_run(m, prompt, args.tokens, None, False)  # warm-up: caches, page cache, threads
        runs: dict[str, list[dict[str, object]]] = {"oracle": [], "random": []}
        ratios: dict[str, list[float]] = {"oracle": [], "random": []}
        bases = []
        plain: list[int] = []
        for rnd in range(args.auto_rounds):  # plain, then the drafters in alternating order
            base = auto_run(m, prompt, args.tokens, None, False)
            plain = base["tokens"]  # type: ignore[assignment]
            bases.append(base)
            pair = (("oracle", True), ("random", False))
            for name, oracle in (pair if rnd % 2 == 0 else pair[::-1]):
                r = auto_run(m, prompt, args.tokens, plain, oracle)
                assert r["tokens"] == plain, "drafting changed the tokens"
                runs[name].append(r)
                ratios[name].append(base["decode_s"] / r["decode_s"])  # type: ignore[operator]
        costs = out[label]  # type: ignore[assignment]
        for name, oracle in (("oracle", True), ("random", False)):
            # The best fixed draft length at this acceptance from the measured curve (what
            # auto should approach; k = 0: never draft, 1.00).
            a = 1.0 if oracle else 0.0
            best_k, best = 0, 1.0
            for k in KS:
                e = (k + 1.0) if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)
                if e / costs[k]["time_ratio"] > best:  # type: ignore[index]
                    best_k, best = k, e / costs[k]["time_ratio"]  # type: ignore[index]
            rs = ratios[name]
            order = sorted(range(len(rs)), key=rs.__getitem__)
            mid = runs[name][order[len(order) // 2]]  # the median round's counts
            sp = mid["spec"]
            auto_rows.append([label, name, f"{sp['acceptance']:.2f}", str(sp["verify_forwards"]),  # type: ignore[index]
                              str(sp["plain_forwards"]), str(sp["auto_off_steps"]),  # type: ignore[index]
                              f"{sp['tokens_per_forward']:.2f}", f"k={best_k}: {best:.2f}",  # type: ignore[index]
                              f"{statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"])
            out[f"auto {label} {name}"] = {"ratios": rs, "runs": [
                {k: v for k, v in r.items() if k != "tokens"} for r in runs[name]]}
        out[f"plain {label}"] = [{k: v for k, v in b.items() if k != "tokens"} for b in bases]
        m.close()
    print()
    print_table(["model", "drafter", "acceptance", "verifies", "plain fwd", "auto off steps",
                 "tokens/forward", "best fixed k predicted", "decode speedup (range)"], auto_rows)
    out["auto_table"] = auto_rows
    write_result("mtp-cost", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
