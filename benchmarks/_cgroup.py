"""Honest streaming measurements: memory cgroups, dropping the page cache, disk bandwidth.

A model only streams if it does not sit in the page cache, so a streaming benchmark runs
each measurement in a fresh subprocess inside a memory cgroup (its RSS and its page cache
are capped together) after dropping the page cache (docs/benchmarks.md, "Streaming under
a RAM budget vs llama.cpp"). Everything here needs root except the pure helpers.

* :class:`MemoryCgroup` creates a child memory cgroup with a limit, runs a command in it
  (:meth:`MemoryCgroup.run`), reports its peak memory and OOM kills, and removes it.
  cgroup v2 (``memory.max``, ``memory.swap.max = 0``, ``memory.peak``) and cgroup v1
  (``memory.limit_in_bytes``, ``memory.memsw.limit_in_bytes``, ``memory.max_usage_in_bytes``)
  are both supported. The child is created under this process's own memory cgroup, so the
  limits of whatever contains this process still apply.
* :func:`drop_caches` syncs and writes 3 to ``/proc/sys/vm/drop_caches``.
* :func:`disk_bandwidth` reads chunks of a file at random aligned offsets with O_DIRECT
  (into page-aligned mmap buffers; no C helper), from ``qd`` threads at once, and returns
  bytes per second.

    with MemoryCgroup("colibri-bench", limit_bytes=2 << 30) as cg:
        proc = cg.run([sys.executable, "child.py"], timeout=600)
        print(cg.peak_bytes(), cg.oom_kills())
"""

from __future__ import annotations

import mmap
import os
import random
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
DROP_CACHES = Path("/proc/sys/vm/drop_caches")

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}


def parse_size(text: str | int) -> int:
    """Bytes from ``"2GiB"``, ``"512 MiB"``, ``"1.5GB"``, ``"4096"`` or an int."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 2GiB, 512MiB, 1.5GB or bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def fmt_bytes(n: float) -> str:
    """``2.21 GiB``, ``512 MiB``, ``37 KiB``, ``12 B``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n:.0f} B"


# --------------------------------------------------------------------------- where

@dataclass(frozen=True)
class CgroupLayout:
    """Where memory cgroups live on this machine."""

    version: int  # 1 or 2
    parent: Path  # directory under which a child cgroup is created

    # File names per version: limit, swap limit, peak, usage, event counters.
    @property
    def limit_file(self) -> str:
        return "memory.max" if self.version == 2 else "memory.limit_in_bytes"

    @property
    def swap_file(self) -> str:
        return "memory.swap.max" if self.version == 2 else "memory.memsw.limit_in_bytes"

    @property
    def peak_file(self) -> str:
        return "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"

    @property
    def usage_file(self) -> str:
        return "memory.current" if self.version == 2 else "memory.usage_in_bytes"


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/<pid>/cgroup`` as {controller: path}; the v2 entry (``0::/path``) is keyed
    ``""``; a v1 line naming several controllers (``4:cpu,cpuacct:/x``) gives each."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def mount_points(mounts_text: str) -> dict[str, Path]:
    """From ``/proc/self/mounts``: {"cgroup2": path} and {v1 controller: path}."""
    out: dict[str, Path] = {}
    for line in mounts_text.splitlines():
        f = line.split()
        if len(f) < 4:
            continue
        if f[2] == "cgroup2":
            out.setdefault("cgroup2", Path(f[1]))
        elif f[2] == "cgroup":
            for opt in f[3].split(","):
                out.setdefault(opt, Path(f[1]))
    return out


def find_layout(proc_cgroup: str | None = None, mounts: str | None = None) -> CgroupLayout:
    """Where to create a memory cgroup: under this process's own memory cgroup, on the v1
    memory hierarchy when one is mounted (it then owns the memory controller), else on v2.
    Raises RuntimeError when neither is usable."""
    if proc_cgroup is None:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    if mounts is None:
        mounts = Path("/proc/self/mounts").read_text()
    own = parse_proc_cgroup(proc_cgroup)
    mp = mount_points(mounts)
    if "memory" in mp and "memory" in own:
        return CgroupLayout(1, mp["memory"] / own["memory"].lstrip("/"))
    if "cgroup2" in mp and "" in own:
        base = mp["cgroup2"]
        ctrl = base / "cgroup.controllers"
        if ctrl.exists() and "memory" in ctrl.read_text().split():
            return CgroupLayout(2, base / own[""].lstrip("/"))
    raise RuntimeError("no memory cgroup controller found (need cgroup v1 memory or v2)")


