"""Offline replay of speculative decoding policies on SmolLM2-135M-Instruct's greedy
outputs for bench_spec.py's tasks, at given verify costs: no model run, no timing.

Greedy output does not depend on drafting, so a policy's speed on a task is a function of
the output and of what forwards cost. ``--record`` generates the outputs once (prompt and
greedy tokens per task, 256 tokens at most; a shorter ``max_tokens`` is a prefix) into a
JSON; a replay then runs colibri's own :class:`~colibri.speculative.verify.Speculator`
(its drafter, its ``auto`` rule: the code the decode loop runs) step by step against the
recorded tokens, feeding it the timings the cost curve says (a one-token forward 1 ms, a
verify of k drafts ``c_k`` ms; optionally lognormal noise), and scores

    expected decode tok/s ratio = decode tokens / sum of forward costs (in one-token forwards)

beside the hindsight bound of bench_spec_bound.py (a dynamic program that knows every
proposal's accepted length) and ``lookup`` (always draft). ``c_k`` comes from a
bench_verify_cost.py JSON (``all_ratio``), or ``--linear C0 RHO`` (``c_k = 1 + C0 + RHO
k``: e.g. a cheaper verify).

    python benchmarks/bench_spec_replay.py --record
    python benchmarks/bench_spec_replay.py --record --held-out  # other prompts (HELD_OUT)
    python benchmarks/bench_spec_replay.py --outputs benchmarks/results/spec-outputs-....json \
        --costs benchmarks/results/verify-cost-....json --baseline f7015d0
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from colibri.settings.spec import SpecConfig
from colibri.speculative.auto import CostMemory
from colibri.speculative.verify import Speculator

try:  # run as a script from benchmarks/ (the tests import the replay functions only)
    from _common import print_table, write_result
except ImportError:  # pragma: no cover
    print_table = write_result = None  # type: ignore[assignment]

PLAIN_S = 1e-3  # a one-token forward in the replay, seconds


def replay(prompt: Sequence[int], gen: Sequence[int], max_tokens: int,
           cost: Sequence[float], speculator: Speculator, noise: float = 0.0,
           seed: int = 0) -> dict[str, Any]:
    """Runs `speculator` through the decode of `gen` (greedy's tokens after `prompt`, cut
    to `max_tokens`) as generation.stream_tokens would: the first token comes from the
    prefill; each step drafts after the history, verifies (the drafts that equal greedy's
    next tokens are accepted, plus one token) or forwards one token. Returns decode
    tokens, their cost in one-token forwards (``cost[k]`` for a verify of k drafts; times
    lognormal noise of sigma `noise`, fed to the speculator as seconds) and the ratio."""
    gen = list(gen[:max_tokens])
    rng = random.Random(seed)
    hist = list(prompt) + gen[:1]
    n = len(gen)
    i, spent, verifies = 1, 0.0, 0  # i: tokens generated so far
    while i < n:
        room = max_tokens - i - 1
        drafts = speculator.draft(hist, room)
        speculator._step_draft_s = 0.0  # the drafter's own time is not part of the replay
        k = len(drafts)
        c = cost[k] if k else 1.0
        t = c * (math.exp(rng.gauss(0.0, noise)) if noise else 1.0)
        spent += c
        if k:
            verifies += 1
            speculator.on_verify(k, t * PLAIN_S)
            a = 0
            while a < k and i + a < n and drafts[a] == gen[i + a]:
                speculator.on_accept(a)
                a += 1
            step = min(a + 1, n - i)  # EOS or max_tokens inside the verify ends it
            speculator.on_verify_done()
        else:
            speculator.on_plain(t * PLAIN_S)
            step = 1
        hist.extend(gen[i:i + step])
        i += step
    tokens = n - 1
    return {"tokens": tokens, "cost": spent, "ratio": tokens / spent if spent else 1.0,
            "verifies": verifies, "stats": speculator.stats(tokens).to_dict()}


def accepted_per_position(prompt: Sequence[int], gen: Sequence[int], max_draft: int,
                          ngram_sizes: Sequence[int] = (3, 2, 1),
                          longest: bool = True) -> list[int]:
    """a_i: how many of the lookup's drafts after gen[:i + 1] greedy would accept."""
    from colibri.speculative.drafters import PromptLookupDrafter
    drafter = PromptLookupDrafter(ngram_sizes, longest=longest)
    out = []
    for i in range(len(gen) - 1):
        prop = drafter.propose(list(prompt) + list(gen[:i + 1]), max_draft)
        a = 0
        while a < len(prop) and i + 1 + a < len(gen) and prop[a] == gen[i + 1 + a]:
            a += 1
        out.append(a)
    return out


