"""The disk bound of a streaming benchmark, measured the way the engine reads.

colibri reads experts with O_DIRECT into a ``MADV_HUGEPAGE`` arena through its own read
pool, and a virtio disk serves reads into huge-page buffers several times faster than into
4 KiB pages (fewer, larger segments per request: docs/benchmarks.md, "The disk bound").
So the bound is measured with the engine's own path, ``_core.io.ReadPool.bench(...,
hugepages=True)`` (preallocated, pre-faulted huge-page slabs, the C++ reader, the pool's
workers), in reads of one expert slot at random slot-aligned offsets of the file the run
streams, at several queue depths; sampled before the first child and after every child.
**The bound is the best sustained figure** of all those samples (each one reads
``total`` bytes cold: its pages are evicted first): a disk never goes faster than it did,
but a shared VM's disk often goes slower for a while.

``fio`` (if installed) is recorded beside it, with 4 KiB-page buffers (``--iomem=malloc``)
and with huge pages (``--iomem=shmhuge``, which needs ``vm.nr_hugepages``), never used as
the bound.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEPTHS = (1, 2, 4, 8, 16)


def evict(path: str | os.PathLike[str]) -> None:
    """Drop the file's pages from the page cache (buffered fallbacks stay cold)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def slot_offsets(file_size: int, block: int, count: int, seed: int) -> list[int]:
    """``count`` distinct offsets, multiples of ``block`` (4 KiB-aligned: a slot length is),
    each with a whole block inside the file."""
    n = file_size // block
    if n < 1:
        raise ValueError(f"file of {file_size} bytes is smaller than one read of {block}")
    rng = random.Random(seed)
    return [b * block for b in rng.sample(range(n), min(n, count))]


