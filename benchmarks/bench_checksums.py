"""What checksums cost: crc32 speed (zlib vs the folded PCLMUL path), and streaming decode
with ``IOConfig.checksums`` off / first / always on a model whose experts do not fit
the cache, so most expert reads are re-reads after eviction (the reads "first" skips).

    PYTHONPATH=python:build/dev/NAME .venv/bin/python benchmarks/bench_checksums.py \
        [--preset small] [--decode 24] [--repeats 3] [--cache-slots 96]

The model is benchmarks/synthetic_moe.py's preset converted to a native container under
build/bench-data/ (written on first use). Modes run alternately, ``--repeats`` times, in
one process; decode tok/s is the median, and the ratio to "off" is reported. Direct I/O
(each read goes to the disk) and buffered reads from the page cache (memory-speed reads:
the worst case for a checksum's relative cost) are both measured. The load average is
recorded: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

import colibri as co
from _common import median, print_table, write_result
from colibri import _core
from colibri.convert import write_container
from synthetic_moe import DEFAULT_DIR, ensure_preset


def crc_speed(size: int, repeats: int) -> dict[str, float]:
    buf = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    out = {}
    for name, ref in (("zlib", True), ("folded", False)):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _core.io.crc32(buf, 0, ref)
            times.append(time.perf_counter() - t0)
        out[name] = size / min(times) / 1e9
    return out


def container(preset: str) -> Path:
    out = DEFAULT_DIR / f"checksums-{preset}.colibri"
    if not (out / "manifest.json").is_file():
        write_container(ensure_preset(preset), out)
    return out


def decode(path: Path, mode: str, direct: bool, slots_bytes: int, n: int) -> dict[str, Any]:
    engine = co.EngineConfig(
        threads=co.ThreadConfig(n=2), ram_budget=slots_bytes, context_length=256,
        io=co.IOConfig(workers=2, direct=direct, checksums=mode),
        cache=co.CacheConfig(history=False),
    )  # fmt: skip
    with co.Model.load(path, engine) as model:
        s = model.session()
        ids = list(range(3, 3 + 8))
        logits = s.forward(ids)
        model.reset_stats()
        t0 = time.perf_counter()
        for i in range(n):
            logits = s.forward([int(np.argmax(logits)) % 200 + 3 + i % 7])
        dt = time.perf_counter() - t0
        st = model.stats().experts
    return {"tok_s": n / dt, "reads": st.reads, "bytes_read": st.bytes_read,
            "checksum_failures": st.checksum_failures}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--decode", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", default="400MiB", help="ram_budget (the cache gets the rest)")
    args = ap.parse_args()
    load0 = os.getloadavg()
    speed = crc_speed(64 << 20, 5)
    print(f"crc32 GB/s on 64 MiB: zlib {speed['zlib']:.2f}, folded {speed['folded']:.2f} "
          f"(accelerated: {_core.io.crc32_accelerated()})")  # fmt: skip
    path = container(args.preset)
    budget = co.parse_bytes(args.budget)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    modes = ("off", "first", "always")
    for direct in (True, False):
        key = "direct" if direct else "buffered"
        results[key] = {m: [] for m in modes}
        for r in range(args.repeats):
            for m in (modes if r % 2 == 0 else modes[::-1]):  # alternate the order
                results[key][m].append(decode(path, m, direct, budget, args.decode))
    rows = []
    for key, per in results.items():
        base = median([x["tok_s"] for x in per["off"]])
        for m, xs in per.items():
            tok = median([x["tok_s"] for x in xs])
            rows.append([key, m, f"{tok:.2f}", f"{tok / base:.3f}",
                         f"{median([x['reads'] for x in xs]) / args.decode:.0f}"])  # fmt: skip
    print(print_table(["reads", "checksums", "decode tok/s", "vs off", "expert reads/token"], rows))
    load1 = os.getloadavg()
    print(f"load average before/after: {load0[0]:.1f} / {load1[0]:.1f} (a shared machine)")
    out = write_result("checksums", {"args": vars(args), "crc32_gb_s": speed, "runs": results,
                                     "loadavg": [load0, load1]})  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
