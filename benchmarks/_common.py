"""Shared helpers for benchmarks: machine description, git commit, result files, tables."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    flags: list[str] = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not cpu:
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile")
    isa = [f for f in wanted if f in flags]
    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "isa": isa,
        "memory_bytes": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        **conditions(),
    }


def _bracketed(path: str) -> str | None:
    """The selected value of a sysfs choice file ("always [madvise] never" -> "madvise")."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else text.strip()


def conditions() -> dict[str, Any]:
    """What else shapes a timing on this machine right now: the 1/5/15-minute load average
    (other processes on the cores) and the transparent huge page modes (they change page
    fault cost and TLB misses). Recorded in every result; call again per run to follow the
    load through a benchmark."""
    return {
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "thp_enabled": _bracketed("/sys/kernel/mm/transparent_hugepage/enabled"),
        "thp_defrag": _bracketed("/sys/kernel/mm/transparent_hugepage/defrag"),
    }


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = RESULTS_DIR / f"{name}-{stamp}.json"
    doc = {"benchmark": name, "git_commit": git_commit(), "machine": machine(), **payload}
    path.write_text(json.dumps(doc, separators=(",", ":")))  # compact: results run to MBs
    return path


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [
        [f"{c:.3g}" if isinstance(c, float) else str(c) for c in r] for r in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
        for r in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    text = "\n".join(lines)
    print(text)
    return text
