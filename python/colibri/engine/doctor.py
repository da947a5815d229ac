"""``colibri doctor``: what this machine offers a streamed model, measured the engine's way.

Streaming experts from SSD is bound by the disk, and how fast the disk serves the engine
depends on things a user rarely knows: whether the file system takes O_DIRECT, whether
transparent huge pages are available (the expert cache's arena is a ``MADV_HUGEPAGE``
mapping, which a virtio disk can serve several times faster than 4 KiB-page buffers:
fewer segments per request), the queue depth the device likes, the readahead the kernel
uses for buffered reads (llama.cpp's mmap path depends on it), the memory limit of the
process's cgroup and the cores the compute team gets.

:func:`probe_system` reads those settings (every input a parameter, so tests run it on
recorded sysfs / cgroup trees; nothing raises for a missing file, it is reported as
unknown). :func:`measure_reads` reads the model's largest file through the engine's own
read path (``_core.io.ReadPool``: the I/O worker pool, O_DIRECT with its buffered
fallback, aligned slabs) at several queue depths, into huge-page slabs as the expert cache
does and into 4 KiB-page slabs, cold (the file's pages are evicted first). The best
huge-page figure is the disk bound it prints: the read path's best over a few bursts of
``bytes_per_row``. The streaming benchmarks measure theirs the same way but over reads as
long as a decode request's, many times through a run, and take the best per-depth median
(benchmarks/_diskbound.py): on a shared or virtual disk a burst can run well above what
the device keeps up (docs/benchmarks.md, "The disk bound").
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidRequestError
from ..hardware import cgroup_memory_headroom, probe_available_memory, probe_performance_cores
from ..sizes import format_bytes

__all__ = [
    "BlockDevice",
    "ReadReport",
    "ReadRow",
    "SystemReport",
    "has_model_data",
    "measure_reads",
    "model_data_file",
    "probe_block_device",
    "probe_system",
]

MIB = 1 << 20
DEFAULT_DEPTHS = (1, 2, 4, 8)
"""Reads in flight measured by default (the I/O worker pool runs one read per worker)."""
MODEL_DATA_SUFFIXES = (".bin", ".gguf", ".safetensors")
"""Files whose bytes the engine reads at run time (a container's experts.bin, GGUF files,
safetensors shards): the doctor measures the largest of them."""


@dataclass(frozen=True)
class BlockDevice:
    """The block device that holds a path, from sysfs (None where unknown)."""

    name: str | None
    """Kernel name of the whole device (``vda``, ``nvme0n1``), partitions resolved to it."""
    read_ahead_kb: int | None
    """Readahead of buffered reads (``queue/read_ahead_kb``)."""
    max_sectors_kb: int | None
    """Largest request the kernel sends (``queue/max_sectors_kb``)."""
    max_segments: int | None
    """Most memory segments per request (``queue/max_segments``): with 4 KiB pages a
    request of max_segments pages is the largest one a buffer can make."""
    rotational: bool | None
    scheduler: str | None
    """The active I/O scheduler (the bracketed entry of ``queue/scheduler``)."""
    note: str = ""
    """Why some fields are unknown (no block device behind the path, unreadable files)."""


@dataclass(frozen=True)
class SystemReport:
    """The settings :func:`probe_system` found."""

    path: str
    filesystem: str | None
    """File system type of the mount holding `path` (``/proc/self/mountinfo``)."""
    mount_source: str | None
    device: BlockDevice
    transparent_hugepages: str | None
    """``always``, ``madvise`` or ``never`` (madvise and always both serve the expert
    cache, which asks with MADV_HUGEPAGE)."""
    thp_defrag: str | None
    available_memory: int | None
    memory_method: str
    cgroup_memory_headroom: int | None
    """Bytes the cgroup may still grow by, None without a limit."""
    cgroup_limit_file: str
    performance_cores: int
    cores_method: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReadRow:
    """One measured configuration of :func:`measure_reads`."""

    in_flight: int
    huge_pages: bool
    gb_per_s: float
    """Bytes read / wall seconds / 1e9, best of the repeats."""
    runs: tuple[float, ...] = field(default=())


@dataclass(frozen=True)
class ReadReport:
    file: str
    file_bytes: int
    block_bytes: int
    bytes_per_row: int
    direct: bool
    """Whether the reads used O_DIRECT (False: the file system refused it and the engine
    fell back to buffered reads, so the page cache and readahead are in play)."""
    rows: tuple[ReadRow, ...]

    def best(self, huge_pages: bool = True) -> ReadRow | None:
        rows = [r for r in self.rows if r.huge_pages == huge_pages]
        return max(rows, key=lambda r: r.gb_per_s) if rows else None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _bracketed(text: str | None) -> str | None:
    """The selected entry of a sysfs choice list: "always [madvise] never" -> "madvise"."""
    if text is None:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text or None


def probe_block_device(
    dev: tuple[int, int], sysfs_root: str | os.PathLike[str] = "/sys"
) -> BlockDevice:
    """The block device with number `dev` (major, minor), partitions resolved to their
    disk. Never raises."""
    sysfs = Path(sysfs_root)
    link = sysfs / "dev" / "block" / f"{dev[0]}:{dev[1]}"
    if not link.exists():
        return BlockDevice(None, None, None, None, None, None,
                           note=f"no block device {dev[0]}:{dev[1]} in sysfs (a virtual or "
                                "network file system: overlay, tmpfs, NFS)")
    d = link.resolve()
    if (d / "partition").exists():
        d = d.parent
    q = d / "queue"
    rot = _read_int(q / "rotational")
    return BlockDevice(
        name=d.name,
        read_ahead_kb=_read_int(q / "read_ahead_kb"),
        max_sectors_kb=_read_int(q / "max_sectors_kb"),
        max_segments=_read_int(q / "max_segments"),
        rotational=None if rot is None else bool(rot),
        scheduler=_bracketed(_read_text(q / "scheduler")),
    )


def _mount_of(path: Path, mountinfo: str | None) -> tuple[str | None, str | None]:
    """(file system type, source) of the mount holding `path`: the longest mount point
    that is a prefix of it in mountinfo."""
    if not mountinfo:
        return None, None
    best: tuple[int, str | None, str | None] = (-1, None, None)
    target = str(path)
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best[0]:
            best = (len(point), tail[0], tail[1])
    return best[1], best[2]


def probe_system(
    path: str | os.PathLike[str],
    *,
    sysfs_root: str | os.PathLike[str] = "/sys",
    proc_root: str | os.PathLike[str] = "/proc",
    cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
    root: str | os.PathLike[str] = "/",
    dev: tuple[int, int] | None = None,
    affinity: Iterable[int] | None = None,
) -> SystemReport:
    """The settings that decide streaming speed for the model at `path` (a file or a
    directory). `dev` overrides the device number and `affinity` the CPUs this process
    may use (tests). Never raises for missing or
    unreadable system files: those fields are None, with a note."""
    p = Path(path).resolve()
    notes: list[str] = []
    if dev is None:
        st = os.stat(p)
        dev = (os.major(st.st_dev), os.minor(st.st_dev))
    device = probe_block_device(dev, sysfs_root)
    fs, source = _mount_of(p, _read_text(Path(proc_root) / "self" / "mountinfo"))
    thp = Path(sysfs_root) / "kernel" / "mm" / "transparent_hugepage"
    enabled = _bracketed(_read_text(thp / "enabled"))
    if enabled is None:
        notes.append("transparent huge pages: not reported by this kernel")
    elif enabled == "never":
        notes.append("transparent huge pages are off: the expert cache's reads use 4 KiB pages "
                     "(echo madvise > /sys/kernel/mm/transparent_hugepage/enabled)")
    mem = probe_available_memory(root)
    headroom, limit_file, _ = cgroup_memory_headroom(cgroup_root, proc_root)
    cores = probe_performance_cores(sysfs_root=sysfs_root, cgroup_root=cgroup_root,
                                    proc_root=proc_root, affinity=affinity)
    return SystemReport(
        path=str(p), filesystem=fs, mount_source=source, device=device,
        transparent_hugepages=enabled, thp_defrag=_bracketed(_read_text(thp / "defrag")),
        available_memory=mem.available, memory_method=mem.method,
        cgroup_memory_headroom=headroom, cgroup_limit_file=limit_file,
        performance_cores=cores.count, cores_method=cores.method, notes=tuple(notes),
    )


def _data_files(directory: Path) -> list[Path]:
    return [f for f in directory.iterdir()
            if f.suffix in MODEL_DATA_SUFFIXES and f.is_file() and not f.is_symlink()]


def has_model_data(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a file, or a directory holding a model data file to measure."""
    p = Path(path)
    return p.is_file() or (p.is_dir() and bool(_data_files(p)))


