"""What the session hardening costs: SmolLM2 Q4_1 decode (and load) with this checkout
against a baseline checkout, in one run, alternating.

The hardening adds per forward: a busy flag and a commit under a mutex, a cancellation
check between layers (a clock read; the GIL is taken once at the end of a step to look at
Python's signals), and the last logits kept in the native session. Each measurement runs
in a fresh child process (the two builds are the same module name), the order alternates,
and the table gives medians and the ratio new / baseline.

    python benchmarks/bench_session_overhead.py \\
        --baseline /tmp/base:build/dev/base --current python:build/dev/NAME \\
        --threads 2 --repeats 6 --decode 128

``--baseline`` / ``--current`` are PYTHONPATH strings (the package sources, then the build
with ``colibri/_core``). Make the baseline with ``git archive <commit> python | tar -x -C
/tmp/base`` and ``./dev-build.sh base`` at that commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import median, print_table, write_result

CHILD = r"""
import json, sys, time
import numpy as np
import colibri
path, threads, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
m = colibri.Model.load(path, engine=colibri.EngineConfig(threads={"n": threads},
                                                         context_length=1024))
load = time.perf_counter() - t0
prompt = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
          411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2]
best = 0.0
for _ in range(2):  # the better of two passes: the first warms caches and the clock
    s = m.session()
    logits = s.forward(prompt)
    t = time.perf_counter()
    for _ in range(n_decode):
        logits = s.forward([int(np.argmax(logits))])
    best = max(best, n_decode / (time.perf_counter() - t))
print(json.dumps({"load_s": load, "decode_tok_s": best}))
"""


def _measure(pythonpath: str, model: str, threads: int, n_decode: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(threads), str(n_decode)],
                         env=env, capture_output=True, text=True, check=True, timeout=900)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="PYTHONPATH of the baseline")
    ap.add_argument("--current", default="python:build/dev/default")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--decode", type=int, default=128)
    args = ap.parse_args()
    if args.model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_smollm2 import smollm2_path

        args.model = smollm2_path()
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "current": []}
    for i in range(args.repeats):
        order = ["baseline", "current"] if i % 2 == 0 else ["current", "baseline"]
        for name in order:
            path = args.baseline if name == "baseline" else args.current
            runs[name].append(_measure(path, str(args.model), args.threads, args.decode))
    rows: list[list[Any]] = []
    summary: dict[str, Any] = {}
    for key in ("decode_tok_s", "load_s"):
        b = median([r[key] for r in runs["baseline"]])
        c = median([r[key] for r in runs["current"]])
        rows.append([key, b, c, c / b])
        summary[key] = {"baseline": b, "current": c, "ratio": c / b}
    print(f"SmolLM2 Q4_1, {args.threads} threads, {args.decode} decode steps, median of "
          f"{args.repeats} (alternating); load average {os.getloadavg()[0]:.1f}")
    print_table(["figure", "baseline", "current", "current / baseline"], rows)
    path = write_result("session_overhead", {
        "settings": vars(args) | {"model": str(args.model)}, "runs": runs, "summary": summary,
        "load_average": os.getloadavg()})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
