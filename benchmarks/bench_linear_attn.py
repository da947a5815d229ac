"""Linear attention, resident: prefill and decode tok/s of a small synthetic Qwen3-Next at
several prompt lengths, with the delta rule's scalar kernels, its SIMD ones (recurrent and
chunked forms), and llama.cpp on the same GGUF file where llama-cpp-python can load it.

The model (random weights, transformers' Qwen3NextForCausalLM saved as float32, then
llama.cpp's convert_hf_to_gguf.py to an F32 GGUF that both engines read) keeps
Qwen3-Next-80B-A3B's linear layers whole (16 key and 32 value heads of 128, a 4-wide
convolution) and its 3:1 schedule (layers linear, linear, linear, full), scaled down
elsewhere: hidden 512 by default, 4 query / 2 KV heads of 128 in the full-attention layer,
32 experts top-4 of 256 with a gated shared expert of 256, a vocabulary of 2048. So the
delta rule is a real share of the work, and the one full-attention layer shows what grows
with the context.

For each prompt length: a fresh session, one forward of the prompt (colibri's default
prefill chunks of 512 tokens), then greedy decode steps; the engines take turns, each
repeat starting from the next one (--repeats; medians), after one warm-up run each; the
scalar and chunked rows only up to --compare-max tokens.
Rows: colibri with the delta rule's kernels at scalar and at the best ISA
(``_core.linear_attn.set_isa``; the same bits), recurrent form (colibri's default), and the
chunked form (forwards of 64 tokens or more, ModelSpec.linear_chunked_min_tokens) at the
best ISA; then llama.cpp (its defaults: F16 KV cache, n_batch 512). First, the delta rule
alone (one 128 x 128 head over 512 tokens) per ISA and form. Writes JSON to benchmarks/results/.

    python benchmarks/bench_linear_attn.py --threads 2 --lengths 512 4096 16384
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from _common import conditions, median, print_table, write_result

REPO = Path(__file__).resolve().parent.parent
_CLOCK = time.perf_counter  # --cpu-time: time.process_time (every thread of this process)


def model_config(hidden: int, context: int) -> dict[str, Any]:
    return dict(
        vocab_size=2048, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_num_key_heads=16, linear_num_value_heads=32,
        num_experts=32, num_experts_per_tok=4, moe_intermediate_size=256,
        shared_expert_intermediate_size=256, max_position_embeddings=context, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
    )  # fmt: skip


def build(root: Path, hidden: int, context: int) -> tuple[Path, Path | None]:
    """The checkpoint under root (written once per configuration) and its F32 GGUF (None
    when llama.cpp's converter is not at hand)."""
    cfg = model_config(hidden, context)
    key = hashlib.sha1(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:10]
    hf_dir, gguf = root / f"qwen3-next-{key}", root / f"qwen3-next-{key}.f32.gguf"
    if not (hf_dir / "config.json").is_file():
        import torch
        import transformers

        torch.manual_seed(0)
        model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**cfg)).float()
        model.save_pretrained(hf_dir, safe_serialization=True)
    if not gguf.is_file():
        # The tests' wrapper of the converter (the llama-cpp-python sdist's, with a
        # placeholder vocabulary): tests/support/deepseek_factory.py.
        sys.path.insert(0, str(REPO / "tests"))
        try:
            from support.deepseek_factory import convert_with_llama_cpp

            convert_with_llama_cpp(hf_dir, gguf, "F32", ("--no-mtp",))
        except (Exception, SystemExit) as e:
            print(f"no GGUF: {type(e).__name__}: {str(e)[:300]}")
            return hf_dir, None
    return hf_dir, gguf


@contextlib.contextmanager
def chunked_form(on: bool) -> Iterator[None]:
    """Models loaded inside run the chunked form for forwards of 64 tokens or more."""
    from colibri.engine import handle

    plain = handle.model_spec

    def spec(*args: Any, **kw: Any) -> Any:
        s = plain(*args, **kw)
        s.linear_chunked_min_tokens = 64 if on else 0
        return s

    handle.model_spec = spec  # the tests patch it the same way
    try:
        yield
    finally:
        handle.model_spec = plain


def run_colibri(model: Any, ids: list[int], n_decode: int) -> dict[str, float]:
    s = model.session()
    t0 = _CLOCK()
    logits = s.forward(ids)
    t1 = _CLOCK()
    for _ in range(n_decode):
        logits = s.forward([int(np.argmax(logits))])
    t2 = _CLOCK()
    return {"prefill_tok_s": len(ids) / (t1 - t0), "decode_tok_s": n_decode / (t2 - t1)}


def run_llama(llm: Any, ids: list[int], n_decode: int) -> dict[str, float]:
    import llama_cpp

    llm.reset()
    t0 = _CLOCK()
    llm.eval(ids)
    t1 = _CLOCK()
    for _ in range(n_decode):
        logits = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)
        )
        llm.eval([int(np.argmax(logits))])
    t2 = _CLOCK()
    return {"prefill_tok_s": len(ids) / (t1 - t0), "decode_tok_s": n_decode / (t2 - t1)}


