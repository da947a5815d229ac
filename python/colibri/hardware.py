"""Hardware probes for the resource plan.

:func:`available_memory` answers "how many bytes of RAM may this process take": the
kernel's estimate of memory available without swapping, capped by the memory limit of the
process's cgroup. It is the default RAM budget's starting point (:mod:`colibri.engine.budget`).

:func:`performance_cores` answers "how many compute threads should the team have": the
performance cores this process may actually use. Each SMT sibling pair counts once (two
hyper-threads share one core's execution units, so a second thread per core only adds
contention to a bandwidth-bound matmul) and efficiency cores are left out (with a barrier
per parallel region the slowest member paces the team; see docs/tuning.md).

Every probe takes its inputs as parameters (a sysfs root, a cgroup root, a sysctl
function, an affinity set) so tests run it on recorded trees. No probe raises: a missing
or unreadable file makes it fall back to the next source, and the reason is recorded in
:attr:`CoreCount.notes`. Nothing is read at import time and no environment variable is
consulted.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

__all__ = [
    "AvailableMemory",
    "CoreCount",
    "available_memory",
    "cgroup_cpu_limit",
    "cgroup_memory_headroom",
    "parse_cpu_list",
    "performance_cores",
    "probe_available_memory",
    "probe_performance_cores",
]

log = logging.getLogger(__name__)

Sysctl = Callable[[str], str | None]
"""Returns the value of a sysctl name as text (like ``sysctl -n NAME``), or None if absent."""


@dataclass(frozen=True)
class CoreCount:
    """The result of the performance-core probe."""

    count: int
    """Performance cores this process may use, >= 1."""
    method: str
    """The source that decided the count, e.g. ``"sysfs topology"`` or
    ``"sysctl hw.perflevel0.logicalcpu"``."""
    notes: tuple[str, ...] = ()
    """Every fallback taken and limit applied, with its reason, in order."""


def performance_cores() -> int:
    """The number of performance cores this process may use (the default team size)."""
    return probe_performance_cores().count


def probe_performance_cores(
    *,
    platform: str | None = None,
    sysfs_root: str | os.PathLike[str] = "/sys",
    cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
    proc_root: str | os.PathLike[str] = "/proc",
    affinity: Iterable[int] | None = None,
    sysctl: Sysctl | None = None,
    cpu_count: int | None = None,
) -> CoreCount:
    """Counts the performance cores this process may use; never raises.

    platform: a ``sys.platform`` value (default: this one).
    sysfs_root, cgroup_root, proc_root: where /sys, /sys/fs/cgroup and /proc are (Linux).
    affinity: the logical CPUs this process may run on (default: ``os.sched_getaffinity``).
    sysctl: reads a sysctl by name (macOS; default: runs ``sysctl -n``).
    cpu_count: the last-resort logical CPU count (default: ``os.cpu_count()``).
    """
    plat = sys.platform if platform is None else platform
    notes: list[str] = []
    fallback = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    try:
        if plat.startswith("linux"):
            count, method = _linux(Path(sysfs_root), Path(cgroup_root), Path(proc_root),
                                   affinity, fallback, notes)
        elif plat == "darwin":
            count, method = _darwin(sysctl or _run_sysctl, fallback, notes)
        else:
            notes.append(f"no core-topology probe for platform {plat!r}; "
                         "using the logical CPU count (SMT siblings may count twice)")
            count, method = fallback, "os.cpu_count"
    except Exception as e:  # a probe bug must not stop a model from loading
        notes.append(f"core probe failed ({type(e).__name__}: {e}); using the logical CPU count")
        count, method = fallback, "os.cpu_count"
    result = CoreCount(max(1, count), method, tuple(notes))
    for note in result.notes:
        log.debug("performance_cores: %s", note)
    return result


# --- Linux ----------------------------------------------------------------------------------


def parse_cpu_list(text: str) -> set[int]:
    """Parses a kernel CPU list such as ``"0-3,8,10-11"``; raises ValueError if malformed."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return cpus


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _linux(sysfs: Path, cgroup_root: Path, proc: Path, affinity: Iterable[int] | None,
           fallback: int, notes: list[str]) -> tuple[int, str]:
    allowed: set[int] | None
    if affinity is not None:
        allowed = set(affinity)
    elif hasattr(os, "sched_getaffinity"):
        allowed = set(os.sched_getaffinity(0))
    else:
        allowed = None

    count, method = _sysfs_cores(sysfs, allowed, notes)
    if count is None:
        count = len(allowed) if allowed else fallback
        method = "affinity mask" if allowed else "os.cpu_count"
        notes.append("counting logical CPUs (SMT siblings may count twice)")

    limit, where = cgroup_cpu_limit(cgroup_root, proc)
    if limit is not None:
        cap = max(1, math.ceil(limit - 1e-9))  # 1.5 CPUs of quota -> 2 threads
        if cap < count:
            notes.append(
                f"cgroup CPU quota of {limit:g} CPUs ({where}) caps {count} cores to {cap}"
            )
            count = cap
    return count, method


