"""What a speculative verify costs on SmolLM2-135M-Instruct Q4_1, resident: the wall time
of a forward of n tokens (n = 1..9) after a prompt, with the last position's logits (a
prefill chunk) and with every position's logits (a verify of n - 1 drafts), relative to a
one-token forward. The forwards alternate (1, n, n all, rolled back each time) so machine
noise hits all alike; medians over the repeats.

    python benchmarks/bench_verify_cost.py --threads 2 --repeats 40
    python benchmarks/bench_verify_cost.py --contexts 0 500 1000 2000 4000  # context sweep

``--contexts`` sweeps the context the forwards follow (the tokens already in the KV cache:
a verify's rows attend over all of them, so a long file being edited makes every row
dearer): 0 is the short chat prompt alone; N > 0 forwards N tokens of filler after it.
``summary`` in the JSON is the first context's, ``by_context`` has them all.
"""

from __future__ import annotations

import argparse
import time

import colibri
from _common import conditions, median, print_table, write_result
from bench_smollm2 import smollm2_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--max-n", type=int, default=9)
    ap.add_argument("--contexts", type=int, nargs="+", default=[0],
                    help="filler tokens in the KV cache before the timed forwards (0: none)")
    args = ap.parse_args()
    if any(c < 0 for c in args.contexts):
        ap.error("--contexts must be >= 0")
    longest = max(args.contexts) + args.max_n + 256  # + the chat prompt
    model = colibri.Model.load(smollm2_path(), engine=colibri.EngineConfig(
        threads={"n": args.threads}, context_length=longest if longest > 4096 else None))
    ids = model.apply_chat_template("Write a short story about a lighthouse keeper.",
                                    tokenize=True)
    load0 = conditions()["load_average"]
    by_context: dict[int, list[dict[str, float]]] = {}
    tables = []
    for context in args.contexts:
        s = model.session()
        s.forward(ids)
        if context:  # filler: the cost of attention does not depend on what the tokens say
            s.forward([200 + (i * 7) % 5000 for i in range(context)])
        by_context[context], table = measure(s, args.max_n, args.repeats, context)
        tables.append(table)
    first = by_context[args.contexts[0]]
    path = write_result("verify-cost", {"threads": args.threads, "repeats": args.repeats,
                                        "contexts": args.contexts,
                                        "load_average_start": load0,
                                        "conditions_end": conditions(),
                                        "summary": first,
                                        "by_context": {str(c): v for c, v in by_context.items()},
                                        "table": "\n\n".join(tables)})
    print(f"wrote {path}")


def measure(s: colibri.Session, max_n: int, repeats: int,
            context: int) -> tuple[list[dict[str, float]], str]:
    """Times forwards of 1..max_n tokens after the session's tokens (rolled back each
    time), alternating, and tabulates them against the one-token forward."""

    def timed(n: int, all_logits: bool) -> float:
        t0 = time.perf_counter()
        s.forward([100 + i for i in range(n)], all_logits=all_logits)
        spent = time.perf_counter() - t0
        s.rollback(n)
        return spent

    for _ in range(5):  # warm the caches and the thread pool
        timed(max_n, True)
    times: dict[tuple[int, bool], list[float]] = {}
    for _ in range(repeats):
        for n in range(1, max_n + 1):
            for all_logits in (False, True):
                times.setdefault((n, all_logits), []).append(timed(n, all_logits))
    one = median(times[(1, False)])
    rows, summary = [], []
    for n in range(1, max_n + 1):
        last, every = median(times[(n, False)]), median(times[(n, True)])
        rho = (every / one - 1.0) / (n - 1) if n > 1 else 0.0
        rows.append([n, last * 1e3, last / one, every * 1e3, every / one, rho])
        summary.append({"n": n, "last_ms": last * 1e3, "all_ms": every * 1e3,
                        "last_ratio": last / one, "all_ratio": every / one,
                        "rho": rho})
    print(f"context: {s.n_tokens} tokens ({context} filler)")
    table = print_table(["tokens", "last-logits ms", "x one", "all-logits ms", "x one",
                         "rho (per draft)"], rows)
    return summary, table


if __name__ == "__main__":
    main()