def kernel_rows(n: int = 512, d: int = 128, repeats: int = 3) -> list[dict[str, Any]]:
    """The delta rule alone, one head of d x d over n tokens: microseconds per token, best
    of `repeats`, for every ISA, both forms, both decay kinds (Gated DeltaNet's one per
    token, Kimi Delta Attention's one per key channel)."""
    from colibri import _core

    rng = np.random.default_rng(1)
    unit = rng.standard_normal((2, n, d))
    unit /= np.sqrt((unit * unit).sum(-1, keepdims=True))
    q, k = (unit[0] / np.sqrt(d)).astype(np.float32), unit[1].astype(np.float32)
    v = rng.standard_normal((n, d)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, n).astype(np.float32)
    S = np.zeros((d, d), np.float32)
    rows = []
    for kind, g in (("gdn", -rng.uniform(0.01, 2.0, n)), ("kda", -rng.uniform(0.01, 2.0, (n, d)))):
        for isa in [i for i in _core.quant.available_isas() if i != "neon"]:
            for chunked in (False, True):
                best = float("inf")
                for _ in range(repeats):
                    t0 = _CLOCK()
                    _core.linear_attn.delta_rule(
                        q, k, v, beta, g.astype(np.float32), S, chunked=chunked, isa=isa
                    )
                    best = min(best, _CLOCK() - t0)
                form = "chunked" if chunked else "recurrent"
                us = best / n * 1e6
                rows.append({"kind": kind, "isa": isa, "form": form, "us_per_token": us})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 4096, 16384])
    ap.add_argument("--decode", type=int, default=16, help="greedy decode steps after each prompt")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--models", type=Path, default=REPO / "build" / "bench-models" / "linear-attn")
    ap.add_argument(
        "--repeats", type=int, default=1, help="runs of each engine per length (medians)"
    )
    ap.add_argument("--no-llama", action="store_true", help="colibri rows only")
    ap.add_argument(
        "--compare-max",
        type=int,
        default=4096,
        help="the scalar and chunked rows only for prompts up to this length",
    )
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="rates per CPU second of the process, not per wall second (a shared "
        "machine; with --threads 1 no thread spins)",
    )
    args = ap.parse_args()
    if args.cpu_time:
        global _CLOCK
        _CLOCK = time.process_time
    kernels = kernel_rows()
    kernel_table = print_table(
        ["decay", "isa", "form", "us/token/head"],
        [[r["kind"], r["isa"], r["form"], r["us_per_token"]] for r in kernels],
    )

    import colibri
    from colibri import _core

    context = max(args.lengths) + args.decode + 64
    hf_dir, gguf = build(args.models, args.hidden, context)
    source = gguf or hf_dir
    best = _core.quant.best_isa()
    rng = np.random.default_rng(0)
    prompts = {n: [int(t) for t in rng.integers(3, 2048, n)] for n in args.lengths}
    cfg = colibri.EngineConfig(context_length=context, threads=colibri.ThreadConfig(n=args.threads))
    recurrent = colibri.Model.load(source, engine=cfg)
    with chunked_form(True):
        chunked = colibri.Model.load(source, engine=cfg)

    def colibri_row(model: Any, isa: str) -> Any:
        def run(ids: list[int], n_decode: int) -> dict[str, float]:
            _core.linear_attn.set_isa(isa)
            return run_colibri(model, ids, n_decode)

        return run

    engines = {f"colibri {best}": colibri_row(recurrent, best),
               "colibri scalar": colibri_row(recurrent, "scalar"),
               f"colibri {best} chunked": colibri_row(chunked, best)}  # fmt: skip
    compared = {"colibri scalar", f"colibri {best} chunked"}
    llama_note = "not run (--no-llama)" if args.no_llama else "no GGUF (converter missing)"
    if gguf is not None and not args.no_llama:
        try:
            import llama_cpp

            llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=context, n_threads=args.threads,
                                  n_threads_batch=args.threads, verbose=False)  # fmt: skip
            llama_note = f"llama-cpp-python {llama_cpp.__version__}"
            engines["llama.cpp"] = lambda ids, n_decode: run_llama(llm, ids, n_decode)
        except Exception as e:
            llama_note = f"llama.cpp failed: {type(e).__name__}: {str(e)[:300]}"
    for run in engines.values():  # warm-up: page the weights in, grow the scratch
        run(prompts[min(prompts)][:64], 2)
    rows: list[dict[str, Any]] = []
    for n, ids in prompts.items():
        names = [e for e in engines if n <= args.compare_max or e not in compared]
        got: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for rep in range(args.repeats):  # the engines in turn, each repeat from another one
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                got[name].append(engines[name](ids, args.decode))
        for name in names:
            medians = {k: median([g[k] for g in got[name]]) for k in got[name][0]}
            rows.append({"engine": name, "tokens": n, **medians, "runs": got[name], **conditions()})
            print({k: v for k, v in rows[-1].items() if k != "runs"}, flush=True)
    _core.linear_attn.set_isa(best)
    print(llama_note)
    table = print_table(
        ["engine", "prompt tokens", "prefill tok/s", "decode tok/s"],
        [[r["engine"], r["tokens"], r["prefill_tok_s"], r["decode_tok_s"]] for r in rows],
    )
    path = write_result("linear_attn", {
        "command": " ".join(sys.argv), "threads": args.threads, "decode_steps": args.decode,
        "clock": "process CPU time" if args.cpu_time else "wall time",
        "model": {"source": source.name, **model_config(args.hidden, context)},
        "llama": llama_note, "rows": rows, "table": table,
        "kernels": kernels, "kernel_table": kernel_table,
    })  # fmt: skip
    print(path)


if __name__ == "__main__":
    main()
