"""Multi-token matmul time of the quantized kernels (prefill chunks, speculative verifies):
y = W x for x of n token rows, one thread, through colibri._core.quant.bench_matmul (the
threaded matmul's own path: activation quantization, tiles of weight rows, the ISA's tile
kernel). SmolLM2-135M-shaped matrices (1536 x 576 gate/up, 576 x 1536 down; random
weights, L2-resident), so the numbers are the kernels' arithmetic, not memory. Each cell is
the median over --repeats of the fastest of a run's iterations; the per-token column is
(t(n) - t(1)) / (n - 1), what one more verify row costs.

    PYTHONPATH=python:build/dev/kern .venv/bin/python benchmarks/bench_tiles.py
    ... --types Q4_1 Q8_0 Q4_0 --tokens 1 9 16 17 --isa avx2

Run two builds alternately (A/B/A/B) to compare them: one run moves by a few per cent.
"""

from __future__ import annotations

import argparse

import numpy as np

from _common import median, print_table, write_result
from colibri._core import quant as q

SHAPES = [(1536, 576), (576, 1536)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", nargs="+", default=["Q4_1"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 5, 9, 16, 17])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--isa", default=None,
                    help="an ISA name (avx2, avx512, ...); default: the best")
    args = ap.parse_args()
    tokens = sorted(set(args.tokens) | {1})
    rng = np.random.default_rng(0)
    rows, results = [], []
    for dtype in args.types:
        for r, c in SHAPES:
            w = q.quantize(dtype, rng.standard_normal((r, c)).astype(np.float32))
            us: dict[int, float] = {}
            for n in tokens:
                x = rng.standard_normal((n, c)).astype(np.float32)
                iters = max(3, int(160 / n))
                us[n] = median([min(q.bench_matmul(dtype, w, r, c, x, threads=1, iters=iters,
                                                   isa=args.isa))
                                for _ in range(args.repeats)]) * 1e6
            for n in tokens:
                per = (us[n] - us[1]) / (n - 1) if n > 1 else 0.0
                rows.append([dtype, f"{r}x{c}", n, us[n], per])
                results.append({"type": dtype, "rows": r, "cols": c, "tokens": n, "us": us[n],
                                "us_per_extra_token": per})
    table = print_table(["type", "shape", "tokens", "us", "us / extra token"], rows)
    path = write_result("tiles", {"isa": args.isa or q.best_isa(), "repeats": args.repeats,
                                  "results": results, "table": table})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
