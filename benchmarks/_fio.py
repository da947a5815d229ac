"""The device bound of a streaming benchmark measured with fio: random O_DIRECT reads of one
expert's size from the very file the run streams, at 1, 2, 4 and 8 reads in flight
(libaio), into huge-page buffers where the machine gives them.

Beside the engine-path bound (_diskbound.py: the project's own reader into the expert
cache's slabs), this says what the *device* does with nothing of colibri in the way, so a
"% of bound" figure can say which bound it is of (issue 39: the engine-path bound was 0.8x
the device on one VM).

Huge pages: ``--iomem=shmhuge`` (SysV shared memory with SHM_HUGETLB) needs
``vm.nr_hugepages``; the benchmark reserves them for the measurement and restores the
count (_diskbound._hugepages). fio's ``mmaphuge`` needs a hugetlbfs mount, which this module
never creates (no mounts left behind). Where huge pages cannot be had, the figures are from
4 KiB-page buffers (``--iomem=malloc``) and the record says so (``buffers``).

fio is installed with ``apt-get install -y fio`` when missing and this process is root
(ensure_fio); otherwise the bound is absent and said to be.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _diskbound as db

FIO_DEPTHS = (1, 2, 4, 8)


def ensure_fio(log: Any = print) -> str | None:
    """fio's path; installs it through apt when missing and root. None if not to be had."""
    exe = shutil.which("fio")
    if exe is not None or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return exe
    log("fio missing: apt-get install -y fio")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    p = subprocess.run(["apt-get", "install", "-y", "fio"], capture_output=True, text=True,
                       env=env, check=False)
    if p.returncode != 0:
        log(f"apt-get install fio failed (rc {p.returncode}): {p.stderr[-300:]}")
    return shutil.which("fio")


def fio_bound(path: str | os.PathLike[str], block: int, depths: Sequence[int] = FIO_DEPTHS,
              repeats: int = 3, size: int = 768 << 20, log: Any = print) -> dict[str, Any]:
    """fio at each depth, `repeats` rounds (depths alternate within a round, so a slow
    minute of a shared disk hits all depths alike), huge-page buffers if they work at all,
    else 4 KiB pages. Returns {"buffers", "per_depth": {d: {"median", "best", "samples"}},
    "best_depth", "bound_gb_s"} (the bound: the best per-depth median), or {"error": why}."""
    if ensure_fio(log) is None:
        return {"error": "fio not installed (and not root, or apt-get failed)"}
    need = -(-block * max(depths) // (2 << 20)) + 8
    samples: dict[int, list[float]] = {d: [] for d in depths}
    with db._hugepages(need):
        buffers = "huge pages (shmhuge)"
        iomem = "shmhuge"
        if db.fio_gbs(path, block, depths[0], iomem, size=64 << 20) is None:
            buffers = "4 KiB pages (malloc): fio could not get huge-page buffers here"
            iomem = "malloc"
        for _ in range(repeats):
            for d in depths:
                g = db.fio_gbs(path, block, d, iomem, size=size)
                if g is not None:
                    samples[d].append(g)
    per = {d: {"median": statistics.median(xs), "best": max(xs), "samples": xs}
           for d, xs in samples.items() if xs}
    if not per:
        return {"error": "fio ran but gave no figure", "buffers": buffers}
    best = max(per, key=lambda d: per[d]["median"])
    out = {"tool": "fio, libaio, O_DIRECT, random reads", "path": str(path),
           "block_bytes": block, "buffers": buffers, "bytes_per_sample": size,
           "per_depth": per, "best_depth": best, "bound_gb_s": per[best]["median"]}
    log(f"fio bound on {Path(path).name}: " + ", ".join(
        f"depth {d} {v['median']:.2f} GB/s" for d, v in per.items())
        + f" (median of {repeats}; {buffers})")
    return out


def label(fio: dict[str, Any] | None) -> str:
    """How a '% of fio bound' column names its bound."""
    if not fio or not fio.get("bound_gb_s"):
        return "fio bound (none)"
    huge = "huge pages" if fio["buffers"].startswith("huge") else "4 KiB pages"
    return f"fio device bound, depth {fio['best_depth']}, {huge}"
