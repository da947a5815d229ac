"""Peak memory and throughput of ``colibri convert`` (colibri.convert.write_container).

Each conversion runs in a fresh child process (``python -c``) that imports colibri, converts
SOURCE into a scratch container with ``--quant`` and reports its own peak RSS (VmHWM from
/proc/self/status), wall time, bytes and /proc/self/io counters as one JSON line; the parent
also records the child's ``ru_maxrss`` from ``wait4``. A second child per source only opens
the manifest (imports + header parsing, no conversion): the **baseline**, so
``peak - baseline`` is what converting itself costs. Streaming conversion keeps that
difference bounded (a 16 MiB copy buffer, or a few 4 Mi-value row chunks when converting
types) whatever the model's size: compare the ``small`` and ``moe-8g`` presets.

    PYTHONPATH=python:build/dev/conv .venv/bin/python benchmarks/bench_convert_rss.py \\
        --preset small --preset moe-8g --quant keep
    ... SOURCE [SOURCE ...] --quant keep --quant q8_0 [--cold] [--keep-output] [--out DIR]

Presets are the synthetic Qwen3-MoE GGUFs of benchmarks/synthetic_moe.py
(build/bench-data/synthetic-<preset>-v2-s0.Q4_0.gguf); write one first with
``python benchmarks/synthetic_moe.py moe-8g``. ``--cold`` evicts the source's pages from
the page cache before each run (posix_fadvise DONTNEED on its files: no root needed);
without it the source may be partly cached, which is what a re-run sees. The scratch
container (DIR/<source>.<quant>.colibri) is deleted after each run unless --keep-output.

Peak RSS is the child's VmHWM: ``ru_maxrss`` is also shown, but on Linux it carries the
parent's high-water mark across fork/exec, so it is an upper bound. RSS does not count the
page cache the writes and reads go through. Prints a table and writes JSON to
benchmarks/results/convert-rss-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import print_table, write_result

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "build" / "bench-data"
MIB = 1 << 20

# Run in the child: argv = [mode, source, dest, quant]. Prints one JSON line.
CHILD = r"""
import json, os, sys, time
t_start = time.perf_counter()
mode, src, dst, quant = sys.argv[1:5]
from colibri.convert import write_container
from colibri.convert.source import open_convert_source

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0

def io_counters():
    out = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                k, v = line.split(":")
                out[k.strip()] = int(v)
    except OSError:
        pass
    return out

t0 = time.perf_counter()
manifest = open_convert_source(src)
t1 = time.perf_counter()
doc = {"import_s": t0 - t_start, "open_s": t1 - t0, "rss_after_open": status("VmRSS"),
       "source_bytes": sum(os.stat(f).st_size for f in manifest.files),
       "n_tensors": len(manifest.tensors)}
if mode == "convert":
    report = write_container(manifest, dst, quant=quant)
    doc.update(convert_s=time.perf_counter() - t1, bytes_total=report.bytes_total,
               items=report.items_total, items_written=report.items_written)
doc.update(vm_hwm=status("VmHWM"), io=io_counters())
print(json.dumps(doc))
"""


def preset_path(name: str) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from synthetic_moe import default_path

    return default_path(name)


def evict(path: Path) -> None:
    files = [path] if path.is_file() else [p for p in sorted(path.rglob("*")) if p.is_file()]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_child(mode: str, src: Path, dst: Path, quant: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(src), str(dst), quant],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}) for {src} {mode} {quant}:\n{err}")
    doc: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    doc.update(wall_s=wall, ru_maxrss=usage.ru_maxrss * 1024, user_s=usage.ru_utime,
               sys_s=usage.ru_stime)  # fmt: skip
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="*", type=Path, help="GGUF files, HF dirs or containers")
    ap.add_argument("--preset", action="append", default=[], help="synthetic_moe preset name")
    ap.add_argument("--quant", action="append", default=[], help="--quant values (default keep)")
    ap.add_argument("--out", type=Path, default=DATA_DIR / "convert-rss", help="scratch dir")
    ap.add_argument("--cold", action="store_true", help="evict the source from the page cache")
    ap.add_argument("--keep-output", action="store_true", help="keep the written containers")
    args = ap.parse_args()
    sources = [(p.name, p) for p in args.sources]
    for name in args.preset:
        p = preset_path(name)
        if not p.is_file():
            raise SystemExit(f"{p} is missing: run python benchmarks/synthetic_moe.py {name}")
        sources.append((name, p))
    if not sources:
        raise SystemExit("nothing to convert: give SOURCE paths or --preset NAME")
    quants = args.quant or ["keep"]
    runs: list[dict[str, Any]] = []
    rows: list[list[Any]] = []
    for label, src in sources:
        base = run_child("open", src, args.out / "unused", "keep")
        for quant in quants:
            dst = args.out / f"{src.name}.{quant}.colibri"
            if dst.exists():
                shutil.rmtree(dst)
            if args.cold:
                evict(src)
            r = run_child("convert", src, dst, quant)
            if not args.keep_output:
                shutil.rmtree(dst, ignore_errors=True)
            run = {"source": str(src), "label": label, "quant": quant, "cold": args.cold,
                   "baseline": base, **r}  # fmt: skip
            runs.append(run)
            conv = r["convert_s"]
            rows.append([
                label, quant, f"{r['source_bytes'] / 2**30:.2f}", f"{r['bytes_total'] / 2**30:.2f}",
                f"{base['vm_hwm'] / MIB:.0f}", f"{r['vm_hwm'] / MIB:.0f}",
                f"{(r['vm_hwm'] - base['vm_hwm']) / MIB:.0f}", f"{r['ru_maxrss'] / MIB:.0f}",
                f"{conv:.1f}", f"{r['bytes_total'] / MIB / conv:.0f}",
                f"{r['source_bytes'] / MIB / conv:.0f}",
            ])  # fmt: skip
    print()
    table = print_table(
        ["source", "quant", "in GiB", "out GiB", "baseline MiB", "peak RSS MiB",
         "peak - baseline MiB", "ru_maxrss MiB", "convert s", "out MiB/s", "in MiB/s"],
        rows,
    )  # fmt: skip
    path = write_result("convert-rss", {"cold": args.cold, "runs": runs, "table": table})
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
