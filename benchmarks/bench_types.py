"""pp512 / tg128 per weight type, llama-bench style: colibri vs llama-cpp-python on
SmolLM2-135M-Instruct re-quantized by llama.cpp's own quantizer into each type.

For each ``--types`` entry this runs ``bench_smollm2.py --mix TYPE --pure --decode 128`` in
a child process (one type per process: each loads both engines fresh), which measures both
engines alternately in one process on the same GGUF and token ids (see its docstring), and
collects its medians: **pp512** (a 512-token prefill of an English passage) and **tg128**
(128 greedy tokens after the chat prompt), in tok/s, with the median per-round ratio. A
type llama.cpp refuses to write (the 1-2 bit i-quants want an importance matrix) is listed
as such. SmolLM2's widths (576, 1536) are not multiples of 256, so for the K- and
i-quants llama.cpp writes some tensors in a fallback type even with ``--pure``; the table
gives the file's largest types. Prints a markdown table, writes compact JSON
(benchmarks/results/types-*.json).

    python benchmarks/bench_types.py --threads 2 --repeats 3
    python benchmarks/bench_types.py --types Q4_0 Q8_0 --threads 1 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import print_table, write_result

HERE = Path(__file__).resolve().parent
DEFAULT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M",
                 "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                 "IQ1_S", "IQ1_M")  # fmt: skip


def run_type(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "bench_smollm2.py"), "--mix", kind, "--pure",
           "--decode", "128", "--repeats", str(args.repeats), "--threads", str(args.threads),
           "--wait-policy", args.wait_policy]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    wrote = [ln.split(" ", 1)[1] for ln in p.stdout.splitlines() if ln.startswith("wrote ")]
    if p.returncode != 0 or not wrote:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return {"type": kind, "error": tail[0][:200]}
    doc = json.loads(Path(wrote[0]).read_text())
    return {"type": kind, "file": doc["model"], "tensor_types": doc["types"],
            "colibri": {k: doc["colibri"][k] for k in ("prefill512_tok_s", "decode_tok_s")},
            "llama.cpp": {k: doc["llama.cpp"][k] for k in ("prefill512_tok_s", "decode_tok_s")},
            "ratio_pp512": doc["ratio_prefill512"], "ratio_tg128": doc["ratio_decode"],
            "greedy_prefix_agreement": doc["greedy_prefix_agreement"], "result": wrote[0]}


def _mix(types: dict[str, int]) -> str:
    big = sorted(types.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{n} x{c}" for n, c in big if n != "F32")[:40]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", nargs="+", default=list(DEFAULT_TYPES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--wait-policy", default="spin")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per type")
    args = ap.parse_args()
    out = []
    rows: list[list[Any]] = []
    for kind in args.types:
        r = run_type(kind, args)
        out.append(r)
        if "error" in r:
            rows.append([kind, "-", "pp512 / tg128", "-", "-", "-", r["error"][:60]])
            print(f"{kind}: {r['error']}", flush=True)
            continue
        for test, key, ratio in (("pp512", "prefill512_tok_s", "ratio_pp512"),
                                 ("tg128", "decode_tok_s", "ratio_tg128")):  # fmt: skip
            rows.append([kind, _mix(r["tensor_types"]), test, r["colibri"][key],
                         r["llama.cpp"][key], f"{r[ratio]:.2f}", ""])  # fmt: skip
        print(f"{kind}: pp512 {r['ratio_pp512']:.2f}x, tg128 {r['ratio_tg128']:.2f}x", flush=True)
    print(f"SmolLM2-135M-Instruct, {args.threads} threads, medians of {args.repeats} rounds")
    print_table(["type", "tensors (not F32)", "test", "colibri t/s", "llama.cpp t/s",
                 "ratio", "note"], rows)  # fmt: skip
    print("wrote", write_result("types", {"threads": args.threads, "repeats": args.repeats,
                                          "wait_policy": args.wait_policy, "types": out}))


if __name__ == "__main__":
    main()
