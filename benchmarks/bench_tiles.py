"""Multi-token matmul time of the quantized kernels (prefill chunks, speculative verifies):
y = W x for x of n token rows, one thread, through colibri._bench.bench_matmul (the
threaded matmul's own path: activation quantization, tiles of weight rows, the ISA's tile
kernel). SmolLM2-135M-shaped matrices (1536 x 576 gate/up, 576 x 1536 down; random
weights, L2-resident), so the numbers are the kernels' arithmetic, not memory. Each cell is
the median over --repeats of the fastest of a run's iterations; the per-token column is
(t(n) - t(1)) / (n - 1), what one more verify row costs.

    PYTHONPATH=python:build/dev/kern .venv/bin/python benchmarks/bench_tiles.py
    ... --types Q4_1 Q8_0 Q4_0 --tokens 1 9 16 17 --isa avx2
    ... --types Q4_1 Q8_0 --lanes   # also the row-lane layout (quant/lane_pack.hpp), A/B

Run two builds alternately (A/B/A/B) to compare them: one run moves by a few per cent.
"""

from __future__ import annotations

import argparse

import numpy as np

from _common import median, print_table, write_result
from colibri import _bench
from colibri._core import quant as q

SHAPES = [(1536, 576), (576, 1536)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", nargs="+", default=["Q4_1"])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 5, 9, 16, 17])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--isa", default=None,
                    help="an ISA name (avx2, avx512, ...); default: the best")
    ap.add_argument("--lanes", action="store_true",
                    help="time each cell in the file's layout and in the row-lane layout the "
                         "engine packs resident Q4_1 / Q8_0 into, alternately")
    args = ap.parse_args()
    tokens = sorted(set(args.tokens) | {1})
    rng = np.random.default_rng(0)
    rows, results = [], []
    for dtype in args.types:
        for r, c in SHAPES:
            w = q.quantize(dtype, rng.standard_normal((r, c)).astype(np.float32))
            packed = q.pack_lanes(dtype, w, r, c) if args.lanes else None
            us: dict[int, float] = {}
            lane_us: dict[int, float] = {}
            for n in tokens:
                x = rng.standard_normal((n, c)).astype(np.float32)
                iters = max(3, int(160 / n))
                t_rows, t_lanes = [], []
                for _ in range(args.repeats):
                    t_rows.append(min(_bench.bench_matmul(dtype, w, r, c, x, threads=1,
                                                          iters=iters, isa=args.isa)))
                    if packed is not None:
                        t_lanes.append(min(_bench.bench_matmul(dtype, packed, r, c, x, threads=1,
                                                               iters=iters, isa=args.isa,
                                                               lanes=True)))
                us[n] = median(t_rows) * 1e6
                if t_lanes:
                    lane_us[n] = median(t_lanes) * 1e6
            for n in tokens:
                per = (us[n] - us[1]) / (n - 1) if n > 1 else 0.0
                row: list[object] = [dtype, f"{r}x{c}", n, us[n], per]
                entry = {"type": dtype, "rows": r, "cols": c, "tokens": n, "us": us[n],
                         "us_per_extra_token": per}
                if lane_us:
                    lper = (lane_us[n] - lane_us[1]) / (n - 1) if n > 1 else 0.0
                    row += [lane_us[n], lper, lane_us[n] / us[n]]
                    entry.update(lanes_us=lane_us[n], lanes_us_per_extra_token=lper)
                rows.append(row)
                results.append(entry)
    headers = ["type", "shape", "tokens", "us", "us / extra token"]
    if args.lanes:
        headers += ["row-lane us", "row-lane us / extra token", "row-lane / file"]
    table = print_table(headers, rows)
    path = write_result("tiles", {"isa": args.isa or q.best_isa(), "repeats": args.repeats,
                                  "lanes": args.lanes,
                                  "results": results, "table": table})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
