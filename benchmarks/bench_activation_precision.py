"""int8 vs float32 activations: what each costs in faithfulness and in speed, in one run.

``EngineConfig.activation_precision`` decides how activations meet quantized weights:
``int8`` rounds each activation row to 8-bit blocks and uses integer dot products
(llama.cpp's arithmetic), ``float32`` dequantizes each weight row and uses float dot
products (transformers' arithmetic on the same GGUF). This measures, side by side:

1. **Faithfulness**: teacher-forced logits over ``--tokens`` tokens of a real English text
   (the GPL-3 under /usr/share/common-licenses), each setting with the KV cache type "auto"
   picks for it, against float32 activations with an f32 cache (the exact path, which
   tests/oracle matches to transformers within float rounding): mean and 99th-percentile
   KL divergence of the full-vocabulary distributions, and top-1 agreement.
2. **Answers**: the greedy chat answers to the questions the docs ask.
3. **Model speed**: prefill tok/s (a ``--prefill``-token prompt) and decode tok/s (greedy
   steps after short and long contexts), settings alternating within each round (order
   flipped every round) so machine noise hits both alike; medians of ``--repeats`` rounds.
4. **Kernels at large models' shapes**: one-token (decode) and 64-token (prefill) matmuls
   of routed-expert matrices (DeepSeek-V3 / Kimi: 2048 x 7168 and 7168 x 2048; Qwen3-30B-A3B:
   768 x 2048) in Q4_K, Q4_0 and Q8_0, timed in C++ (colibri._bench.bench_matmul).

    python benchmarks/bench_activation_precision.py --model smollm2 --model smollm2-moe-demo
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from _common import conditions, median, print_table, write_result
from colibri import Model, _bench
from colibri._core import quant as q
from colibri.settings.config import EngineConfig, ThreadConfig

TEXT = Path("/usr/share/common-licenses/GPL-3")
QUESTIONS = ("What is the capital of France?", "Why is the sky blue?", "Hi",
             "What is 2+2?", "Name three fruits.")
PRECISIONS = ("int8", "float32")
SHAPES = (("DeepSeek-V3 expert gate/up", 2048, 7168), ("DeepSeek-V3 expert down", 7168, 2048),
          ("Qwen3-30B-A3B expert gate/up", 768, 2048))
KERNEL_TYPES = ("Q4_K", "Q4_0", "Q8_0")


def _load(model: str, precision: str, threads: int, kv: str = "auto",
          context: int = 2048) -> Model:
    return Model.load(model, engine=EngineConfig(
        threads=ThreadConfig(n=threads), context_length=context, kv_cache_type=kv,
        activation_precision=precision))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def faithfulness(model: str, n_tokens: int, threads: int) -> list[dict[str, Any]]:
    exact = _load(model, "float32", threads, kv="f32")
    ids = exact.tokenizer.encode(TEXT.read_text(), add_special_tokens=False)[:n_tokens]
    ref = _log_softmax(exact.session().forward(ids, all_logits=True))
    exact.close()
    rows = []
    for precision in PRECISIONS:
        m = _load(model, precision, threads)
        s = m.session()
        lp = _log_softmax(s.forward(ids, all_logits=True))
        kld = (np.exp(ref) * (ref - lp)).sum(axis=-1)
        rows.append({"model": model, "precision": precision, "kv": s.kv_cache_type,
                     "tokens": len(ids), "kld_mean": float(kld.mean()),
                     "kld_p99": float(np.quantile(kld, 0.99)),
                     "top1": float((ref.argmax(-1) == lp.argmax(-1)).mean())})
        m.close()
    return rows


def answers(model: str, threads: int, max_tokens: int) -> list[dict[str, Any]]:
    rows = []
    for precision in PRECISIONS:
        m = _load(model, precision, threads)
        for question in QUESTIONS:
            text = m.chat(question, max_tokens=max_tokens).text
            rows.append({"model": model, "precision": precision, "question": question,
                         "answer": text})
        m.close()
    return rows


def _decode_rate(m: Model, context_ids: list[int], steps: int) -> float:
    s = m.session()
    logits = s.forward(context_ids)
    t0 = time.perf_counter()
    for _ in range(steps):
        logits = s.forward([int(np.argmax(logits))])
    return steps / (time.perf_counter() - t0)


def _prefill_rate(m: Model, ids: list[int]) -> float:
    s = m.session()
    t0 = time.perf_counter()
    s.forward(ids)
    return len(ids) / (time.perf_counter() - t0)


def model_speed(model: str, threads: int, repeats: int, prefill: int, steps: int,
                contexts: list[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    need = max([prefill, *contexts]) + steps + 8
    models = {p: _load(model, p, threads, context=need) for p in PRECISIONS}
    text_ids = models["int8"].tokenizer.encode(TEXT.read_text(), add_special_tokens=False)
    runs: list[dict[str, Any]] = []
    for r in range(repeats):
        order = PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]
        load = conditions()["load_average"]
        for precision in order:
            m = models[precision]
            run: dict[str, Any] = {"round": r, "precision": precision, "load_average": load,
                                   "prefill_tok_s": _prefill_rate(m, text_ids[:prefill])}
            for c in contexts:
                run[f"decode_tok_s@{c}"] = _decode_rate(m, text_ids[:c], steps)
            runs.append(run)
    for m in models.values():
        m.close()
    keys = [k for k in runs[0] if k.endswith("tok_s") or "tok_s@" in k]
    summary = []
    for k in keys:
        med = {p: median([x[k] for x in runs if x["precision"] == p]) for p in PRECISIONS}
        ratios = [b[k] / a[k] for a, b in zip(
            sorted((x for x in runs if x["precision"] == "int8"), key=lambda x: x["round"]),
            sorted((x for x in runs if x["precision"] == "float32"), key=lambda x: x["round"]),
            strict=True)]
        summary.append({"model": model, "measure": k, "int8": med["int8"],
                        "float32": med["float32"], "float32/int8": median(ratios)})
    return summary, runs


def kernel_speed(threads: int, repeats: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    pool = _bench.ThreadPool(threads)
    rows = []
    for label, rows_n, cols in SHAPES:
        for dtype in KERNEL_TYPES:
            w = q.quantize(dtype, rng.standard_normal((rows_n, cols), dtype=np.float32))
            for n_tokens in (1, 64):
                x = rng.standard_normal((n_tokens, cols), dtype=np.float32)
                iters = 20 if n_tokens == 1 else 4
                per: dict[str, list[float]] = {p: [] for p in PRECISIONS}
                for r in range(repeats):
                    for p in (PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]):
                        _bench.bench_matmul(dtype, w, rows_n, cols, x, pool, 2, None, False, p)
                        per[p].append(median(_bench.bench_matmul(
                            dtype, w, rows_n, cols, x, pool, iters, None, False, p)))
                t8, t32 = median(per["int8"]), median(per["float32"])
                rows.append({"shape": label, "rows": rows_n, "cols": cols, "dtype": dtype,
                             "tokens": n_tokens, "int8_ms": t8 * 1e3, "float32_ms": t32 * 1e3,
                             "float32/int8": t32 / t8})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a named model or a path (repeatable); "
                    "default smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1024, help="faithfulness text length")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32, help="decode steps per measurement")
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--answer-tokens", type=int, default=24)
    ap.add_argument("--skip-kernels", action="store_true")
    args = ap.parse_args()
    models = args.model or ["smollm2"]

    faith = [row for m in models for row in faithfulness(m, args.tokens, args.threads)]
    print_table(["model", "activations", "KV", "mean KLD", "p99 KLD", "top-1"],
                [[r["model"], r["precision"], r["kv"], r["kld_mean"], r["kld_p99"],
                  f"{100 * r['top1']:.1f}%"] for r in faith])
    said = [row for m in models for row in answers(m, args.threads, args.answer_tokens)]
    print_table(["model", "activations", "question", "answer"],
                [[r["model"], r["precision"], r["question"], r["answer"][:70].replace("\n", " ")]
                 for r in said])
    speed, runs = [], []
    for m in models:
        s, r = model_speed(m, args.threads, args.repeats, args.prefill, args.steps,
                           args.contexts)
        speed += s
        runs += r
    print_table(["model", "measure", "int8", "float32", "float32/int8"],
                [[r["model"], r["measure"], r["int8"], r["float32"], r["float32/int8"]]
                 for r in speed])
    kernels = [] if args.skip_kernels else kernel_speed(args.threads, args.repeats)
    if kernels:
        print_table(["shape", "type", "tokens", "int8 ms", "float32 ms", "float32/int8"],
                    [[r["shape"], r["dtype"], r["tokens"], r["int8_ms"], r["float32_ms"],
                      r["float32/int8"]] for r in kernels])
    path = write_result("activation-precision", {
        "args": vars(args), "faithfulness": faith, "answers": said, "speed": speed,
        "speed_runs": runs, "kernels": kernels})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