def model_data_file(path: str | os.PathLike[str]) -> Path:
    """The file the doctor reads: `path` itself, or the largest model data file in the
    directory `path` (not following symlinks out of it)."""
    p = Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        raise InvalidRequestError(f"{p}: no such file or directory")
    files = _data_files(p)
    if not files:
        raise InvalidRequestError(
            f"{p}: no model data file ({', '.join(MODEL_DATA_SUFFIXES)}) to measure; "
            "pass a file, or --no-measure")
    return max(files, key=lambda f: f.stat().st_size)


def _evict(path: Path) -> None:
    """Drops this file's pages from the page cache (no root needed), so buffered
    fallback reads are cold too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure_reads(
    file: str | os.PathLike[str],
    *,
    depths: Sequence[int] = DEFAULT_DEPTHS,
    block_bytes: int = 4 * MIB,
    bytes_per_row: int = 512 * MIB,
    repeats: int = 1,
    seed: int = 0,
) -> ReadReport:
    """Cold reads of `block_bytes` at random aligned offsets of `file` through the
    engine's read pool (O_DIRECT where the file system takes it), `bytes_per_row` per
    configuration (capped at the file's size), at each queue depth, into huge-page and
    into 4 KiB-page slabs; the best of `repeats` per configuration."""
    from .. import _core

    cio = _core.io
    path = Path(file)
    size = path.stat().st_size
    if block_bytes <= 0 or block_bytes % cio.DIRECT_ALIGNMENT:
        raise InvalidRequestError(f"block size {block_bytes} must be a positive multiple of "
                                  f"{cio.DIRECT_ALIGNMENT} bytes")
    if not depths or any(not 1 <= d <= cio.MAX_WORKERS for d in depths):
        raise InvalidRequestError(f"queue depths must be 1..{cio.MAX_WORKERS}, got {list(depths)}")
    if size < block_bytes:
        raise InvalidRequestError(f"{path}: {format_bytes(size)} is smaller than one read "
                                  f"({format_bytes(block_bytes)}); pass a larger file")
    n_blocks = size // block_bytes
    n_reads = max(1, min(n_blocks, bytes_per_row // block_bytes))
    rng = random.Random(seed)
    runs: dict[tuple[int, bool], list[float]] = {}
    direct = True
    for _ in range(repeats):
        for depth in depths:
            for huge in (True, False):
                offsets = [b * block_bytes for b in rng.sample(range(n_blocks), n_reads)]
                _evict(path)
                with cio.ReadPool([str(path)], workers=depth, direct=True) as pool:
                    secs = pool.bench(0, offsets, block_bytes, depth, hugepages=huge)
                    direct = direct and bool(pool.direct_active(0))
                runs.setdefault((depth, huge), []).append(n_reads * block_bytes / secs / 1e9)
    rows = tuple(ReadRow(d, h, max(v), tuple(v)) for (d, h), v in runs.items())
    return ReadReport(str(path), size, block_bytes, n_reads * block_bytes, direct, rows)


def _kib(v: int | None) -> str:
    return "unknown" if v is None else f"{v} KiB"


def system_lines(s: SystemReport) -> list[str]:
    d = s.device
    disk = d.name or "unknown"
    if d.rotational is not None:
        disk += " (rotational)" if d.rotational else " (solid state)"
    if d.scheduler:
        disk += f", scheduler {d.scheduler}"
    mem = format_bytes(s.available_memory) if s.available_memory is not None else "unknown"
    cg = ("none" if s.cgroup_memory_headroom is None
          else f"{format_bytes(s.cgroup_memory_headroom)} left under {s.cgroup_limit_file}")
    lines = [
        f"  path            {s.path}",
        f"  file system     {s.filesystem or 'unknown'} ({s.mount_source or 'unknown source'})",
        f"  disk            {disk}" + (f"; {d.note}" if d.note else ""),
        f"  readahead       {_kib(d.read_ahead_kb)} (buffered reads and mmap; O_DIRECT skips it)",
        f"  largest request {_kib(d.max_sectors_kb)}, {d.max_segments or 'unknown'} segments",
        f"  huge pages      transparent: {s.transparent_hugepages or 'unknown'}"
        f" (defrag: {s.thp_defrag or 'unknown'})",
        f"  memory          {mem} available ({s.memory_method or 'unknown'}); cgroup limit: {cg}",
        f"  compute cores   {s.performance_cores} ({s.cores_method})",
    ]
    lines += [f"  note: {n}" for n in s.notes]
    return lines


def read_lines(r: ReadReport) -> list[str]:
    mode = "O_DIRECT" if r.direct else "buffered (O_DIRECT refused by the file system)"
    lines = [
        f"  reads of {format_bytes(r.block_bytes)} at random offsets of {r.file} "
        f"({format_bytes(r.file_bytes)}), {mode}, cold, {format_bytes(r.bytes_per_row)} per row:",
        "  | reads in flight | GB/s, huge-page buffers | GB/s, 4 KiB pages |",
        "  |---|---|---|",
    ]
    by = {(row.in_flight, row.huge_pages): row.gb_per_s for row in r.rows}
    for depth in sorted({row.in_flight for row in r.rows}):
        lines.append(f"  | {depth} | {by.get((depth, True), float('nan')):.2f} | "
                     f"{by.get((depth, False), float('nan')):.2f} |")
    best = r.best(True)
    if best is not None:
        lines.append(f"  disk bound for streaming: {best.gb_per_s:.2f} GB/s "
                     f"(huge-page buffers, {best.in_flight} in flight)")
    return lines


def report_dict(s: SystemReport, r: ReadReport | None) -> dict[str, Any]:
    out: dict[str, Any] = {"system": asdict(s)}
    if r is not None:
        out["reads"] = asdict(r)
        best = r.best(True)
        out["disk_bound_gb_per_s"] = best.gb_per_s if best else None
    out["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return out
