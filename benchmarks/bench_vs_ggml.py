"""colibri's matrix-vector kernels next to llama.cpp's own (ggml), on the same packed bytes,
in the same run.

ggml is the libggml-cpu / libggml-base shipped inside the installed llama-cpp-python
wheel (llama_cpp/lib), driven through ctypes: one ggml context holds the weight matrix
(a copy of the bytes colibri times) and the F32 activation vector, and one graph of
`--iters` GGML_OP_MUL_MAT nodes is computed per timing (ggml_graph_compute_with_ctx),
so both sides pay the same per-matvec work: quantize the activations to the weight
type's dot type (Q8_K for the K- and i-quants), then one dot per row. colibri's side is
colibri._bench.bench_matmul (iters matvecs inside one ComputeScope), at --isa.

Weights are random blocks with a finite scale (bench_kernels.random_blocks): every grid
index is in range, and neither side's work depends on the values. Both outputs are
compared (max |colibri - ggml| / max |ggml|): the same math on the same bytes, up to the
order of float sums.

Both sides are timed by the same Python wrapper: wall seconds of one call / iters (median
of --repeats, colibri and ggml alternating), and for 1 thread the calling thread's CPU
seconds (best repeat), which leaves out time the OS gave to other processes: on a shared
host read the CPU-time columns. Prints a table (type, colibri GB/s, ggml GB/s, colibri /
ggml) and writes JSON to benchmarks/results/vs-ggml-<timestamp>.json. The header names the
ISA ggml was compiled for (its ggml_cpu_has_* flags): the wheel installed here was built
for AVX2 without AVX-512, so on an AVX-512 host compare --isa avx2 for like with like.

    PYTHONPATH=python:build/dev/wt .venv/bin/python benchmarks/bench_vs_ggml.py
    ... --types IQ1_M IQ1_S IQ2_XXS --threads 1 2 --isa avx512 --repeats 5
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from _common import machine, median, print_table, write_result
from bench_kernels import make_weight
from colibri import _bench
from colibri._core import quant as q

GRID_TYPES = ["IQ1_M", "IQ1_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S"]

# ggml_type values (ggml.h; stable across ggml versions, they are GGUF's type ids).
GGML_TYPES = {
    "F32": 0, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11,
    "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19,
    "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ4_XS": 23, "IQ1_M": 29, "MXFP4": 39,
}


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class Ggml:
    """The few ggml entry points a matmul graph needs, from llama-cpp-python's libraries."""

    def __init__(self) -> None:
        import llama_cpp  # the wheel's location; the libraries are loaded directly

        lib = Path(llama_cpp.__file__).resolve().parent / "lib"
        self.dir = lib
        self.base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        self.cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        vp, i64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
        sigs: dict[str, tuple[Any, Any, list[Any]]] = {
            "ggml_init": (self.base, vp, [InitParams]),
            "ggml_free": (self.base, None, [vp]),
            "ggml_new_tensor_2d": (self.base, vp, [vp, ctypes.c_int, i64, i64]),
            "ggml_get_data": (self.base, vp, [vp]),
            "ggml_nbytes": (self.base, sz, [vp]),
            "ggml_mul_mat": (self.base, vp, [vp, vp, vp]),
            "ggml_new_graph_custom": (self.base, vp, [vp, sz, ctypes.c_bool]),
            "ggml_build_forward_expand": (self.base, None, [vp, vp]),
            "ggml_tensor_overhead": (self.base, sz, []),
            "ggml_graph_overhead_custom": (self.base, sz, [sz, ctypes.c_bool]),
            "ggml_cpu_init": (self.cpu, None, []),
            "ggml_graph_compute_with_ctx": (self.cpu, ctypes.c_int, [vp, vp, ctypes.c_int]),
        }
        for name, (so, res, args) in sigs.items():
            fn = getattr(so, name)
            fn.restype, fn.argtypes = res, args
            setattr(self, name[len("ggml_"):], fn)
        self.cpu_init()

    def has(self) -> dict[str, int]:
        flags = ("avx2", "avx512", "avx512_vnni", "avx512_vbmi", "avx_vnni", "f16c", "fma")
        return {f: int(getattr(self.cpu, f"ggml_cpu_has_{f}")()) for f in flags}