def _sysfs_cores(sysfs: Path, allowed: set[int] | None,
                 notes: list[str]) -> tuple[int | None, str]:
    """Physical performance cores among the allowed CPUs, from sysfs; None if unreadable."""
    cpu_dir = sysfs / "devices" / "system" / "cpu"
    online_text = _read(cpu_dir / "online")
    try:
        cpus = parse_cpu_list(online_text) if online_text else set()
    except ValueError:
        cpus = set()
    if not cpus:
        try:
            cpus = {int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*") if p.name[3:].isdigit()}
        except OSError:
            cpus = set()
    if not cpus:
        notes.append(f"no CPUs listed under {cpu_dir}")
        return None, ""
    if allowed is not None:
        if cpus & allowed:
            cpus &= allowed
        else:
            notes.append("affinity mask shares no CPU with sysfs; ignoring the mask")

    # Hybrid Intel (Alder Lake and later): the kernel lists P-core and E-core CPUs under
    # separate PMU devices. Keep the P-cores unless the mask allows only E-cores.
    p_text = _read(sysfs / "devices" / "cpu_core" / "cpus")
    if p_text is not None:
        try:
            p_cpus = parse_cpu_list(p_text)
        except ValueError:
            p_cpus = set()
            notes.append(f"unreadable P-core list {p_text!r}; not filtering E-cores")
        if p_cpus & cpus:
            dropped = len(cpus - p_cpus)
            if dropped:
                notes.append(f"hybrid CPU: {dropped} efficiency-core CPUs left out")
            cpus &= p_cpus
        elif p_cpus:
            notes.append("hybrid CPU, but only efficiency cores are allowed; counting them")

    # Group logical CPUs into physical cores. The sibling list names exactly the CPUs of
    # one core; (package, die, core_id) is the older equivalent. Keys of both kinds never
    # match each other, so one kind is used for every CPU: siblings if all CPUs have a
    # readable list, else ids if all have one, else each logical CPU counts as a core.
    topo = {cpu: cpu_dir / f"cpu{cpu}" / "topology" for cpu in cpus}
    siblings = {cpu: _siblings_key(t) for cpu, t in topo.items()}
    if all(k is not None for k in siblings.values()):
        return len(set(siblings.values())), "sysfs topology"
    ids = {cpu: _core_id_key(t) for cpu, t in topo.items()}
    if all(k is not None for k in ids.values()):
        return len(set(ids.values())), "sysfs topology"
    missing = sum(1 for cpu in cpus if siblings[cpu] is None and ids[cpu] is None)
    notes.append(f"no usable core topology for {missing} of {len(cpus)} CPUs")
    return None, ""


def _siblings_key(topo: Path) -> frozenset[int] | None:
    """The logical CPUs of this CPU's physical core, from its sibling list."""
    for name in ("core_cpus_list", "thread_siblings_list"):
        text = _read(topo / name)
        if text:
            try:
                return frozenset(parse_cpu_list(text))
            except ValueError:
                pass
    return None


def _own_cgroup(proc: Path, controller: str) -> tuple[str, str]:
    """This process's cgroup paths from /proc/self/cgroup: the v2 (unified) one and the
    v1 one of `controller` ("/" when absent)."""
    v2_path, v1_path = "/", "/"
    for line in (_read(proc / "self" / "cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif controller in parts[1].split(","):
            v1_path = parts[2]
    return v2_path, v1_path


def _core_id_key(topo: Path) -> tuple[str | None, str | None, str] | None:
    core = _read(topo / "core_id")
    if not core:
        return None
    # core_id is unique only within a die of a package.
    return (_read(topo / "physical_package_id"), _read(topo / "die_id"), core)


def cgroup_cpu_limit(cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
                     proc_root: str | os.PathLike[str] = "/proc") -> tuple[float | None, str]:
    """The CPU quota of this process's cgroup in CPUs (e.g. 1.5), or None if unlimited.

    Looks at cgroup v2 ``cpu.max`` and v1 ``cpu.cfs_quota_us / cpu.cfs_period_us`` in the
    process's own cgroup and its ancestors (the tightest one wins). Returns the limit and
    the file it came from. Never raises.
    """
    root, proc = Path(cgroup_root), Path(proc_root)
    v2_path, v1_path = _own_cgroup(proc, "cpu")

    best: tuple[float | None, str] = (None, "")

    def consider(limit: float | None, where: Path) -> None:
        nonlocal best
        if limit is not None and (best[0] is None or limit < best[0]):
            best = (limit, str(where))

    for d in _ancestors(root, v2_path):
        consider(_v2_limit(d / "cpu.max"), d / "cpu.max")
    for mount in ("cpu,cpuacct", "cpu", "cpuacct,cpu"):
        if (root / mount).is_dir():
            for d in _ancestors(root / mount, v1_path):
                consider(_v1_limit(d), d / "cpu.cfs_quota_us")
            break
    return best


def _ancestors(mount: Path, cgroup_path: str) -> list[Path]:
    """The cgroup's directory under `mount` and each parent up to the mount point. Inside a
    container the path from /proc may not exist under the mount: then only the mount."""
    rel = [p for p in cgroup_path.strip("/").split("/") if p and p != ".."]
    dirs = [mount]
    for i in range(len(rel)):
        d = mount.joinpath(*rel[: i + 1])
        if not d.is_dir():
            break
        dirs.append(d)
    return dirs


def _v2_limit(path: Path) -> float | None:
    text = _read(path)  # "max 100000" or "150000 100000"
    if not text:
        return None
    fields = text.split()
    if fields[0] == "max":
        return None
    try:
        quota = int(fields[0])
        period = int(fields[1]) if len(fields) > 1 else 100000
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_limit(d: Path) -> float | None:
    q, p = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
    try:
        quota, period = int(q or "-1"), int(p or "0")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


# --- memory -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AvailableMemory:
    """The result of the available-memory probe."""

    available: int | None
    """Bytes this process may still take without swapping or meeting its cgroup's limit;
    None when nothing could be read."""
    method: str
    """The source that decided it: ``"MemAvailable"``, ``"cgroup v2 memory.max"``,
    ``"cgroup v1 memory.limit_in_bytes"``, ``"physical memory"``, or ``""``."""
    notes: tuple[str, ...] = ()
    """Every fallback taken and limit applied, with its reason, in order."""


PhysicalMemory = Callable[[], int | None]
"""Returns the machine's physical memory in bytes, or None (the last-resort source)."""


def available_memory(root: str | os.PathLike[str] = "/") -> int:
    """Bytes of RAM this process may use now: the smaller of the kernel's ``MemAvailable``
    and the headroom under the memory limit of the process's cgroup (v2 ``memory.max`` /
    ``memory.high``, v1 ``memory.limit_in_bytes``, the tightest of its cgroup and the
    ancestors). `root` is the file system root holding ``proc/`` and ``sys/`` (tests pass a
    recorded tree). Raises ConfigError, asking for an explicit ``ram_budget``, when no
    source can be read.
    """
    probe = probe_available_memory(root)
    if probe.available is None:
        raise ConfigError(
            "EngineConfig.ram_budget: the available memory could not be determined ("
            + "; ".join(probe.notes) + "); set EngineConfig.ram_budget explicitly, e.g. \"8GiB\""
        )
    return probe.available


def probe_available_memory(
    root: str | os.PathLike[str] = "/",
    *,
    platform: str | None = None,
    physical_memory: PhysicalMemory | None = None,
) -> AvailableMemory:
    """Finds the memory this process may use; never raises (see :func:`available_memory`).

    root: where ``proc/`` and ``sys/fs/cgroup/`` are (Linux).
    platform: a ``sys.platform`` value (default: this one).
    physical_memory: the last resort, used when no Linux source is readable (macOS,
    other systems): total physical memory, which overestimates what is free (default:
    ``os.sysconf`` pages x page size).
    """
    plat = sys.platform if platform is None else platform
    notes: list[str] = []
    base = Path(root)
    best: tuple[int | None, str] = (None, "")
    try:
        if plat.startswith("linux"):
            meminfo = _meminfo_available(base / "proc" / "meminfo", notes)
            if meminfo is not None:
                best = (meminfo, "MemAvailable")
            headroom, where, method = cgroup_memory_headroom(
                base / "sys" / "fs" / "cgroup", base / "proc"
            )
            if headroom is not None and (best[0] is None or headroom < best[0]):
                if best[0] is not None:
                    notes.append(f"cgroup memory limit ({where}) leaves {headroom} bytes, "
                                 f"less than MemAvailable ({best[0]} bytes)")
                best = (headroom, method)
        else:
            notes.append(f"no available-memory probe for platform {plat!r}")
    except Exception as e:  # a probe bug must not stop a model from loading
        notes.append(f"memory probe failed ({type(e).__name__}: {e})")
    if best[0] is None:
        total = (physical_memory or _physical_memory)()
        if total is not None and total > 0:
            notes.append("using total physical memory, which counts memory other "
                         "processes hold; set EngineConfig.ram_budget to be exact")
            best = (total, "physical memory")
        else:
            notes.append("physical memory unknown")
    result = AvailableMemory(best[0], best[1], tuple(notes))
    for note in result.notes:
        log.debug("available_memory: %s", note)
    return result


def _physical_memory() -> int | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _kv_file(path: Path) -> dict[str, int]:
    """``name value`` lines (memory.stat) or ``Name: value kB`` lines (meminfo) as ints."""
    out: dict[str, int] = {}
    for line in (_read(path) or "").splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2:
            try:
                value = int(parts[1])
            except ValueError:
                continue
            if len(parts) >= 3 and parts[2].lower() == "kb":
                value *= 1024
            out[parts[0]] = value
    return out


def _meminfo_available(path: Path, notes: list[str]) -> int | None:
    info = _kv_file(path)
    if "MemAvailable" in info:
        return info["MemAvailable"]
    if "MemFree" in info:  # kernels before 3.14 have no MemAvailable
        notes.append(f"no MemAvailable in {path}; estimating it as MemFree + Buffers + Cached")
        return info["MemFree"] + info.get("Buffers", 0) + info.get("Cached", 0)
    notes.append(f"{path} unreadable or without MemAvailable/MemFree")
    return None


# A v1 limit this large means "no limit" (the kernel writes PAGE_COUNTER_MAX pages).
_V1_UNLIMITED = 1 << 62


def cgroup_memory_headroom(
    cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
    proc_root: str | os.PathLike[str] = "/proc",
) -> tuple[int | None, str, str]:
    """Bytes the process's cgroup may still grow by, or None if no limit applies.

    For the process's own cgroup and each ancestor with a limit: the limit minus the
    usage, where the usage leaves out the inactive file cache (``inactive_file`` of
    ``memory.stat``: page cache the kernel drops before it fails an allocation; docker and
    kubernetes count memory the same way). The limit is cgroup v2 ``memory.max`` or
    ``memory.high`` (past ``high`` the kernel throttles the process hard), whichever is
    lower ("max" = none), or cgroup v1 ``memory.limit_in_bytes``. The tightest level wins.
    Returns (headroom, the limit file, the method name). Never raises.
    """
    root, proc = Path(cgroup_root), Path(proc_root)
    v2_path, v1_path = _own_cgroup(proc, "memory")

    best: tuple[int | None, str, str] = (None, "", "")

    def consider(limit: int | None, d: Path, limit_name: str, usage_name: str,
                 inactive_names: tuple[str, ...], method: str) -> None:
        nonlocal best
        if limit is None:
            return
        usage = _int_file(d / usage_name) or 0
        stat = _kv_file(d / "memory.stat")
        inactive = next((stat[n] for n in inactive_names if n in stat), 0)
        headroom = max(0, limit - max(0, usage - inactive))
        if best[0] is None or headroom < best[0]:
            best = (headroom, str(d / limit_name), method)

    # cgroup v2: the unified mount itself, or unified/ beside the v1 controllers (hybrid).
    for mount in (root, root / "unified"):
        if (mount / "cgroup.controllers").is_file():
            for d in _ancestors(mount, v2_path):
                lim_max, lim_high = _v2_mem(d / "memory.max"), _v2_mem(d / "memory.high")
                limits = [x for x in (lim_max, lim_high) if x is not None]
                name = "memory.max" if lim_max is not None and (
                    lim_high is None or lim_max <= lim_high) else "memory.high"
                consider(min(limits) if limits else None, d, name, "memory.current",
                         ("inactive_file",), "cgroup v2 memory.max")
            break
    for name in ("memory", "memory,memsw"):
        if (root / name).is_dir():
            for d in _ancestors(root / name, v1_path):
                limit = _int_file(d / "memory.limit_in_bytes")
                if limit is not None and limit >= _V1_UNLIMITED:
                    limit = None
                consider(limit, d, "memory.limit_in_bytes", "memory.usage_in_bytes",
                         ("total_inactive_file", "inactive_file"),
                         "cgroup v1 memory.limit_in_bytes")
            break
    return best


def _int_file(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _v2_mem(path: Path) -> int | None:
    """A v2 memory limit in bytes; None for "max", a missing file or garbage."""
    text = _read(path)
    if not text or text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


# --- macOS ------------------------------------------------------------------------------------


def _run_sysctl(name: str) -> str | None:
    exe = "/usr/sbin/sysctl" if os.path.exists("/usr/sbin/sysctl") else shutil.which("sysctl")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-n", name], capture_output=True, text=True, timeout=5,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _sysctl_int(sysctl: Sysctl, name: str) -> int | None:
    try:
        text = sysctl(name)
        value = int(text.strip()) if text else 0
    except (ValueError, OSError):
        return None
    return value if value > 0 else None


def _darwin(sysctl: Sysctl, fallback: int, notes: list[str]) -> tuple[int, str]:
    # Apple Silicon: perflevel0 is the performance cluster. hw.physicalcpu counts the
    # efficiency cores too (10 on an M1 Max with 8 P-cores), so it is only the fallback
    # for Intel Macs, where perflevel* does not exist.
    n = _sysctl_int(sysctl, "hw.perflevel0.logicalcpu")
    if n is not None:
        return n, "sysctl hw.perflevel0.logicalcpu"
    notes.append("hw.perflevel0.logicalcpu unavailable (Intel Mac?); using hw.physicalcpu")
    n = _sysctl_int(sysctl, "hw.physicalcpu")
    if n is not None:
        return n, "sysctl hw.physicalcpu"
    notes.append("hw.physicalcpu unavailable; using the logical CPU count")
    return fallback, "os.cpu_count"