def hindsight_ratio(acc: Sequence[int], cost: Sequence[float]) -> float:
    """The clairvoyant policy's tokens per one-token forward (bench_spec_bound.py's DP)."""
    n = len(acc)
    f = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        f[i] = 1.0 + f[i + 1]
        a = min(acc[i], n - i - 1)
        if a >= 1:
            f[i] = min(f[i], cost[a] + f[i + a + 1])
    return n / f[0] if n else 1.0


def curve_from(costs_json: str | None, linear: Sequence[float] | None,
               max_draft: int) -> list[float]:
    if linear:
        c0, rho = linear
        return [1.0] + [1.0 + c0 + rho * k for k in range(1, max_draft + 1)]
    assert costs_json is not None
    summary = json.load(open(costs_json))["summary"]
    cost = [1.0] + [r["all_ratio"] for r in summary[1:]]
    if len(cost) <= max_draft:
        raise SystemExit(f"{costs_json} has costs up to {len(cost) - 1} drafts only")
    return cost


# Held-out prompts (not bench_spec.py's): copy-heavy edits of other texts and two more free
# chats, to check a rule chosen on the bench's five outputs on outputs it was not chosen on.
HELD_OUT: dict[str, str] = {
    "add docstring": "Add a one-line docstring to each function and return the whole code, "
                     "unchanged otherwise:\n\ndef area(w, h):\n    return w * h\n\n\n"
                     "def perimeter(w, h):\n    return 2 * (w + h)\n\n\ndef is_square(w, h):"
                     "\n    return w == h\n",
    "fix grammar": "Correct the grammar in this email and return it in full:\n\nHi Tom, I "
                   "has send you the report yesterday but I did not received any answer. "
                   "Can you tells me if you have saw it? We needs your comments before "
                   "friday, because the client are waiting. Thanks, Maria",
    "rename variable": "Rename the variable n to count everywhere in this code and return "
                       "all of it:\n\nn = 0\nfor line in open(\"data.txt\"):\n    if "
                       "line.strip():\n        n += 1\nprint(\"lines:\", n)\nif n > 100:\n"
                       "    print(\"long file\")\n",
    "quote lines": "Which sentences of this text mention the weather? Quote them exactly."
                   "\n\nThe train left at nine. It was raining hard when we reached the "
                   "coast. We ate lunch in a small cafe near the harbour. By the afternoon "
                   "the sky had cleared and the sun was warm. In the evening we took the "
                   "last train home.",
    "json edit": "Change the port to 8081 in this JSON and return the whole JSON:\n\n"
                 '{\n  "name": "web",\n  "host": "0.0.0.0",\n  "port": 8080,\n  '
                 '"workers": 4,\n  "debug": false,\n  "log_level": "info"\n}',
    "sort list": "Sort this shopping list alphabetically, one item per line:\n\nmilk\n"
                 "bread\napples\ncheese\neggs\nbutter\ntomatoes\nrice",
    "chat recipe": "Give me a simple recipe for pancakes.",
    "chat advice": "What are some good ways to stay focused while studying?",
}

POLICIES: dict[str, Callable[[int, CostMemory | None], Speculator]] = {
    "lookup": lambda m, mem: Speculator(SpecConfig(drafter="lookup", max_draft=m)),
    "auto": lambda m, mem: Speculator(SpecConfig(drafter="auto", max_draft=m), memory=mem),
}

# The live bench's warm-up (bench_spec.WARMUP): held-out's "rename variable", 64 tokens.
WARMUP_TASK, WARMUP_TOKENS = "rename variable", 64


def warmed_memory(warm: Sequence[tuple[Sequence[int], Sequence[int], int]],
                  cost: Sequence[float], max_draft: int) -> CostMemory:
    """A fresh CostMemory after ``auto`` generations of each (prompt, gen, max_tokens) in
    `warm` (as a model's earlier generations would leave it)."""
    memory = CostMemory()
    for prompt, gen, max_tokens in warm:
        s = POLICIES["auto"](max_draft, memory)
        replay(prompt, gen, max_tokens, cost, s)
        s.finish()
    return memory


def baseline_policy(rev: str) -> Callable[[int], Any]:
    """``auto`` as of git revision `rev` (its colibri/speculative package, imported from a
    temporary copy; the rest of colibri is this checkout's), for a before/after replay."""
    import importlib
    import re
    import subprocess
    import sys
    import tempfile
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:python/colibri/speculative"],
                           cwd=root, capture_output=True, text=True, check=True).stdout.split()
    pkg = "spec_" + re.sub(r"\W", "_", rev)
    where = Path(tempfile.mkdtemp()) / pkg
    where.mkdir()
    for f in files:
        if f.endswith(".py"):
            text = subprocess.run(["git", "show", f"{rev}:python/colibri/speculative/{f}"],
                                  cwd=root, capture_output=True, text=True, check=True).stdout
            text = re.sub(r"from \.\.(\w*) import",
                          lambda m: f"from colibri{'.' + m.group(1) if m.group(1) else ''} import",
                          text)
            (where / f).write_text(text)
    sys.path.insert(0, str(where.parent))
    verify, config = (importlib.import_module(f"{pkg}.{m}") for m in ("verify", "config"))
    return lambda m, mem: verify.Speculator(config.SpecConfig(drafter="auto", max_draft=m))