class GgmlMatvec:
    """y = W x as `iters` GGML_OP_MUL_MAT nodes of one graph, W a copy of `w`'s bytes."""

    def __init__(self, g: Ggml, dtype: str, w: np.ndarray, rows: int, cols: int, iters: int):
        self.g, self.iters = g, iters
        overhead = g.tensor_overhead() * (iters + 4) + g.graph_overhead_custom(iters + 8, False)
        # Weights, activations, iters outputs, the work buffer (quantized activations, per
        # thread scratch) and slack.
        mem = w.nbytes + 4 * cols + 4 * rows * iters + 8 * cols + (16 << 20) + overhead
        self.ctx = g.init(InitParams(mem, None, False))
        if not self.ctx:
            raise MemoryError("ggml_init failed")
        self.w = g.new_tensor_2d(self.ctx, GGML_TYPES[dtype], cols, rows)
        if g.nbytes(self.w) != w.nbytes:
            raise ValueError(f"{dtype}: ggml expects {g.nbytes(self.w)} bytes, have {w.nbytes}")
        ctypes.memmove(g.get_data(self.w), w.ctypes.data, w.nbytes)
        self.x = g.new_tensor_2d(self.ctx, GGML_TYPES["F32"], cols, 1)
        self.graph = g.new_graph_custom(self.ctx, iters + 8, False)
        self.outs = [g.mul_mat(self.ctx, self.w, self.x) for _ in range(iters)]
        for t in self.outs:
            g.build_forward_expand(self.graph, t)
        self.rows, self.cols = rows, cols

    def set_x(self, x: np.ndarray) -> None:
        src = np.ascontiguousarray(x, np.float32)
        ctypes.memmove(self.g.get_data(self.x), src.ctypes.data, 4 * self.cols)

    def run(self, threads: int) -> None:
        if self.g.graph_compute_with_ctx(self.ctx, self.graph, threads) != 0:
            raise RuntimeError("ggml_graph_compute_with_ctx failed")

    def output(self) -> np.ndarray:
        ptr = ctypes.cast(self.g.get_data(self.outs[0]), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=(self.rows,)).copy()

    def free(self) -> None:
        self.g.free(self.ctx)


def timed(fn: Any, iters: int) -> tuple[float, float]:
    """Wall and calling-thread CPU seconds per matvec of one call running `iters` of them.
    Both sides are timed by this one wrapper; the CPU time (meaningful for 1 thread, where
    the caller does all the work in both libraries) leaves out the time the OS gave to
    other processes on a shared host."""
    t0, c0 = time.perf_counter(), time.thread_time()
    fn()
    return (time.perf_counter() - t0) / iters, (time.thread_time() - c0) / iters


def finite_iq1m_scale(w: np.ndarray, dtype: str) -> None:
    """IQ1_M keeps its fp16 super-block scale in the top nibbles of its 4 scale words
    (bytes 48..55 of a 56-byte block): set it to 0.01 so both outputs are finite."""
    if dtype != "IQ1_M":
        return
    blocks = w.reshape(-1, 56)
    words = blocks[:, 48:56].copy().view(np.uint16)  # (n, 4)
    bits = int(np.float16(0.01).view(np.uint16))
    for j in range(4):
        words[:, j] = (words[:, j] & 0x0FFF) | (((bits >> (4 * j)) & 0xF) << 12)
    blocks[:, 48:56] = words.view(np.uint8)


