"""Pure helpers of the fast-disk test bed (benchmarks/_ramdisk.py, fast_disk.py), the fio
device bound's labels (_fio.py) and the per-token breakdown of the streaming child
(_stream_child.breakdown, _stream_report.breakdown_cell). Nothing here needs root, a
device, fio, the core or a model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


rd = _load("_ramdisk")
fio = _load("_fio")
child = _load("_stream_child")
sr = _load("_stream_report")
fd = _load("fast_disk")


def test_device_size_holds_the_payload_and_rounds_to_mib() -> None:
    n = rd.device_size(1_000_000_000)
    assert n >= 1_150_000_000 + (96 << 20) and n % (1 << 20) == 0
    assert rd.device_size(0) == 96 << 20


def test_throttle_lines_per_cgroup_version() -> None:
    assert rd.throttle_line(2, 7, 0, 1_000_000_000) == "7:0 rbps=1000000000"
    assert rd.throttle_line(1, 7, 3, 5) == "7:3 5"
    with pytest.raises(ValueError, match="positive"):
        rd.throttle_line(1, 7, 0, 0)


def test_ram_disk_refuses_a_device_over_the_cap() -> None:
    with pytest.raises(ValueError, match="over the cap"):
        rd.RamDisk(7 << 30, max_size=6 << 30)


def test_speeds_parse_and_reject_bad_input() -> None:
    assert fd.parse_speeds("1, 2.5,ram") == [1.0, 2.5, None]
    with pytest.raises(ValueError, match="> 0"):
        fd.parse_speeds("0")
    with pytest.raises(ValueError):
        fd.parse_speeds("fast")


def test_fio_label_names_the_bound() -> None:
    assert fio.label(None) == "fio bound (none)"
    f = {"bound_gb_s": 3.5, "best_depth": 2, "buffers": "huge pages (shmhuge)"}
    assert fio.label(f) == "fio device bound, depth 2, huge pages"
    f["buffers"] = "4 KiB pages (malloc): fio could not get huge-page buffers here"
    assert fio.label(f).endswith("4 KiB pages")


def test_breakdown_per_token_and_its_cell() -> None:
    ex = {"wall_seconds": 2.0, "disk_busy_seconds": 1.0, "compute_seconds": 1.5,
          "io_and_compute_seconds": 0.75, "neither_seconds": 0.25}
    b = child.breakdown(ex, 10)
    assert b["disk_busy_ms"] == 100.0 and b["compute_ms"] == 150.0
    assert b["neither_ms"] == 25.0 and b["wall_ms"] == 200.0 and b["neither_frac"] == 0.125
    # disk + compute + neither - overlap = wall
    assert b["disk_busy_ms"] + b["compute_ms"] + b["neither_ms"] - b["overlap_ms"] == b["wall_ms"]
    cell = sr.breakdown_cell({"disk_busy_ms": 100.0, "compute_ms": 150.0, "neither_ms": 25.0,
                              "neither_frac": 0.125})
    assert cell == "100 / 150 / 25 (12%)"
    assert sr.breakdown_cell({"disk_busy_ms": None}) == "-"