# --------------------------------------------------------------------------- the cgroup

class MemoryCgroup:
    """A child memory cgroup with ``limit_bytes`` (swap off), removed on exit.

    On cgroup v2 the memory controller must be enabled in the parent's
    ``cgroup.subtree_control``, which the kernel refuses for a non-root cgroup that holds
    processes ("no internal processes"): run the benchmark from a cgroup of its own there.
    """

    def __init__(self, name: str, limit_bytes: int, layout: CgroupLayout | None = None) -> None:
        self.layout = layout or find_layout()
        self.limit_bytes = int(limit_bytes)
        self.path = self.layout.parent / f"{name}-{os.getpid()}-{time.monotonic_ns() % 10**9}"

    def __enter__(self) -> MemoryCgroup:
        self.create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _write(self, name: str, value: str | int) -> None:
        (self.path / name).write_text(str(value))

    def _read(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text()
        except OSError:
            return None

    def create(self) -> None:
        if self.layout.version == 2:
            sub = self.layout.parent / "cgroup.subtree_control"
            if "memory" not in sub.read_text().split():
                sub.write_text("+memory")
        self.path.mkdir()
        try:
            self._write(self.layout.limit_file, self.limit_bytes)
            if self.layout.version == 1:
                # memsw must be >= limit; no swap on most benchmark hosts, but cap it anyway
                # when the kernel accounts swap (the file exists only with swapaccount=1).
                if (self.path / self.layout.swap_file).exists():
                    self._write(self.layout.swap_file, self.limit_bytes)
                if (self.path / "memory.swappiness").exists():
                    self._write("memory.swappiness", 0)
            elif (self.path / self.layout.swap_file).exists():
                self._write(self.layout.swap_file, 0)
        except OSError:
            self.remove()
            raise

    def add_pid(self, pid: int) -> None:
        self._write("cgroup.procs", pid)

    def run(
        self, cmd: Sequence[str], *, timeout: float | None = None,
        env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
        stderr: Any = None,
    ) -> subprocess.CompletedProcess[str]:
        """Runs `cmd` inside the cgroup (it joins before exec, so all its memory counts),
        capturing stdout as text; stderr goes where `stderr` says (default: inherited)."""
        procs = str(self.path / "cgroup.procs")

        def join() -> None:  # runs in the child between fork and exec
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # "0" means the writing process itself
            finally:
                os.close(fd)

        return subprocess.run(
            list(cmd), stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=timeout,
            env=env, cwd=cwd, preexec_fn=join, check=False,
        )

    def peak_bytes(self) -> int | None:
        """Highest memory charge (RSS + page cache) seen, if the kernel reports it."""
        v = self._read(self.layout.peak_file)
        return int(v) if v and v.strip().isdigit() else None

    def usage_bytes(self) -> int | None:
        v = self._read(self.layout.usage_file)
        return int(v) if v and v.strip().isdigit() else None

    def oom_kills(self) -> int:
        """Processes of this cgroup the OOM killer killed."""
        name = "memory.events" if self.layout.version == 2 else "memory.oom_control"
        text = self._read(name) or ""
        return parse_kv(text).get("oom_kill", 0)

    def remove(self) -> None:
        """Removes the cgroup (its processes must be gone; retried briefly)."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        self.path.rmdir()


def parse_kv(text: str) -> dict[str, int]:
    """``key value`` lines (memory.events, memory.oom_control, memory.stat) as ints."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 2 and f[1].lstrip("-").isdigit():
            out[f[0]] = int(f[1])
    return out


def drop_caches() -> bool:
    """``sync; echo 3 > /proc/sys/vm/drop_caches``. False when not permitted (not root)."""
    os.sync()
    try:
        DROP_CACHES.write_text("3")
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------- disk

def random_offsets(file_size: int, chunk: int, count: int, align: int = 4096,
                   seed: int = 0) -> list[int]:
    """`count` distinct aligned offsets where a `chunk`-byte read fits inside the file, in
    a shuffled order (the file is cut into chunk-sized slots; repeats only when the file
    holds fewer than `count` slots)."""
    if chunk <= 0 or chunk % align or align <= 0:
        raise ValueError(f"chunk {chunk} must be a positive multiple of {align}")
    slots = file_size // chunk
    if slots <= 0:
        raise ValueError(f"file of {file_size} bytes is smaller than one chunk of {chunk}")
    rng = random.Random(seed)
    picks: list[int] = []
    while len(picks) < count:
        order = list(range(slots))
        rng.shuffle(order)
        picks.extend(order[: count - len(picks)])
    return [i * chunk for i in picks]


@dataclass(frozen=True)
class DiskResult:
    path: str
    chunk_bytes: int
    qd: int
    bytes_read: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_read / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "chunk_bytes": self.chunk_bytes, "qd": self.qd,
                "bytes_read": self.bytes_read, "seconds": self.seconds,
                "gb_s": self.bytes_per_s / 1e9}


