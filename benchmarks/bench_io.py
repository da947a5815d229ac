"""Read throughput of the expert read path (colibri._core.io.ReadPool).

Reads a ~2 GiB file as 4 MiB extents (the size of a large expert) in a shuffled order,
keeping `depth` reads outstanding with `depth` I/O workers (queue depth 1..8; depth 0 is
workers=0, synchronous reads on the caller), O_DIRECT vs buffered, cold vs warm:

* cold: the file is evicted from the page cache before each run. By default only this
  file's pages are evicted (posix_fadvise(POSIX_FADV_DONTNEED), no root needed, leaves the
  page cache of other jobs on a shared machine alone); --drop-caches uses
  `echo 3 > /proc/sys/vm/drop_caches` (root) instead.
* warm: the file was just read buffered, so its pages are in the page cache. O_DIRECT
  bypasses the page cache, so its warm and cold rows should agree: that is the point.

The timed loop runs in C++ (ReadPool.bench: preallocated, pre-faulted slabs, no Python per
read). GB/s = bytes / wall seconds, median of --repeats runs. Prints a table and writes
JSON to benchmarks/results/io-<timestamp>.json.

    PYTHONPATH=python:build/dev/io .venv/bin/python benchmarks/bench_io.py
    ... --size-gib 2 --depths 0 1 2 4 8 --repeats 3 [--drop-caches] [--keep]

The data file is build/bench-data/io-<size>.bin; it is reused when present and deleted at
the end unless --keep.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path
from typing import Any

import colibri._core.io as cio
from _common import median, print_table, write_result

MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "build" / "bench-data"


def make_file(path: Path, size: int) -> None:
    if path.exists() and path.stat().st_size == size:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    chunk = os.urandom(4 * MIB)  # real blocks, not a sparse file; content does not matter
    with open(tmp, "wb") as f:
        for i in range(size // len(chunk)):
            f.write(bytes([i & 0xFF]) + chunk[1:])
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)


def evict(path: Path, drop_caches: bool) -> None:
    if drop_caches:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm_up(path: Path) -> None:
    with open(path, "rb", buffering=0) as f:
        while f.read(16 * MIB):
            pass


def run_one(
    path: Path, offsets: list[int], block: int, depth: int, direct: bool
) -> tuple[float, dict[str, Any]]:
    workers = depth
    with cio.ReadPool([str(path)], workers=workers, direct=direct) as pool:
        secs = pool.bench(0, offsets, block, max(depth, 1))
        return secs, pool.stats()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--block-mib", type=int, default=4)
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--drop-caches", action="store_true", help="evict with drop_caches (root)")
    ap.add_argument("--keep", action="store_true", help="keep the data file for the next run")
    args = ap.parse_args()

    block = args.block_mib * MIB
    size = int(args.size_gib * (1 << 30)) // block * block
    path = DATA_DIR / f"io-{size >> 20}MiB.bin"
    t0 = time.perf_counter()
    make_file(path, size)
    print(f"data file {path} ({size / 2**30:.2f} GiB) ready in {time.perf_counter() - t0:.1f} s")

    offsets = list(range(0, size, block))
    configs = [
        (state, direct, depth)
        for state in ["cold", "warm"]
        for direct in [True, False]
        for depth in args.depths
    ]
    runs: dict[tuple[str, bool, int], list[float]] = {c: [] for c in configs}
    last_stats: dict[tuple[str, bool, int], dict[str, Any]] = {}
    load0 = os.getloadavg()
    try:
        # Repeats outermost: on a shared machine, noise then spreads over every
        # configuration instead of hitting all repeats of one.
        for r in range(args.repeats):
            for c in configs:
                state, direct, depth = c
                random.Random(r).shuffle(offsets)
                if state == "cold":
                    evict(path, args.drop_caches)
                elif c == next(x for x in configs if x[0] == "warm"):
                    warm_up(path)  # O_DIRECT and buffered reads both leave the pages cached
                secs, last_stats[c] = run_one(path, offsets, block, depth, direct)
                runs[c].append(size / secs / 1e9)
                mode = "direct" if direct else "buffered"
                print(
                    f"  [{r + 1}/{args.repeats}] {state} {mode} qd={depth}: {runs[c][-1]:.2f} GB/s",
                    flush=True,
                )
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    rows: list[list[Any]] = []
    results: list[dict[str, Any]] = []
    for c in configs:
        state, direct, depth = c
        stats = last_stats[c]
        mode = "direct" if direct else "buffered"
        gbs = median(runs[c])
        lat_ms = stats["read_seconds"] / max(stats["reads"], 1) * 1e3
        qd = "sync" if depth == 0 else str(depth)
        rows.append([state, mode, qd, gbs, max(runs[c]), lat_ms, stats["inline_reads"]])
        results.append(
            {
                "state": state,
                "mode": mode,
                "workers": depth,
                "in_flight": max(depth, 1),
                "gb_per_s_median": gbs,
                "gb_per_s_runs": runs[c],
                "last_run_stats": stats,
            }
        )
    load1 = os.getloadavg()

    print(
        f"\n{args.block_mib} MiB reads of a {size / 2**30:.2f} GiB file, shuffled, median of "
        f"{args.repeats}; load {load0[0]:.1f} -> {load1[0]:.1f}"
    )
    print_table(
        ["cache", "mode", "workers (QD)", "GB/s", "best GB/s", "ms/read", "inline reads"], rows
    )
    out = write_result(
        "io",
        {
            "file_bytes": size,
            "block_bytes": block,
            "repeats": args.repeats,
            "evict": "drop_caches" if args.drop_caches else "posix_fadvise",
            "loadavg_before": load0,
            "loadavg_after": load1,
            "results": results,
        },
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
