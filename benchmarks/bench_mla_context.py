"""Resident decode at long contexts: colibri vs llama-cpp-python on the same synthetic MoE
GGUF, every expert resident. ``--preset ds3-small`` (the default; synthetic_deepseek.py: a
deepseek2 file, 4 layers, absorbed multi-head latent attention, kv_lora 512 + rope 64) or
any other synthetic preset, e.g. ``oss20-attn`` (synthetic_gpt_oss.py: gpt-oss-20b's
attention, sinks and a 128-token window on every other layer).

For each context length the KV cache is filled with a prefill of ``context - decode``
token ids (the same ids for both engines), then ``--decode`` tokens are decoded one by one
(each step feeds the next id of the sequence: forced decoding, so both engines do the same
work); decode tok/s is wall time over that loop. Both engines run in one process, the
order alternating per repeat, after a warm-up; medians and the colibri / llama.cpp ratio
are printed, with the load average (the development machines are shared). JSON goes to
benchmarks/results/mla-context-*.json.

    PYTHONPATH=python:build/dev/<name> python benchmarks/bench_mla_context.py \\
        --contexts 512,4096 --decode 32 --repeats 3 --threads 2

``--cpu-time`` times both engines by the process's CPU seconds instead of wall seconds:
with ``--threads 1`` on a loaded machine, a steadier measure of each engine's work (the
scheduler's share of the cores drops out).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from typing import Any

import numpy as np

from _common import median, print_table, write_result
from synthetic_moe import ensure_preset

_CLOCK = time.perf_counter


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _ids(n: int, vocab: int, seed: int = 5) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(300, vocab, size=n)]


def run_colibri(model: Any, ids: list[int], n_decode: int) -> dict[str, float]:
    s = model.session()
    t0 = _CLOCK()
    s.forward(ids[: len(ids) - n_decode])
    t1 = _CLOCK()
    for tok in ids[len(ids) - n_decode:]:
        s.forward([tok])
    t2 = _CLOCK()
    return {"prefill_s": t1 - t0, "decode_tok_s": n_decode / (t2 - t1)}


def run_llama(llm: Any, ids: list[int], n_decode: int) -> dict[str, float]:
    llm.reset()
    t0 = _CLOCK()
    llm.eval(ids[: len(ids) - n_decode])
    t1 = _CLOCK()
    for tok in ids[len(ids) - n_decode:]:
        llm.eval([tok])
    t2 = _CLOCK()
    return {"prefill_s": t1 - t0, "decode_tok_s": n_decode / (t2 - t1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="ds3-small")
    ap.add_argument("--contexts", default="512,4096")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-extra-bufts", action="store_true",
                    help="llama.cpp use_extra_bufts=False (AMX hosts; say so where quoted)")
    ap.add_argument("--activation-precision", default="auto", choices=("auto", "int8", "float32"),
                    help="colibri's (auto: float32 for models under 1 GiB of weights, as "
                    "ds3-small; int8 is llama.cpp's arithmetic)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="rates per CPU second of the process (use with --threads 1)")
    args = ap.parse_args(argv)
    if args.cpu_time:
        global _CLOCK
        _CLOCK = cpu_seconds

    import llama_cpp

    import colibri

    load0 = os.getloadavg()
    gguf = ensure_preset(args.preset)
    contexts = [int(c) for c in args.contexts.split(",")]
    top = max(contexts)
    cfg = colibri.EngineConfig(context_length=top, cache=colibri.CacheConfig(preload=True),
                               threads=colibri.ThreadConfig(n=args.threads),
                               activation_precision=args.activation_precision)  # fmt: skip
    model = colibri.Model.load(gguf, engine=cfg)
    kw: dict[str, Any] = {}
    if args.no_extra_bufts:
        kw["use_extra_bufts"] = False
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=top, n_threads=args.threads,
                          n_threads_batch=args.threads, n_batch=512, verbose=False,
                          **kw)  # fmt: skip
    vocab = model.config.vocab_size
    rows, results = [], {}
    for ctx in contexts:
        ids = _ids(ctx, vocab)
        runs: dict[str, list[dict[str, float]]] = {"colibri": [], "llama.cpp": []}
        for rep in range(args.repeats + 1):  # round 0 warms up
            order = ("colibri", "llama.cpp") if rep % 2 else ("llama.cpp", "colibri")
            for eng in order:
                r = (run_colibri(model, ids, args.decode) if eng == "colibri"
                     else run_llama(llm, ids, args.decode))  # fmt: skip
                if rep:
                    runs[eng].append(r)
        c = median([r["decode_tok_s"] for r in runs["colibri"]])
        ll = median([r["decode_tok_s"] for r in runs["llama.cpp"]])
        pc = median([r["prefill_s"] for r in runs["colibri"]])
        pl = median([r["prefill_s"] for r in runs["llama.cpp"]])
        results[str(ctx)] = {"runs": runs, "colibri_decode_tok_s": c, "llama_decode_tok_s": ll,
                             "ratio": c / ll, "colibri_prefill_s": pc, "llama_prefill_s": pl}
        rows.append([ctx, c, ll, f"{c / ll:.2f}", pc, pl])
        print(f"context {ctx}: colibri {c:.2f} tok/s, llama.cpp {ll:.2f} tok/s", flush=True)
    load = os.getloadavg()
    clock = "CPU" if args.cpu_time else "wall"
    print(f"{args.preset}, resident, {args.threads} threads, decode {args.decode} tokens "
          f"(medians of {args.repeats}, {clock} time); "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print_table(["context", "colibri decode tok/s", "llama.cpp decode tok/s", "ratio",
                 "colibri prefill s", "llama.cpp prefill s"], rows)  # fmt: skip
    path = write_result("mla-context", {
        "preset": args.preset, "gguf": str(gguf), "threads": args.threads,
        "decode": args.decode, "repeats": args.repeats, "load_average": load,
        "load_average_start": load0, "clock": "cpu" if args.cpu_time else "wall",
        "llama_no_extra_bufts": args.no_extra_bufts, "contexts": results,
        "activation_precision": model.engine_config.activation_precision.value,
    })  # fmt: skip
    print("wrote", path)


if __name__ == "__main__":
    main()