def disk_bandwidth(path: str | os.PathLike[str], chunk: int = 4 << 20, total: int = 1 << 30,
                   qd: int = 1, seed: int = 0, offset: int = 0,
                   length: int | None = None) -> DiskResult:
    """O_DIRECT reads of `chunk` bytes at random aligned offsets within
    ``[offset, offset + length)`` of `path`, about `total` bytes in all, `qd` reads in
    flight (one thread each; ``os.preadv`` releases the GIL). Bypasses the page cache, so
    it measures the device whether or not the file is cached."""
    size = os.path.getsize(path)
    length = size - offset if length is None else min(length, size - offset)
    count = max(qd, total // chunk)
    offsets = [offset + o for o in random_offsets(length, chunk, count, seed=seed)]
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    try:
        bufs = [mmap.mmap(-1, chunk) for _ in range(qd)]  # page-aligned, as O_DIRECT needs
        lock = threading.Lock()
        nxt = [0]
        done = [0]
        errors: list[BaseException] = []

        def worker(buf: mmap.mmap) -> None:
            try:
                while True:
                    with lock:
                        i = nxt[0]
                        nxt[0] += 1
                    if i >= len(offsets):
                        return
                    n = os.preadv(fd, [buf], offsets[i])
                    with lock:
                        done[0] += n
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(b,)) for b in bufs]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        for b in bufs:
            b.close()
        if errors:
            raise errors[0]
    finally:
        os.close(fd)
    return DiskResult(str(path), chunk, qd, done[0], dt)


def decode_bound(disk_bytes_per_s: float, bytes_read_per_token: float) -> float:
    """Disk-bound upper limit on decode tokens per second: bandwidth / bytes per token
    (inf when a token reads nothing)."""
    if bytes_read_per_token <= 0:
        return float("inf")
    return disk_bytes_per_s / bytes_read_per_token


def proc_status_bytes(field: str, pid: int | str = "self") -> int | None:
    """A ``kB`` field of /proc/<pid>/status (VmHWM, VmRSS, RssAnon, RssFile) in bytes."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def parse_diskstats(text: str, major: int, minor: int) -> tuple[int, int] | None:
    """(bytes read, milliseconds the device was busy) of device `major:minor` from
    /proc/diskstats text (sectors are 512 bytes there, whatever the device's own size)."""
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 13 and f[0] == str(major) and f[1] == str(minor):
            return int(f[5]) * 512, int(f[12])
    return None


def parse_diskstats_reads(text: str, major: int, minor: int) -> tuple[int, int] | None:
    """(reads completed, milliseconds spent by reads) of device `major:minor` from
    /proc/diskstats text (fields 4 and 7)."""
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 7 and f[0] == str(major) and f[1] == str(minor):
            return int(f[3]), int(f[6])
    return None


def device_queue(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """parse_diskstats_reads() so far of the block device holding `path`: the deltas give
    each read request's latency and, divided by the time, the read requests in flight on
    average (Little's law)."""
    try:
        dev = os.stat(path).st_dev
        return parse_diskstats_reads(Path("/proc/diskstats").read_text(), os.major(dev),
                                     os.minor(dev))
    except (OSError, ValueError):
        return None


def device_counters(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """Bytes read and busy milliseconds so far of the block device holding `path` (all
    processes, not only this one), or None where /proc/diskstats does not list it."""
    try:
        dev = os.stat(path).st_dev
        return parse_diskstats(Path("/proc/diskstats").read_text(), os.major(dev),
                               os.minor(dev))
    except OSError:
        return None

