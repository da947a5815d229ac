"""Continuous batching under concurrency: 1, 2, 4, 8 streams on one model.

For each concurrency C, C threads each run ``--requests`` greedy generations (prompts of
mixed lengths, ``--max-tokens`` tokens each, no early stop) through the server's
scheduler path: a :class:`colibri.batching.StepBatcher` attached to the model, every
generation's forwards going through its shared steps (C = 1 runs the same path alone).
Reported per C: aggregate decode tok/s (all generated tokens / wall time), per-request
decode tok/s (median over requests of (tokens - 1) / (last token - first token)), time to
first token p50/p95 (from submission, prefill included), steps and mean rows per step,
and for a streamed MoE the routed-expert bytes read per generated token (falls as
concurrency rises: a step reads each distinct expert once for all its rows).

Models: the resident SmolLM2-135M (Q4_1) and the demo MoE built from it (30 layers x 4
experts, top-2, every expert different) streamed through an expert cache of ``--slots``
slots (its RAM budget). The concurrency levels run in alternating order over
``--repeats`` rounds (1 2 4 8, then 8 4 2 1, ...) and the figures are medians; the load
average is recorded before and after each run (the machine is shared).

    PYTHONPATH=python:build/dev/NAME python benchmarks/bench_serve_concurrency.py
    ... --models smollm2 --levels 1 4 --repeats 1 --requests 2     # a quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import colibri as co
from _common import conditions, print_table, write_result
from colibri.batching import StepBatcher

QUESTIONS = ["What is the capital of France?", "Name three planets and their moons.",
             "Say hello.", "Explain in one sentence why the sky is blue.",
             "List five colours.", "What is 2+2?", "Write a haiku about the sea.",
             "Who wrote Hamlet?"]


def smollm2_path() -> Path:
    from realmodel import smollm2_gguf

    return smollm2_gguf()


def load(name: str, slots: int, threads: int, tmp: Path) -> co.Model:
    cfg: dict[str, Any] = dict(threads=co.ThreadConfig(n=threads), context_length=512)
    if name == "smollm2":
        return co.Model.load(smollm2_path(), engine=co.EngineConfig(**cfg))
    from colibri.demo_moe import make_demo_moe
    from streaming_helpers import budget_for_slots

    path = tmp / "demo4.gguf"
    if not path.exists():
        make_demo_moe(smollm2_path(), path, n_experts=4, top_k=2, seed=3, experts="halves")
    budget = budget_for_slots(path, slots, threads=threads, context_length=512,
                              precision="int8")
    return co.Model.load(path, engine=co.EngineConfig(ram_budget=budget, **cfg))


def run_level(model: co.Model, conc: int, requests: int, max_tokens: int) -> dict[str, Any]:
    batcher = StepBatcher(max_rows=max(conc, 1) + 1)
    batcher.attach(model)
    ttft: list[float] = []
    per_req: list[float] = []
    generated = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def client(i: int) -> None:
        for j in range(requests):
            q = QUESTIONS[(i * requests + j) % len(QUESTIONS)]
            batcher.join()
            try:
                t0 = time.perf_counter()
                times = []
                for chunk in model.stream(messages=[{"role": "user", "content": q}],
                                          max_tokens=max_tokens, sampling={"temperature": 0},
                                          min_tokens=max_tokens):
                    if chunk.token_id is not None:
                        times.append(time.perf_counter())
                with lock:
                    ttft.append(times[0] - t0)
                    if len(times) > 1 and times[-1] > times[0]:
                        per_req.append((len(times) - 1) / (times[-1] - times[0]))
                    generated[0] += len(times)
            except BaseException as exc:
                errors.append(exc)
            finally:
                batcher.leave()

    model.reset_stats()
    load0 = conditions()["load_average"]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(conc)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    batcher.detach()
    if errors:
        raise errors[0]
    ex = model.stats().experts
    q = statistics.quantiles(ttft, n=20) if len(ttft) >= 2 else [ttft[0]] * 19
    return {"concurrency": conc, "requests": len(ttft), "generated": generated[0],
            "wall_s": wall, "aggregate_tok_s": generated[0] / wall,
            "per_request_tok_s": statistics.median(per_req) if per_req else 0.0,
            "ttft_p50_s": statistics.median(ttft), "ttft_p95_s": q[18],
            "steps": batcher.steps, "rows_per_step": batcher.rows / max(batcher.steps, 1),
            "bytes_read": ex.bytes_read, "bytes_per_token": ex.bytes_read / max(generated[0], 1),
            "load_before": load0, "load_after": conditions()["load_average"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2", "demo-moe"],
                    choices=["smollm2", "demo-moe"])
    ap.add_argument("--levels", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--requests", type=int, default=3, help="per stream (default 3)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--slots", type=int, default=40, help="demo MoE cache slots (of 120)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = load(name, args.slots, args.threads, Path(tmp))
            runs: dict[int, list[dict[str, Any]]] = {c: [] for c in args.levels}
            for r in range(args.repeats):
                order = args.levels if r % 2 == 0 else list(reversed(args.levels))
                for c in order:
                    runs[c].append(run_level(model, c, args.requests, args.max_tokens))
            model.close()
            for c in args.levels:
                med = {k: statistics.median(x[k] for x in runs[c])
                       for k in ("aggregate_tok_s", "per_request_tok_s", "ttft_p50_s",
                                 "ttft_p95_s", "rows_per_step", "bytes_per_token")}
                results.append({"model": name, "concurrency": c, **med, "runs": runs[c]})
    rows = [(r["model"], r["concurrency"], r["aggregate_tok_s"], r["per_request_tok_s"],
             r["ttft_p50_s"], r["ttft_p95_s"], r["rows_per_step"],
             r["bytes_per_token"] / 2**20) for r in results]
    print_table(["model", "streams", "aggregate tok/s", "per-request tok/s", "TTFT p50 s",
                 "TTFT p95 s", "rows/step", "MiB read/token"], rows)
    path = write_result("serve_concurrency", {"args": vars(args), "results": results})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