def engine_read_gbs(path: str | os.PathLike[str], block: int, depth: int,
                    total: int = 768 << 20, seed: int = 0, hugepages: bool = True
                    ) -> float:  # fmt: skip
    """GB/s of cold reads of ``block`` bytes through the engine's read pool (``depth``
    workers, ``depth`` reads in flight, O_DIRECT, huge-page slabs)."""
    from colibri import _core

    cio = _core.io
    block = -(-block // cio.DIRECT_ALIGNMENT) * cio.DIRECT_ALIGNMENT
    offsets = slot_offsets(os.path.getsize(path), block, max(depth, total // block), seed)
    evict(path)
    with cio.ReadPool([str(path)], workers=depth, direct=True) as pool:
        secs = float(pool.bench(0, offsets, block, depth, hugepages=hugepages))
    return len(offsets) * block / secs / 1e9


@dataclass
class DiskBound:
    """Every sample of the engine's read path in a run; the bound is the best of them."""

    path: str
    block: int
    depths: tuple[int, ...] = DEPTHS
    total: int = 768 << 20
    samples: list[dict[str, Any]] = field(default_factory=list)

    def sample(self, label: str, depths: Sequence[int] | None = None) -> float:
        """Measure now at each depth (or the given ones); returns this sample's best GB/s."""
        best = 0.0
        for d in depths or self.depths:
            gbs = engine_read_gbs(self.path, self.block, d, self.total, seed=len(self.samples))
            self.samples.append({"label": label, "depth": d, "gb_s": gbs})
            best = max(best, gbs)
        return best

    @property
    def bound_gbs(self) -> float | None:
        return max((s["gb_s"] for s in self.samples), default=None)

    def curve(self) -> dict[int, dict[str, float]]:
        """Per queue depth: best, median and worst GB/s over the samples."""
        out: dict[int, dict[str, float]] = {}
        for d in sorted({s["depth"] for s in self.samples}):
            v = sorted(s["gb_s"] for s in self.samples if s["depth"] == d)
            out[d] = {"best": v[-1], "median": v[len(v) // 2], "worst": v[0], "n": len(v)}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"method": "colibri._core.io.ReadPool.bench(hugepages=True), O_DIRECT, "
                          "cold, random slot-aligned reads of one expert slot",
                "path": self.path, "block_bytes": self.block, "bytes_per_sample": self.total,
                "bound_gb_s": self.bound_gbs, "curve": self.curve(),
                "samples": self.samples}  # fmt: skip


def fio_gbs(path: str | os.PathLike[str], block: int, depth: int, iomem: str,
            size: int = 768 << 20, timeout: float = 120.0) -> float | None:
    """fio's read bandwidth (GB/s) for random O_DIRECT reads of ``block`` bytes at
    ``depth`` in flight (libaio), buffers from ``iomem`` (malloc: 4 KiB pages;
    shmhuge: huge pages). None when fio is missing or fails (e.g. no huge pages)."""
    exe = shutil.which("fio")
    if exe is None:
        return None
    evict(path)
    cmd = [exe, "--name=bound", f"--filename={path}", "--readonly", "--rw=randread",
           f"--bs={block}", "--direct=1", "--ioengine=libaio", f"--iodepth={depth}",
           f"--iomem={iomem}", f"--io_size={size}", "--output-format=json"]  # fmt: skip
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        job = json.loads(p.stdout)["jobs"][0]["read"]
        return float(job["bw_bytes"]) / 1e9 if p.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError, KeyError, IndexError):
        return None


def fio_table(path: str | os.PathLike[str], block: int, depths: Sequence[int] = (1, 4, 8)
              ) -> list[dict[str, Any]]:  # fmt: skip
    """fio at each depth, 4 KiB-page and huge-page buffers (records; empty without fio).
    Huge pages for shmhuge are reserved for the measurement and the old count restored."""
    if shutil.which("fio") is None:
        return []
    rows = []
    need = -(-block * max(depths) // (2 << 20)) + 8
    with _hugepages(need):
        for d in depths:
            rows.append({"depth": d, "block_bytes": block,
                         "gb_s_4k_pages": fio_gbs(path, block, d, "malloc"),
                         "gb_s_huge_pages": fio_gbs(path, block, d, "shmhuge")})  # fmt: skip
    return rows


class _hugepages:
    """Raise vm.nr_hugepages to at least ``n`` for a block (root only), then restore it."""

    PATH = Path("/proc/sys/vm/nr_hugepages")

    def __init__(self, n: int) -> None:
        self.n = n
        self.old: str | None = None

    def __enter__(self) -> _hugepages:
        try:
            self.old = self.PATH.read_text().strip()
            if int(self.old) < self.n:
                self.PATH.write_text(str(self.n))
        except OSError:
            self.old = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.old is not None:
            try:
                self.PATH.write_text(self.old)
            except OSError:
                pass


def block_device(path: str | os.PathLike[str]) -> Path | None:
    """/sys/block/<disk> holding ``path`` (the whole disk for a partition), or None."""
    st = os.stat(path)
    dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    try:
        real = dev.resolve(strict=True)
    except OSError:
        return None
    disk = real.parent if (real / "partition").exists() else real
    return Path("/sys/block") / disk.name if (disk / "queue").is_dir() else None


def read_ahead_kb(path: str | os.PathLike[str]) -> int | None:
    dev = block_device(path)
    try:
        return int((dev / "queue" / "read_ahead_kb").read_text()) if dev else None
    except (OSError, ValueError):
        return None


class readahead:
    """Set the disk's ``read_ahead_kb`` for a block (root), always restoring the old
    value, on error too. ``kb`` None leaves it alone."""

    def __init__(self, path: str | os.PathLike[str], kb: int | None,
                 file: Path | None = None) -> None:  # fmt: skip
        dev = block_device(path) if file is None else None
        self.file = file or (dev / "queue" / "read_ahead_kb" if dev else None)
        self.kb = kb
        self.old: str | None = None

    def __enter__(self) -> readahead:
        if self.kb is not None and self.file is not None:
            self.old = self.file.read_text().strip()
            self.file.write_text(str(self.kb))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.old is not None and self.file is not None:
            self.file.write_text(self.old)
