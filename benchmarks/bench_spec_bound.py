"""How fast prompt-lookup drafting could make SmolLM2-135M-Instruct on bench_spec.py's
tasks at most: a hindsight bound, from the model's greedy output and measured verify costs.

For each position of the greedy output the lookup's proposal (up to `--max-draft` tokens,
`ngram_sizes` (3, 2, 1)) is scored against the tokens greedy then produced: `a_i` drafts
would be accepted. A policy that knew every `a_i` in advance would, at each step, either
forward one token (cost 1) or verify exactly `a_i` drafts (cost `c_{a_i}`, the measured
all-logits forward of `a_i + 1` tokens over a one-token forward, from a
bench_verify_cost.py JSON) and advance `a_i + 1` tokens; a dynamic program over the
positions gives its least total cost. No causal policy (lookup, auto) can beat it with
these drafts at these costs. No timing is done here (the costs come from the JSON).

    python benchmarks/bench_spec_bound.py --costs benchmarks/results/verify-cost-....json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import colibri
from _common import write_result
from bench_smollm2 import smollm2_path
from bench_spec import TASKS
from colibri.speculative.drafters import PromptLookupDrafter


def accepted_per_position(prompt: list[int], gen: list[int], max_draft: int) -> list[int]:
    """a_i: how many of the lookup's drafts after gen[:i + 1] greedy would accept."""
    drafter = PromptLookupDrafter((3, 2, 1))
    out = []
    for i in range(len(gen) - 1):
        prop = drafter.propose(prompt + gen[:i + 1], max_draft)
        a = 0
        while a < len(prop) and i + 1 + a < len(gen) and prop[a] == gen[i + 1 + a]:
            a += 1
        out.append(a)
    return out


def hindsight_cost(acc: list[int], cost: list[float]) -> float:
    """Least total cost (in one-token forwards) of producing len(acc) tokens."""
    n = len(acc)
    f = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        f[i] = 1.0 + f[i + 1]
        a = min(acc[i], n - i - 1)
        if a >= 1:
            f[i] = min(f[i], cost[a] + f[i + a + 1])
    return f[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--costs", required=True, help="a bench_verify_cost.py JSON")
    ap.add_argument("--max-tokens", type=int, nargs="+", default=[96, 256])
    ap.add_argument("--max-draft", type=int, default=8)
    args = ap.parse_args()
    summary = json.load(open(args.costs))["summary"]
    cost = [1.0] + [r["all_ratio"] for r in summary[1:]]
    if len(cost) <= args.max_draft:
        raise SystemExit(f"{args.costs} has costs up to {len(cost) - 1} drafts only")
    model = colibri.Model.load(smollm2_path(), engine=colibri.EngineConfig(threads={"n": 1}))
    rows: list[dict[str, Any]] = []
    for max_tokens in args.max_tokens:
        for name, text in TASKS.items():
            prompt = model.apply_chat_template(text, tokenize=True)
            gen = model.session().generate(prompt, max_tokens=max_tokens).token_ids
            acc = accepted_per_position(prompt, gen, args.max_draft)
            bound = (len(gen) - 1) / hindsight_cost(acc, cost) if len(gen) > 1 else 1.0
            long_share = sum(1 for a in acc if a >= 3) / max(1, len(acc))
            rows.append({"max_tokens": max_tokens, "task": name, "tokens": len(gen),
                         "bound": bound, "share_3plus": long_share, "accepted": acc})
            print(f"max_tokens {max_tokens:3d}  {name:14s} tokens {len(gen):3d}  "
                  f"hindsight bound {bound:.2f}x  positions with >= 3 drafts right "
                  f"{long_share:.2f}")
    path = write_result("spec-bound", {"costs_from": args.costs, "cost": cost,
                                       "max_draft": args.max_draft, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
