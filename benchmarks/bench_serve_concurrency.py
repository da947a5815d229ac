"""Continuous batching under concurrency: 1, 2, 4, 8 streams on one model; and prompt-prefix
sharing between requests arriving together (``--shared-prefix``).

For each concurrency C, C asyncio clients each run ``--requests`` greedy generations
(prompts of mixed lengths, ``--max-tokens`` tokens each, no early stop) through the
server's own path without HTTP: a :class:`colibri.server.Scheduler` with ``--parallel``
slots (as ``colibri serve --parallel P``: a StepBatcher attached to the model, every
generation driven by ``colibri.generate.aio.pump_stream`` and registered with the step loop, so it
samples right after each step and the next step waits for it). Reported per C: aggregate
decode tok/s (all generated tokens / wall time), per-request decode tok/s (median over
requests of (tokens - 1) / (last token - first token)), time to first token p50/p95 (from
admission, prefill included), steps and mean rows per step, and for a streamed MoE the
routed-expert bytes read per generated token (falls as concurrency rises: a step reads
each distinct expert once for all its rows).

Models: the resident SmolLM2-135M (Q4_1) and the demo MoE built from it (30 layers x 4
experts, top-2, every expert different) streamed through an expert cache of ``--slots``
slots (its RAM budget). The concurrency levels run in alternating order over
``--repeats`` rounds (1 2 4 8, then 8 4 2 1, ...) and the figures are medians; the load
average is recorded before and after each run (the machine is shared).

``--shared-prefix N``: instead, 8 (``--levels``' largest) requests arrive at once, each a
chat whose system prompt (about N tokens) is the same and whose question differs, on
SmolLM2 with the prompt cache on; prefix sharing between running requests on and off
alternate over ``--repeats`` rounds (the cache emptied before each run). Reported per
mode: TTFT p50/p95 and max, wall time, and the prompt tokens actually prefilled.

    PYTHONPATH=python:build/dev/NAME python benchmarks/bench_serve_concurrency.py
    ... --models smollm2 --levels 1 4 --repeats 1 --requests 2     # a quick look
    ... --shared-prefix 1000 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import colibri as co
from _common import conditions, print_table, write_result
from colibri.server.metrics import Metrics
from colibri.server.scheduler import Scheduler

QUESTIONS = ["What is the capital of France?", "Name three planets and their moons.",
             "Say hello.", "Explain in one sentence why the sky is blue.",
             "List five colours.", "What is 2+2?", "Write a haiku about the sea.",
             "Who wrote Hamlet?"]


def smollm2_path() -> Path:
    from realmodel import smollm2_gguf

    return smollm2_gguf()


def load(name: str, slots: int, threads: int, tmp: Path, context: int = 512,
         prompt_cache: str | int = 0) -> co.Model:
    cfg: dict[str, Any] = dict(threads=co.ThreadConfig(n=threads), context_length=context,
                               prompt_cache=prompt_cache)
    if name == "smollm2":
        return co.Model.load(smollm2_path(), engine=co.EngineConfig(**cfg))
    from streaming_helpers import budget_for_slots

    from colibri.models.demo_moe import make_demo_moe

    path = tmp / "demo4.gguf"
    if not path.exists():
        make_demo_moe(smollm2_path(), path, n_experts=4, top_k=2, seed=3, experts="halves")
    budget = budget_for_slots(path, slots, threads=threads, context_length=512,
                              precision="int8")
    return co.Model.load(path, engine=co.EngineConfig(ram_budget=budget, **cfg))


def _options(max_tokens: int) -> dict[str, Any]:
    return {"max_tokens": max_tokens, "min_tokens": max_tokens, "sampling": {"temperature": 0}}


async def _request(s: Scheduler, ids: list[int], max_tokens: int) -> list[float]:
    """The times of a request's tokens (the first from admission), through a ticket as
    the server's routes do."""
    ticket = s.admit(positions=len(ids) + max_tokens)
    t0 = ticket.admitted
    async with ticket:
        times = [time.perf_counter() async for c in ticket.stream(ids, _options(max_tokens))
                 if c.token_id is not None]
    return [t - t0 for t in times]