def compare(dtype: str, args: argparse.Namespace, isa: str | None, g: Ggml, x: np.ndarray,
            pools: dict[int, Any], rng: np.random.Generator) -> list[dict[str, Any]]:
    """One record per thread count: both libraries on the same bytes, alternating."""
    rows, cols, iters = args.rows, args.cols, args.iters
    w = make_weight(dtype, rows, cols, rng)
    finite_iq1m_scale(w, dtype)
    gm = GgmlMatvec(g, dtype, w, rows, cols, iters)
    gm.set_x(x)
    ours = q.matmul(dtype, w, rows, cols, x, 1, isa)[0]
    gm.run(1)
    theirs = gm.output()
    rel = float(np.max(np.abs(ours - theirs)) / max(float(np.max(np.abs(theirs))), 1e-30))
    out = []
    for n in args.threads:
        def ours_run(n: int = n) -> None:
            _bench.bench_matmul(dtype, w, rows, cols, x, pools[n], iters, isa)

        def theirs_run(n: int = n) -> None:
            gm.run(n)

        ours_run()  # warm-up (page faults, caches, ggml's OpenMP team)
        theirs_run()
        c_ts, g_ts = [], []
        for _ in range(args.repeats):  # alternating, so drift on a shared host hits both
            c_ts.append(timed(ours_run, iters))
            g_ts.append(timed(theirs_run, iters))
        c_wall, g_wall = median([t[0] for t in c_ts]), median([t[0] for t in g_ts])
        rec: dict[str, Any] = {
            "type": dtype, "shape": [rows, cols], "bytes": int(w.nbytes), "threads": n,
            "isa": isa or q.best_isa(), "colibri_seconds": c_ts, "ggml_seconds": g_ts,
            "colibri_gb_s": w.nbytes / c_wall / 1e9, "ggml_gb_s": w.nbytes / g_wall / 1e9,
            "ratio_wall": g_wall / c_wall, "max_rel_diff": rel,
        }
        if n == 1:
            c_cpu, g_cpu = min(t[1] for t in c_ts), min(t[1] for t in g_ts)
            rec.update(colibri_gb_s_cpu_time=w.nbytes / c_cpu / 1e9,
                       ggml_gb_s_cpu_time=w.nbytes / g_cpu / 1e9, ratio_cpu_time=g_cpu / c_cpu)
        out.append(rec)
    gm.free()
    return out


def table_row(r: dict[str, Any]) -> list[Any]:
    cpu: list[Any] = ["-", "-", "-"]
    if "ratio_cpu_time" in r:
        cpu = [round(r["colibri_gb_s_cpu_time"], 2), round(r["ggml_gb_s_cpu_time"], 2),
               f"{r['ratio_cpu_time']:.2f}x"]
    return [r["type"], r["threads"], r["isa"], round(r["colibri_gb_s"], 2),
            round(r["ggml_gb_s"], 2), f"{r['ratio_wall']:.2f}x", *cpu, f"{r['max_rel_diff']:.1e}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", nargs="+", default=GRID_TYPES)
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    ap.add_argument("--isa", default="best", help="colibri's ISA: best, or avx2, avx512, ...")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    isa = None if args.isa == "best" else args.isa

    g = Ggml()
    has = g.has()
    rng = np.random.default_rng(0)
    x = np.random.default_rng(1).standard_normal((1, args.cols), dtype=np.float32)
    pools = {n: _bench.ThreadPool(n) for n in args.threads}
    load_before = os.getloadavg()
    records = [r for dtype in args.types for r in compare(dtype, args, isa, g, x, pools, rng)]

    ggml_isa = ", ".join(f for f, v in has.items() if v) or "none"
    print(f"\nCPU: {machine()['cpu']}; ggml ({g.dir}) built for: {ggml_isa}; "
          f"{args.rows}x{args.cols}; load avg before {load_before[0]:.2f}, "
          f"after {os.getloadavg()[0]:.2f}\n")
    table = print_table(["type", "threads", "colibri isa", "colibri GB/s", "ggml GB/s",
                         "colibri/ggml", "CPU-time: colibri", "ggml", "colibri/ggml",
                         "max rel diff"], [table_row(r) for r in records])
    path = write_result("vs-ggml", {
        "args": vars(args), "ggml_has": has, "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(), "results": records, "table": table,
    })
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