def record(max_tokens: int, held_out: bool) -> None:
    import colibri
    from bench_smollm2 import smollm2_path
    from bench_spec import TASKS
    model = colibri.Model.load(smollm2_path(), engine=colibri.EngineConfig(threads={"n": 2}))
    tasks = {}
    for name, text in (HELD_OUT if held_out else TASKS).items():
        prompt = model.apply_chat_template(text, tokenize=True)
        gen = model.session().generate(prompt, max_tokens=max_tokens).token_ids
        tasks[name] = {"prompt": list(prompt), "gen": list(gen)}
        print(f"{name:14s} prompt {len(prompt):4d} tokens, output {len(gen):4d}")
    path = write_result("spec-outputs", {"max_tokens": max_tokens, "held_out": held_out,
                                         "tasks": tasks})
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", action="store_true", help="generate the outputs JSON")
    ap.add_argument("--held-out", action="store_true",
                    help="with --record: the held-out prompts (HELD_OUT), not bench_spec's")
    ap.add_argument("--outputs", nargs="+", help="spec-outputs JSONs (--record)")
    ap.add_argument("--baseline", metavar="REV",
                    help="also replay auto as of this git revision (e.g. the last merge)")
    ap.add_argument("--costs", help="a bench_verify_cost.py JSON")
    ap.add_argument("--linear", type=float, nargs=2, metavar=("C0", "RHO"))
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[96, 256])
    ap.add_argument("--max-draft", type=int, default=8)
    ap.add_argument("--noise", type=float, default=0.0, help="lognormal sigma of timings")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--warm", action="store_true",
                    help=f"before each task, auto on {WARMUP_TASK!r} ({WARMUP_TOKENS} tokens; "
                         "from the --outputs, never a scored task) into a fresh CostMemory, "
                         "as bench_spec.py's warm-up")
    args = ap.parse_args()
    if args.record:
        record(max(args.max_tokens), args.held_out)
        return
    if not args.outputs or not (args.costs or args.linear):
        raise SystemExit("give --outputs and --costs (or --linear), or --record")
    cost = curve_from(args.costs, args.linear, args.max_draft)
    policies = dict(POLICIES)
    if args.baseline:
        policies[f"auto@{args.baseline}"] = baseline_policy(args.baseline)
    tasks = {}
    for path in args.outputs:
        tasks.update(json.load(open(path))["tasks"])
    warm = []
    if args.warm:
        if WARMUP_TASK not in tasks:
            raise SystemExit(f"--warm: {WARMUP_TASK!r} is in none of the --outputs "
                             "(record --held-out)")
        w = tasks.pop(WARMUP_TASK)  # not scored
        warm = [(w["prompt"], w["gen"][:WARMUP_TOKENS], WARMUP_TOKENS)]
    rows, out = [], []
    for max_tokens in args.max_tokens:
        for name, t in tasks.items():
            prompt, gen = t["prompt"], t["gen"][:max_tokens]
            acc = accepted_per_position(prompt, gen, args.max_draft)
            entry: dict[str, Any] = {"max_tokens": max_tokens, "task": name,
                                     "tokens": len(gen),
                                     "bound": hindsight_ratio(acc, cost)}
            for pol, make in policies.items():
                ratios = [replay(prompt, gen, max_tokens, cost, make(
                    args.max_draft, warmed_memory(warm, cost, args.max_draft) if warm else None),
                    args.noise, seed)["ratio"] for seed in range(args.seeds)]
                entry[pol] = sorted(ratios)[len(ratios) // 2]
            out.append(entry)
            rows.append([max_tokens, name, len(gen)]
                        + [entry[p] for p in policies] + [entry["bound"],
                                                          entry["auto"] / entry["bound"]])
    table = print_table(["max tokens", "task", "tokens"] + [f"{p} x" for p in policies]
                        + ["bound x", "auto / bound"], rows)
    path = write_result("spec-replay", {"outputs": args.outputs, "costs_from": args.costs,
                                        "linear": args.linear, "cost": cost,
                                        "baseline": args.baseline, "noise": args.noise,
                                        "seeds": args.seeds, "warm": args.warm, "rows": out,
                                        "table": table})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