def _quantiles(xs: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(xs, n=20) if len(xs) >= 2 else [xs[0]] * 19
    return statistics.median(xs), q[18]


def run_level(model: co.Model, conc: int, requests: int, max_tokens: int,
              parallel: int) -> dict[str, Any]:
    s = Scheduler(model, Metrics(), max_running=parallel, max_queue=conc)
    ttft: list[float] = []
    per_req: list[float] = []
    generated = [0]

    async def client(i: int) -> None:
        for j in range(requests):
            q = QUESTIONS[(i * requests + j) % len(QUESTIONS)]
            ids = model.encode_prompt(messages=[{"role": "user", "content": q}])
            times = await _request(s, ids, max_tokens)
            ttft.append(times[0])
            if len(times) > 1 and times[-1] > times[0]:
                per_req.append((len(times) - 1) / (times[-1] - times[0]))
            generated[0] += len(times)

    async def clients() -> None:
        await asyncio.gather(*(client(i) for i in range(conc)))

    model.reset_stats()
    load0 = conditions()["load_average"]
    t0 = time.perf_counter()
    try:
        asyncio.run(clients())
    finally:
        s.close()
    wall = time.perf_counter() - t0
    ex = model.stats().experts
    b = s.batcher
    steps, rows = (b.steps, b.rows) if b is not None else (0, 0)
    p50, p95 = _quantiles(ttft)
    return {"concurrency": conc, "requests": len(ttft), "generated": generated[0],
            "wall_s": wall, "aggregate_tok_s": generated[0] / wall,
            "per_request_tok_s": statistics.median(per_req) if per_req else 0.0,
            "ttft_p50_s": p50, "ttft_p95_s": p95,
            "steps": steps, "rows_per_step": rows / max(steps, 1),
            "bytes_read": ex.bytes_read, "bytes_per_token": ex.bytes_read / max(generated[0], 1),
            "load_before": load0, "load_after": conditions()["load_average"]}


SYSTEM_WORDS = ("You are the assistant of a bookshop. Answer questions about books, opening "
                "hours, orders, gift cards and events, briefly and politely, in the customer's "
                "language. ").split()


def system_prompt(model: co.Model, tokens: int) -> str:
    """A system prompt of about `tokens` tokens (the instructions, repeated)."""
    words: list[str] = []
    while len(model.tokenizer.encode(" ".join(words))) < tokens:
        words.extend(SYSTEM_WORDS)
    return " ".join(words)


def run_shared(model: co.Model, n: int, system: str, max_tokens: int,
               sharing: bool) -> dict[str, Any]:
    """`n` requests at once with one system prompt, sharing on or off (cache emptied)."""
    model.prompt_cache.clear()
    model.prompt_cache.share_running = sharing
    s = Scheduler(model, Metrics(), max_running=n, max_queue=n)
    prompts = [model.encode_prompt(messages=[{"role": "system", "content": system},
                                             {"role": "user", "content": QUESTIONS[i % 8]}])
               for i in range(n)]

    async def clients() -> list[list[float]]:
        return list(await asyncio.gather(*(_request(s, p, max_tokens) for p in prompts)))

    load0 = conditions()["load_average"]
    t0 = time.perf_counter()
    try:
        times = asyncio.run(clients())
    finally:
        s.close()
        model.prompt_cache.share_running = True
    wall = time.perf_counter() - t0
    st = model.prompt_cache.stats()
    ttft = [t[0] for t in times]
    p50, p95 = _quantiles(ttft)
    total = sum(len(p) for p in prompts)
    return {"sharing": sharing, "requests": n, "prompt_tokens": total,
            "prompt_tokens_each": [len(p) for p in prompts],
            "prefilled_tokens": total - st.shared_tokens - st.reused_tokens,
            "shared_tokens": st.shared_tokens, "shares": st.shares,
            "cache_reused_tokens": st.reused_tokens,
            "ttft_p50_s": p50, "ttft_p95_s": p95, "ttft_max_s": max(ttft), "wall_s": wall,
            "load_before": load0, "load_after": conditions()["load_average"]}


def main_shared(args: argparse.Namespace) -> int:
    n = max(args.levels)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = load("smollm2", args.slots, args.threads, Path(tmp),
                     context=args.shared_prefix + 256, prompt_cache="512MiB")
        system = system_prompt(model, args.shared_prefix)
        runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for r in range(args.repeats):
            for sharing in ((True, False) if r % 2 == 0 else (False, True)):
                runs[sharing].append(run_shared(model, n, system, args.max_tokens, sharing))
        model.close()
    for sharing in (True, False):
        med = {k: statistics.median(x[k] for x in runs[sharing])
               for k in ("ttft_p50_s", "ttft_p95_s", "ttft_max_s", "wall_s",
                         "prefilled_tokens")}
        results.append({"sharing": sharing, "requests": n,
                        "prompt_tokens": runs[sharing][0]["prompt_tokens"], **med,
                        "runs": runs[sharing]})
    rows = [("on" if r["sharing"] else "off", r["requests"], r["prompt_tokens"],
             r["prefilled_tokens"], r["ttft_p50_s"], r["ttft_p95_s"], r["ttft_max_s"],
             r["wall_s"]) for r in results]
    print_table(["sharing", "requests", "prompt tokens", "prefilled tokens", "TTFT p50 s",
                 "TTFT p95 s", "TTFT max s", "wall s"], rows)
    path = write_result("serve_prefix_share", {"args": vars(args), "results": results})
    print(f"wrote {path}")
    return 0


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
    ap.add_argument("--parallel", type=int, default=8,
                    help="the scheduler's slots (colibri serve --parallel; default 8)")
    ap.add_argument("--shared-prefix", type=int, default=0, metavar="TOKENS",
                    help="measure prefix sharing instead: --levels' largest number of "
                         "requests at once with a system prompt of about TOKENS tokens")
    args = ap.parse_args()
    if args.shared_prefix:
        return main_shared(args)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = load(name, args.slots, args.threads, Path(tmp))
            runs: dict[int, list[dict[str, Any]]] = {c: [] for c in args.levels}
            for r in range(args.repeats):
                order = args.levels if r % 2 == 0 else list(reversed(args.levels))
                for c in order:
                    runs[c].append(run_level(model, c, args.requests, args.max_tokens,
                                             max(args.parallel, c)))
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
