"""Speculative decoding on SmolLM2-135M-Instruct Q4_1, resident: decode tok/s with prompt
lookup drafts ("lookup", "auto") against plain decoding ("off"), greedy, on tasks that copy
from the prompt (edit code, fix typos, summarise with quotes, edit a 26-line and a 45-line
file) and on free chat.

Every round runs each mode once per task on a fresh session, the order of the modes
rotating every round so machine noise hits all alike; ratios are per round, against "off"
in the same round, and their median is reported (for auto with its quartiles, and the
median of the same ratio over the decode's wall time: the forwards plus the loop's own work
between them, sampling and drafting included). The generated tokens are checked to be
the same in every mode (drafting never changes them). Each "auto" run starts from a reset
cost memory warmed on WARMUP (untimed), never on its own task. JSON goes to
benchmarks/results/ with every run's figures and the load average before each round.

    python benchmarks/bench_spec.py --threads 2 --repeats 3 --max-tokens 96
    python benchmarks/bench_spec.py --threads 2 --repeats 9 --max-tokens 256  # copies finish
    python benchmarks/bench_spec.py --threads 2 --repeats 9 --max-tokens 512  # the long file too
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import colibri
from _common import conditions, median, print_table, write_result
from bench_smollm2 import smollm2_path

CODE = '''def total_price(items, tax):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    return subtotal * (1 + tax)


def cheapest(items):
    best = None
    for item in items:
        if best is None or item.price < best.price:
            best = item
    return best
'''

# A file of realistic size for an edit that should copy nearly all of it (added in session
# 25; the tasks above are the earlier runs' and unchanged).
MODULE = '''import json


class Inventory:
    def __init__(self, path):
        self.path = path
        self.items = {}

    def load(self):
        with open(self.path) as f:
            self.items = json.load(f)

    def save(self):
        with open(self.path, "w") as f:
            json.dump(self.items, f, indent=2)

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count

    def total(self):
        return sum(self.items.values())
'''

# A longer file (45 lines; session 28): the copy tasks above leave 140-480 tokens in the
# context, and a verify's rows attend over all of them, so a real file's edit is the
# sweep's long end.
LONG_MODULE = '''import csv
from dataclasses import dataclass


@dataclass
class Order:
    customer: str
    product: str
    quantity: int
    price: float


def read_orders(path):
    orders = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            orders.append(Order(row["customer"], row["product"],
                                int(row["quantity"]), float(row["price"])))
    return orders


def revenue(orders):
    return sum(o.quantity * o.price for o in orders)


def by_customer(orders):
    totals = {}
    for o in orders:
        totals[o.customer] = totals.get(o.customer, 0.0) + o.quantity * o.price
    return totals


def top_customers(orders, n=3):
    totals = by_customer(orders)
    return sorted(totals, key=totals.get, reverse=True)[:n]


def write_report(orders, path):
    with open(path, "w") as f:
        f.write("total: %.2f\\n" % revenue(orders))
        for name in top_customers(orders):
            f.write(name + "\\n")
'''

TYPOS = ("Teh river rises in teh hills to the north and runs for two hundred miles thrugh "
         "farms, forrests and three small towns before it reachs the sea. In spring the snow "
         "melts and the water comes down fast and brown; by late sumer it is slow and clear "
         "enough to see the stones on the botom.")

ARTICLE = ('The mayor said on Tuesday that "the new bridge will open in March, two months '
           'ahead of schedule". Engineers had warned that "the old crossing cannot carry '
           'another winter of heavy trucks". A resident, Ana Lopez, said: "We have waited '
           'ten years for this, and we will believe it when we drive across it."')

TASKS: dict[str, str] = {
    "edit code": "Rename the function total_price to compute_total and return the whole "
                 "code, unchanged otherwise:\n\n" + CODE,
    "fix typos": "Fix the spelling mistakes in this paragraph and return it in full:\n\n"
                 + TYPOS,
    "quote summary": "Summarise this article, quoting each statement exactly:\n\n" + ARTICLE,
    "edit file": "Rename the method total to count_all in this file and return the whole "
                 "file, unchanged otherwise.\n\n```python\n" + MODULE + "```",
    "edit long file": "Rename the function revenue to total_revenue in this file and return "
                      "the whole file, unchanged otherwise.\n\n```python\n" + LONG_MODULE + "```",
    # (session 27: the lighthouse story this task used loops under the AVX-512 row-lane
    # kernels, lookup accepting 0.43 of its drafts; this prompt does not, 0.04)
    "free chat": "What are some good ways to stay focused while studying?",
}
MODES = ("off", "lookup", "auto")

# "auto" keeps the verify cost it measured on the model for later generations (CostMemory).
# So that no run starts from a cost measured on its own task in an earlier round, each auto
# run first resets the model's memory and warms it on this prompt (the replay's held-out
# "rename variable", 64 tokens, untimed): a server that has answered something else.
WARMUP = ("Rename the variable n to count everywhere in this code and return all of it:\n\n"
          "n = 0\nfor line in open(\"data.txt\"):\n    if line.strip():\n        n += 1\n"
          "print(\"lines:\", n)\nif n > 100:\n    print(\"long file\")\n")
WARMUP_TOKENS = 64


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """The first quartile, the median and the third of `xs` (inclusive method: with one
    value, that value three times)."""
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def run(model: colibri.Model, ids: list[int], mode: str, max_tokens: int,
        max_draft: int) -> dict[str, Any]:
    spec = colibri.SpecConfig(drafter=mode, max_draft=max_draft)  # type: ignore[arg-type]
    if mode == "auto":
        model.reset_spec_memory()
        model.session().generate(model.apply_chat_template(WARMUP, tokenize=True),
                                 max_tokens=WARMUP_TOKENS, spec=spec)
    t0 = time.perf_counter()
    g = model.session().generate(ids, max_tokens=max_tokens, spec=spec)
    wall = time.perf_counter() - t0
    st = g.stats
    # decode_tok_s is the stat colibri reports (tokens per second of decode forwards);
    # decode_wall_tok_s also counts what the loop does between forwards (sampling, stop
    # checks, detokenizing, drafting and auto's decision): the wall time less the prefill.
    out: dict[str, Any] = {"mode": mode, "tokens": len(g.token_ids), "wall_s": wall,
                           "decode_s": st.decode_seconds, "decode_tok_s": st.decode_tok_s,
                           "decode_wall_tok_s": max(len(g.token_ids) - 1, 0)
                           / max(wall - st.prefill_seconds, 1e-9),
                           "token_ids": g.token_ids}
    if st.spec is not None:
        out.update(acceptance=st.spec.acceptance, tokens_per_forward=st.spec.tokens_per_forward,
                   mean_accepted=st.spec.mean_accepted, drafted=st.spec.drafted,
                   accepted=st.spec.accepted, verify_cost_ratio=st.spec.verify_cost_ratio,
                   auto_off_steps=st.spec.auto_off_steps,
                   verify_forwards=st.spec.verify_forwards,
                   plain_forwards=st.spec.plain_forwards,
                   acceptance_at=list(st.spec.acceptance_at))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-draft", type=int, default=8)
    args = ap.parse_args()
    model = colibri.Model.load(smollm2_path(),
                               engine=colibri.EngineConfig(threads={"n": args.threads}))
    prompts = {name: model.apply_chat_template(text, tokenize=True)
               for name, text in TASKS.items()}
    runs: list[dict[str, Any]] = []
    loads: list[Any] = []
    for r in range(args.repeats):
        loads.append(conditions()["load_average"])
        for name, ids in prompts.items():
            order = MODES[r % 3:] + MODES[:r % 3]
            for mode in order:
                runs.append({"round": r, "task": name,
                             **run(model, ids, mode, args.max_tokens, args.max_draft)})
    rows, summary = [], []
    for name in TASKS:
        by = {m: [x for x in runs if x["task"] == name and x["mode"] == m] for m in MODES}
        same = all(x["token_ids"] == by["off"][0]["token_ids"] for m in MODES for x in by[m])
        base = median([x["decode_tok_s"] for x in by["off"]])
        row: list[Any] = [name, len(by["off"][0]["token_ids"]), base]
        entry: dict[str, Any] = {"task": name, "same_tokens": same, "off_tok_s": base}
        for m in ("lookup", "auto"):
            ratios = [x["decode_tok_s"] / o["decode_tok_s"]
                      for x, o in zip(by[m], by["off"], strict=True)]
            tpf = median([x["tokens_per_forward"] for x in by[m]])
            acc = median([x["acceptance"] for x in by[m]])
            q1, _, q3 = quartiles(ratios)
            wall = median([x["decode_wall_tok_s"] / o["decode_wall_tok_s"]
                           for x, o in zip(by[m], by["off"], strict=True)])
            row += [median([x["decode_tok_s"] for x in by[m]]), median(ratios)]
            if m == "auto":  # the spread of the rounds: one round's ratio moves by ~0.2x
                row += [f"{q1:.2f}-{q3:.2f}", wall]
            row += [acc, tpf]
            entry[m] = {"tok_s": median([x["decode_tok_s"] for x in by[m]]),
                        "ratio_median": median(ratios), "ratio_q1": q1, "ratio_q3": q3,
                        "wall_ratio_median": wall,
                        "ratios": ratios, "acceptance": acc, "tokens_per_forward": tpf}
        row.append("yes" if same else "NO")
        rows.append(row)
        summary.append(entry)
    table = print_table(["task", "tokens", "off tok/s", "lookup tok/s", "lookup x",
                         "lookup acc", "lookup tok/fwd", "auto tok/s", "auto x",
                         "auto x q1-q3", "auto x wall", "auto acc",
                         "auto tok/fwd", "same tokens"], rows)
    for x in runs:
        x.pop("token_ids")
    path = write_result("spec", {"threads": args.threads, "repeats": args.repeats,
                                 "max_tokens": args.max_tokens, "max_draft": args.max_draft,
                                 "load_average_per_round": loads,
                                 "conditions_end": conditions(), "summary": summary,
                                 "table": table, "runs": runs})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
