"""The per-MoE-layer round trip of experts pooled over Ray workers (issue 36, item 2).

What one MoE layer costs on the network path when the routed experts live in other
processes: the coordinator sends each worker the rows routed to its experts and gets back
each expert's output separately (to sum in the router's order, so the result is
bit-identical). The workers here do no arithmetic (they echo a slice of the input per
expert), so what is timed is the data plane alone:

- ``actor``: plain actor calls, ``ray.get([w.run.remote(x) for w in workers])``;
- ``compiled``: a Ray Compiled Graph (``experimental_compile``) over the same actors,
  which moves the arguments through shared-memory channels on one node;
- ``local``: the same Python work in the coordinator (the floor: no transport at all).

Payload per layer: ``rows`` x ``hidden`` float32 in, ``rows`` x ``hidden`` out per expert
a worker owns (``top_k`` experts spread evenly over the workers). Defaults are the
DeepSeek-V3/GLM-5 shape (hidden 7168, top-8) for one decode token and for a batch of 8.

    pip install 'ray>=2.47'
    python benchmarks/bench_ray_dataplane.py --workers 1 2 3 4 --rows 1 8 --iters 300

Prints a table (median and p90 microseconds per layer) and writes the JSON to
benchmarks/results/. The lines at the end say what a token of 60-90 MoE layers would pay.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

from _common import conditions, git_commit, machine, print_table, write_result


class ExpertWorker:
    """Owns `k` experts; returns one array per expert (here a copy of the rows)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        return [x.copy() for _ in range(self.k)]


def _quantiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[int(0.9 * (len(xs) - 1))]


def _payload_bytes(rows: int, hidden: int, top_k: int) -> tuple[int, int]:
    """(bytes sent to each worker, bytes back from all experts together)."""
    per_row = hidden * 4
    return rows * per_row, rows * per_row * top_k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    args = ap.parse_args()

    import ray
    from ray.dag import InputNode, MultiOutputNode

    # Logical CPUs only place actors (a compiled graph adds a proxy actor of its own); the
    # workers here take none, so any worker count runs on a 2-core machine.
    ray.init(num_cpus=max(args.workers) + 4, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")  # fmt: skip

    worker_class = ray.remote(num_cpus=0)(ExpertWorker)

    def local(x: np.ndarray, ks: list[int]) -> list[list[np.ndarray]]:
        return [[x.copy() for _ in range(k)] for k in ks]

    rows_out: list[list[Any]] = []
    results: list[dict[str, Any]] = []

    def measure(n: int, rows: int, mode: str, call: Any, x: np.ndarray) -> None:
        out = call()
        assert sum(len(o) for o in out) == args.top_k  # every expert answered
        assert all(np.array_equal(e, x) for o in out for e in o)
        del out  # a compiled graph's result may be a view of its channel: free it first
        for _ in range(args.warmup):
            call()
        times = []
        for _ in range(args.iters):
            t = time.perf_counter()
            call()
            times.append((time.perf_counter() - t) * 1e6)
        med, p90 = _quantiles(times)
        sent, back = _payload_bytes(rows, args.hidden, args.top_k)
        rows_out.append([n, rows, mode, f"{med:.0f}", f"{p90:.0f}", f"{sent * n / 1024:.0f}",
                         f"{back / 1024:.0f}"])  # fmt: skip
        results.append({"workers": n, "rows": rows, "mode": mode, "median_us": med,
                        "p90_us": p90, "bytes_sent": sent * n, "bytes_back": back})  # fmt: skip

    rng = np.random.default_rng(0)
    inputs = {rows: rng.standard_normal((rows, args.hidden), dtype=np.float32)
              for rows in args.rows}  # fmt: skip
    for n in args.workers:
        ks = [args.top_k // n + (1 if i < args.top_k % n else 0) for i in range(n)]
        workers = [worker_class.remote(k) for k in ks]
        for rows, x in inputs.items():
            measure(n, rows, "local", lambda x=x, ks=ks: local(x, ks), x)
            measure(n, rows, "actor", lambda x=x, ws=workers: ray.get([w.run.remote(x)
                                                                       for w in ws]), x)
        # Once compiled, the actors serve only the graph (plain calls would wait forever).
        with InputNode() as inp:
            dag = MultiOutputNode([w.run.bind(inp) for w in workers])
        compiled = dag.experimental_compile()
        for rows, x in inputs.items():
            measure(n, rows, "compiled", lambda x=x, c=compiled: ray.get(c.execute(x)), x)
        compiled.teardown()
        for w in workers:
            ray.kill(w)
    ray.shutdown()

    print_table(["workers", "rows", "mode", "median us", "p90 us", "KiB out", "KiB back"],
                rows_out)  # fmt: skip
    best = {}
    for r in results:
        if r["mode"] != "local":
            key = (r["workers"], r["rows"])
            best[key] = min(best.get(key, float("inf")), r["median_us"])
    for (n, rows), us in sorted(best.items()):
        print(f"{n} worker(s), {rows} row(s): the faster Ray path costs {us / 1000:.2f} ms per "
              f"MoE layer: {60 * us / 1e6:.3f}-{90 * us / 1e6:.3f} s per token at 60-90 layers")
    write_result("ray_dataplane", {
        "commit": git_commit(), "machine": machine(), "conditions": conditions(),
        "ray": ray.__version__, "hidden": args.hidden, "top_k": args.top_k,
        "iters": args.iters, "loadavg": os.getloadavg(), "results": results,
    })  # fmt: skip


if __name__ == "__main__":
    main()
