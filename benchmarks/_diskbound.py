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
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _iotrace

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
                    total: int = 768 << 20, seed: int = 0, hugepages: bool = True,
                    slabs: int = 0) -> float:  # fmt: skip
    """GB/s of cold reads of ``block`` bytes through the engine's read pool (``depth``
    workers, ``depth`` reads outstanding, O_DIRECT, huge-page slabs: ``slabs`` of them used
    in turn, at least ``depth``; 0: ``depth``)."""
    return engine_read(path, block, depth, total, seed, hugepages, slabs)[0]


def engine_read(path: str | os.PathLike[str], block: int, depth: int,
                total: int = 768 << 20, seed: int = 0, hugepages: bool = True,
                slabs: int = 0) -> tuple[float, dict[str, Any] | None]:  # fmt: skip
    """engine_read_gbs() and the summary of the pool's read trace (_iotrace.summarize;
    None with a core built before ReadPool.trace)."""
    from colibri import _core

    cio = _core.io
    block = -(-block // cio.DIRECT_ALIGNMENT) * cio.DIRECT_ALIGNMENT
    offsets = slot_offsets(os.path.getsize(path), block, max(depth, total // block), seed)
    evict(path)
    with cio.ReadPool([str(path)], workers=depth, direct=True) as pool:
        traced = hasattr(pool, "start_trace")
        if traced:
            pool.start_trace(len(offsets))
        try:  # `depth` reads outstanding, landing in `slabs` slabs in turn (0: `depth`)
            secs = float(pool.bench(0, offsets, block, depth, hugepages=hugepages, slabs=slabs))
        except TypeError:  # a core before session 27: `slabs` outstanding, the cap at depth
            if slabs > depth:
                pool.max_in_flight = depth
            secs = float(pool.bench(0, offsets, block, max(depth, slabs), hugepages=hugepages))
        summary = _iotrace.summarize(pool.trace(), workers=depth) if traced else None
    return len(offsets) * block / secs / 1e9, summary


SUSTAINED_DEPTHS = (1, 2, 4)


@dataclass
class DiskBound:
    """Every sample of the engine's read path in a run, and the bound they give.

    A sample is a **burst** at each of ``depths`` (``total`` bytes each: 256 MiB is about
    0.15 s on a 1.7 GB/s disk) and, when ``sustained_total`` > 0, a **sustained** read at
    each of ``sustained_depths`` (``sustained_total`` bytes each, sized like the bytes one
    decode request reads: a 16-token moe-8g request reads about 6 GB in 3-4 s).

    **The bound** (``bound_gbs``) is the best per-depth median of the sustained samples:
    at the queue depth where this read path does best, what the disk kept up for as long
    as a decode request reads, in the typical sample of the run. The decode it is compared
    with is itself the median of children spread over the same run, so both sides are the
    same statistic over the same period; a maximum over samples would compare a typical
    decode with the disk's luckiest stretch, and would grow with the number of samples
    taken. It is a yardstick of what the disk typically keeps up, not a ceiling: a child
    that runs in a fast stretch can exceed it. Without sustained samples the bound is the
    best burst (the definition before 2026-12-02). ``figures`` reports all four: best and
    median, sustained and burst (docs/benchmarks.md, "The disk bound").
    """

    path: str
    block: int
    depths: tuple[int, ...] = DEPTHS
    total: int = 768 << 20
    sustained_total: int = 0
    sustained_depths: tuple[int, ...] = SUSTAINED_DEPTHS
    # Destination slabs the reads land in, used in turn (0: one per read in flight). A
    # decode reads into the expert cache's hundreds of slots, and a virtio disk can be
    # slower into many distinct pages than into a few reused ones (docs/benchmarks.md,
    # session 26: 7-25% here), so bench_streaming.py reads into as many slabs as the cache
    # under test has slots (--bound-slabs auto, its default since session 27).
    slabs: int = 0
    samples: list[dict[str, Any]] = field(default_factory=list)

    def sample(self, label: str, depths: Sequence[int] | None = None) -> float:
        """Measure now: bursts at each depth (or the given ones), then the sustained reads
        (when enabled); returns the best GB/s of this sample's bursts."""
        best = 0.0
        for d in depths or self.depths:
            best = max(best, self._measure(label, d, self.total, "burst"))
        if self.sustained_total > 0:
            for d in self.sustained_depths:
                self._measure(label, d, self.sustained_total, "sustained")
        return best

    def _measure(self, label: str, depth: int, total: int, kind: str) -> float:
        gbs, trace = engine_read(self.path, self.block, depth, total, seed=len(self.samples),
                                 slabs=self.slabs)
        self.samples.append({"label": label, "depth": depth, "gb_s": gbs, "kind": kind,
                             "bytes": total, "io_trace": trace})
        return gbs

    def _of(self, kind: str) -> list[dict[str, Any]]:
        # samples written before the kinds existed are bursts
        return [s for s in self.samples if s.get("kind", "burst") == kind]

    @property
    def burst_best_gbs(self) -> float | None:
        return max((s["gb_s"] for s in self._of("burst")), default=None)

    @property
    def sustained_best_gbs(self) -> float | None:
        return max((s["gb_s"] for s in self._of("sustained")), default=None)

    @property
    def sustained_median_gbs(self) -> float | None:
        """The best per-depth median of the sustained samples."""
        return max((x["median"] for x in self.curve("sustained").values()), default=None)

    @property
    def bound_gbs(self) -> float | None:
        """The best per-depth median of the sustained samples; the best burst without any."""
        sus = self.sustained_median_gbs
        return sus if sus is not None else self.burst_best_gbs

    def curve(self, kind: str = "burst") -> dict[int, dict[str, float]]:
        """Per queue depth: best, median and worst GB/s over the samples of ``kind``."""
        out: dict[int, dict[str, float]] = {}
        samples = self._of(kind)
        for d in sorted({s["depth"] for s in samples}):
            v = sorted(s["gb_s"] for s in samples if s["depth"] == d)
            out[d] = {"best": v[-1], "median": float(statistics.median(v)), "worst": v[0],
                      "n": len(v)}
        return out

    def figures(self) -> dict[str, float | None]:
        """The candidate yardsticks, GB/s: best and best per-depth median, of the sustained
        samples and of the bursts (None where a kind has no samples)."""
        def best_median(kind: str) -> float | None:
            c = self.curve(kind)
            return max((x["median"] for x in c.values()), default=None)

        return {"sustained_best": self.sustained_best_gbs,
                "sustained_median": self.sustained_median_gbs,
                "burst_best": self.burst_best_gbs, "burst_median": best_median("burst")}

    def to_dict(self) -> dict[str, Any]:
        return {"method": "colibri._core.io.ReadPool.bench(hugepages=True), O_DIRECT, "
                          "cold, random slot-aligned reads of one expert slot",
                "definition": "best per-depth median of the sustained samples"
                              if self._of("sustained") else "best burst sample",
                "destination_slabs": self.slabs or "one per read in flight",
                "path": self.path, "block_bytes": self.block, "bytes_per_sample": self.total,
                "sustained_bytes_per_sample": self.sustained_total,
                "bound_gb_s": self.bound_gbs, "figures": self.figures(),
                "curve": self.curve(), "curve_sustained": self.curve("sustained"),
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
