"""What a speculative verify costs on SmolLM2-135M-Instruct Q4_1, resident: the wall time
of a forward of n tokens (n = 1..9) after a prompt, with the last position's logits (a
prefill chunk) and with every position's logits (a verify of n - 1 drafts), relative to a
one-token forward. The forwards alternate (1, n, n all, rolled back each time) so machine
noise hits all alike; medians over the repeats.

    python benchmarks/bench_verify_cost.py --threads 2 --repeats 40
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
    args = ap.parse_args()
    model = colibri.Model.load(smollm2_path(),
                               engine=colibri.EngineConfig(threads={"n": args.threads}))
    ids = model.apply_chat_template("Write a short story about a lighthouse keeper.",
                                    tokenize=True)
    s = model.session()
    s.forward(ids)
    load0 = conditions()["load_average"]

    def timed(n: int, all_logits: bool) -> float:
        t0 = time.perf_counter()
        s.forward([100 + i for i in range(n)], all_logits=all_logits)
        spent = time.perf_counter() - t0
        s.rollback(n)
        return spent

    for _ in range(5):  # warm the caches and the thread pool
        timed(args.max_n, True)
    times: dict[tuple[int, bool], list[float]] = {}
    for _ in range(args.repeats):
        for n in range(1, args.max_n + 1):
            for all_logits in (False, True):
                times.setdefault((n, all_logits), []).append(timed(n, all_logits))
    one = median(times[(1, False)])
    rows, summary = [], []
    for n in range(1, args.max_n + 1):
        last, every = median(times[(n, False)]), median(times[(n, True)])
        rho = (every / one - 1.0) / (n - 1) if n > 1 else 0.0
        rows.append([n, last * 1e3, last / one, every * 1e3, every / one, rho])
        summary.append({"n": n, "last_ms": last * 1e3, "all_ms": every * 1e3,
                        "last_ratio": last / one, "all_ratio": every / one,
                        "rho": rho})
    table = print_table(["tokens", "last-logits ms", "x one", "all-logits ms", "x one",
                         "rho (per draft)"], rows)
    path = write_result("verify-cost", {"threads": args.threads, "repeats": args.repeats,
                                        "load_average_start": load0,
                                        "conditions_end": conditions(),
                                        "summary": summary, "table": table})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
