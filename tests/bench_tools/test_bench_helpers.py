"""Pure helpers of the streaming benchmark (benchmarks/_cgroup.py, bench_streaming.py,
_stream_report.py):
sizes, /proc parsing, cgroup layout detection from text, offsets, bounds, child output.
Nothing here needs root, a cgroup, the core or a model; the O_DIRECT reader runs on a
small temporary file when the file system allows O_DIRECT."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # bench_streaming imports _cgroup and _common
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


cg = _load("_cgroup")
bs = _load("bench_streaming")
sr = _load("_stream_report")  # the tables and figures split out of bench_streaming

V1_CGROUP = """9:name=systemd:/
4:memory:/process_api/abc
2:cpu,cpuacct:/
0::/
"""
V1_MOUNTS = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


@pytest.mark.parametrize(("text", "n"), [
    ("2GiB", 2 << 30), ("512 MiB", 512 << 20), ("1.5GB", 1_500_000_000), ("4096", 4096),
    (77, 77), ("3k", 3000), ("1KiB", 1024),
])
def test_parse_size(text: str | int, n: int) -> None:
    assert cg.parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "GiB", "2 parsecs", "-1GiB", "1e3"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        cg.parse_size(bad)


def test_fmt_bytes() -> None:
    assert cg.fmt_bytes(2.21 * 2**30) == "2.21 GiB"
    assert cg.fmt_bytes(512 << 20) == "512 MiB"
    assert cg.fmt_bytes(12) == "12 B"


def test_parse_proc_cgroup() -> None:
    d = cg.parse_proc_cgroup(V1_CGROUP)
    assert d["memory"] == "/process_api/abc"
    assert d["cpu"] == d["cpuacct"] == "/"
    assert d[""] == "/"
    assert d["name=systemd"] == "/"


def test_mount_points() -> None:
    mp = cg.mount_points(V1_MOUNTS)
    assert mp["memory"] == Path("/sys/fs/cgroup/memory")
    assert mp["cpuacct"] == Path("/sys/fs/cgroup/cpu,cpuacct")
    assert mp["cgroup2"] == Path("/sys/fs/cgroup/unified")


def test_find_layout_prefers_v1_memory_hierarchy() -> None:
    lay = cg.find_layout(V1_CGROUP, V1_MOUNTS)
    assert lay.version == 1
    assert lay.parent == Path("/sys/fs/cgroup/memory/process_api/abc")
    assert lay.limit_file == "memory.limit_in_bytes"
    assert lay.peak_file == "memory.max_usage_in_bytes"


def test_find_layout_v2(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    lay = cg.find_layout("0::/user.slice/bench\n", f"cgroup2 {tmp_path} cgroup2 rw 0 0\n")
    assert lay.version == 2
    assert lay.parent == tmp_path / "user.slice/bench"
    assert (lay.limit_file, lay.swap_file, lay.peak_file) == (
        "memory.max", "memory.swap.max", "memory.peak")


def test_find_layout_none() -> None:
    with pytest.raises(RuntimeError, match="no memory cgroup"):
        cg.find_layout("0::/\n", "proc /proc proc rw 0 0\n")


def test_parse_kv() -> None:
    text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\nlow 1 2\n"
    assert cg.parse_kv(text) == {"oom_kill_disable": 0, "under_oom": 0, "oom_kill": 3}


def test_parse_diskstats() -> None:
    text = (" 253       0 vda 81346 5466 21330702 47890 44424 1503 4210448 76420 0 61520 "
            "126048 0 0 0 0 2910 1737\n"
            " 253       1 vda1 100 0 800 10 0 0 0 0 0 5 10 0 0 0 0 0 0\n")
    assert cg.parse_diskstats(text, 253, 0) == (21330702 * 512, 61520)
    assert cg.parse_diskstats(text, 253, 1) == (800 * 512, 5)
    assert cg.parse_diskstats(text, 8, 0) is None
    assert cg.parse_diskstats_reads(text, 253, 0) == (81346, 47890)
    assert cg.parse_diskstats_reads(text, 253, 1) == (100, 10)
    assert cg.parse_diskstats_reads(text, 8, 0) is None


def test_random_offsets() -> None:
    offs = cg.random_offsets(10 * 8192 + 100, 8192, 10, seed=1)
    assert sorted(offs) == [i * 8192 for i in range(10)]  # every slot once, shuffled
    assert offs != sorted(offs)
    more = cg.random_offsets(3 * 4096, 4096, 7)
    assert len(more) == 7 and set(more) == {0, 4096, 8192}
    assert cg.random_offsets(1 << 20, 4096, 5, seed=2) == cg.random_offsets(1 << 20, 4096, 5,
                                                                            seed=2)
    with pytest.raises(ValueError):
        cg.random_offsets(1 << 20, 1000, 4)
    with pytest.raises(ValueError):
        cg.random_offsets(4095, 4096, 1)


def test_decode_bound_and_fraction() -> None:
    assert cg.decode_bound(1e9, 250e6) == 4.0
    assert cg.decode_bound(1e9, 0) == float("inf")
    assert sr.bound_fraction(3.0, 250e6, 1e9) == pytest.approx(0.75)
    assert sr.bound_fraction(None, 250e6, 1e9) is None
    assert sr.bound_fraction(3.0, 0, 1e9) is None


def test_parse_child_output() -> None:
    out = 'noise\n@@RESULT {"a": 1}\nmore\n@@RESULT {"a": 2, "b": [1]}\ntail\n'
    assert bs.parse_child_output(out) == {"a": 2, "b": [1]}
    assert bs.parse_child_output("nothing here\n") is None


def test_select_parts() -> None:
    assert bs.select_parts(None) == list(bs.PARTS)
    assert bs.select_parts("demo, compare") == ["compare", "demo"]  # PARTS order
    with pytest.raises(ValueError, match="unknown part"):
        bs.select_parts("compare,warp-drive")


def test_dig_median_ratio() -> None:
    runs = [{"cold": {"x": 1.0}}, {"cold": {"x": 3.0}}, {"cold": {"x": 2.0}},
            {"error": "boom"}, {"cold": {"x": None}}]
    assert sr.dig(runs[0], "cold.x") == 1.0
    assert sr.dig(runs[3], "cold.x") is None
    assert sr.median_of(runs, "cold.x") == 2.0
    assert sr.median_of(runs, "warm.x") is None
    assert sr.ratio(4.0, 2.0) == 2.0
    assert sr.ratio(4.0, 0.0) is None
    assert sr.ratio(None, 2.0) is None


def test_proc_status_bytes() -> None:
    if not Path("/proc/self/status").exists():
        pytest.skip("no /proc")
    hwm = cg.proc_status_bytes("VmHWM")
    assert hwm is not None and hwm > 1 << 20
    assert cg.proc_status_bytes("NoSuchField") is None


def test_disk_bandwidth_small_file(tmp_path: Path) -> None:
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    f = tmp_path / "blob"
    f.write_bytes(os.urandom(1 << 20))
    try:
        r = cg.disk_bandwidth(f, chunk=64 << 10, total=256 << 10, qd=2)
    except OSError as e:  # tmpfs and some file systems refuse O_DIRECT
        pytest.skip(f"O_DIRECT not supported here: {e}")
    assert r.bytes_read == 4 * (64 << 10)
    assert r.qd == 2 and r.bytes_per_s > 0
    assert r.to_dict()["gb_s"] == pytest.approx(r.bytes_per_s / 1e9)


# --- the disk bound (benchmarks/_diskbound.py) and the spread (benchmarks/_variance.py) ----

db = _load("_diskbound")
var = _load("_variance")


def test_spread_and_rankable() -> None:
    a = var.spread([3.0, 1.0, 2.0, None, 4.0, 5.0])
    assert (a["n"], a["median"], a["min"], a["max"]) == (5, 3.0, 1.0, 5.0)
    assert a["rel_spread"] == pytest.approx(4.0 / 3.0)
    assert var.spread([2.0, 4.0])["median"] == 3.0
    assert var.spread([None])["median"] is None
    fast, slow = var.spread([10.0, 11.0, 12.0]), var.spread([7.0, 8.0, 9.5])
    assert var.rankable(fast, slow) and var.rankable(slow, fast)
    assert not var.rankable(fast, var.spread([9.0, 10.5, 13.0]))  # overlapping ranges
    assert not var.rankable(var.spread([10.0]), slow)  # one child ranks nothing
    assert "rankable" in var.verdict("a", fast, "b", slow)
    assert "too large to rank" in var.verdict("a", fast, "c", var.spread([9.0, 10.5, 13.0]))
    assert var.fmt_spread(fast) == "11 (10-12)"


def test_slot_offsets() -> None:
    offs = db.slot_offsets(10 * 4096 + 100, 4096, 50, seed=1)
    assert sorted(offs) == [i * 4096 for i in range(10)]  # every whole block, no more
    same = db.slot_offsets(10 * 4096, 8192, 3, seed=2)
    assert db.slot_offsets(10 * 4096, 8192, 3, seed=2) == same
    with pytest.raises(ValueError):
        db.slot_offsets(100, 4096, 1, seed=0)


def test_disk_bound_without_sustained_samples_is_the_best_burst(tmp_path: Path) -> None:
    f = tmp_path / "experts.bin"
    f.write_bytes(os.urandom(4 << 20))
    b = db.DiskBound(str(f), 64 << 10, depths=(1, 2), total=1 << 20)
    first = b.sample("before")
    b.sample("after")
    assert len(b.samples) == 4 and first > 0
    assert {s["kind"] for s in b.samples} == {"burst"}
    assert b.bound_gbs == b.burst_best_gbs == max(s["gb_s"] for s in b.samples)
    assert b.sustained_best_gbs is None and b.curve("sustained") == {}
    curve = b.curve()
    assert set(curve) == {1, 2} and curve[1]["n"] == 2
    assert curve[1]["worst"] <= curve[1]["median"] <= curve[1]["best"]
    d = b.to_dict()
    assert d["bound_gb_s"] == b.bound_gbs and d["definition"] == "best burst sample"
    assert d["figures"]["sustained_best"] is None and d["figures"]["sustained_median"] is None


def test_disk_bound_is_the_best_median_of_the_sustained_samples(tmp_path: Path) -> None:
    """With sustained samples the bound is their best per-depth median, whatever the bursts
    gave; the best sustained sample and the bursts stay in figures()."""
    f = tmp_path / "experts.bin"
    f.write_bytes(os.urandom(4 << 20))
    b = db.DiskBound(str(f), 64 << 10, depths=(1, 2), total=1 << 20,
                     sustained_total=2 << 20, sustained_depths=(2,))
    b.sample("before")
    b.sample("after")
    sus = [s for s in b.samples if s["kind"] == "sustained"]
    assert len(sus) == 2 and all(s["depth"] == 2 and s["bytes"] == 2 << 20 for s in sus)
    assert b.bound_gbs == b.sustained_median_gbs
    assert b.bound_gbs == pytest.approx((sus[0]["gb_s"] + sus[1]["gb_s"]) / 2)
    assert b.sustained_best_gbs == max(s["gb_s"] for s in sus)
    assert b.curve("sustained")[2]["n"] == 2
    # the figures from known samples (the median of two is their mean)
    b.samples = [{"depth": 1, "gb_s": 3.0, "kind": "burst"},
                 {"depth": 1, "gb_s": 1.0, "kind": "burst"},
                 {"depth": 2, "gb_s": 1.5, "kind": "sustained"},
                 {"depth": 2, "gb_s": 1.1, "kind": "sustained"},
                 {"depth": 4, "gb_s": 1.2, "kind": "sustained"},
                 {"depth": 1, "gb_s": 2.5}]  # an old sample without a kind: a burst
    f2 = b.figures()
    assert f2["burst_best"] == 3.0 and f2["burst_median"] == 2.5
    assert f2["sustained_best"] == 1.5 and f2["sustained_median"] == pytest.approx(1.3)
    assert b.bound_gbs == pytest.approx(1.3)  # depth 2's median beats depth 4's one sample
    assert b.to_dict()["definition"] == "best per-depth median of the sustained samples"


def test_bound_table_reports_every_figure() -> None:
    doc = {"disk_bounds": [{"bound_gb_s": 1.5, "figures": {
        "sustained_best": 1.5, "sustained_median": 1.2, "burst_best": 2.0,
        "burst_median": None}}],
        "parts": {"compare": {"summary": {"colibri": {
            p: {"decode_tok_s": 4.0, "decode_read_bytes_per_s": 1.2e9, "device_busy": 0.9}
            for p in ("cold", "warm")}}}}}
    out = sr.bound_table(doc)
    assert out["yardstick_bytes_per_s"] == 1.5e9
    assert out["configs"]["compare/colibri/cold"] == pytest.approx(0.8)
    fr = out["fractions"]["compare/colibri/warm"]
    assert fr["sustained_median"] == pytest.approx(1.0) and fr["burst_best"] == pytest.approx(0.6)
    assert "burst_median" not in fr  # a figure the run does not have is left out


def test_readahead_is_restored_on_error(tmp_path: Path) -> None:
    knob = tmp_path / "read_ahead_kb"
    knob.write_text("8192\n")
    with pytest.raises(RuntimeError), db.readahead(tmp_path, 128, file=knob):
        assert knob.read_text() == "128"
        raise RuntimeError("child failed")
    assert knob.read_text() == "8192"
    with db.readahead(tmp_path, None, file=knob):  # None: left alone
        assert knob.read_text() == "8192"


def test_compare_summary_ranks_against_the_best_llama_row_or_skips_without_one() -> None:
    class _Runner:
        def __init__(self, summary: dict[str, object]) -> None:
            self.doc = {"parts": {"compare": {"summary": summary}}}

        def save(self) -> None:
            pass

    def row(*tok_s: float) -> dict[str, object]:
        s = var.spread(list(tok_s))
        return {p: {"decode_tok_s": s["median"], "decode_spread": s} for p in ("cold", "warm")}

    colibri_only = _Runner({"colibri": row(3.0, 3.2, 3.4)})
    sr.compare_summary(colibri_only)  # --llama-variants "": no baseline, no error
    assert "ratio_decode_cold" not in colibri_only.doc["parts"]["compare"]
    both = _Runner({"colibri": row(3.0, 3.2, 3.4), "llama.cpp ra=128 KiB": row(0.9, 1.0, 1.1),
                    "llama.cpp ra=8192 KiB": row(0.07, 0.08, 0.09)})
    sr.compare_summary(both)
    part = both.doc["parts"]["compare"]
    assert part["best_llama_cold"] == "llama.cpp ra=128 KiB"
    assert part["ratio_decode_warm"] == pytest.approx(3.2)


# --- the bound's destination slabs and compact result files (session 27) -----------------


def test_bound_slabs_auto_is_the_cache_slot_count(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """--bound-slabs auto (the default) reads the bound into the expert cache's slot count
    of the part's colibri spec; a number is used as given; 0 keeps the old method (one slab
    per read in flight). The choice is recorded in the JSON, and the DiskBound made next
    reads into it."""
    import argparse

    seen: list[dict[str, object]] = []

    def planned(spec: dict[str, object]) -> int:
        seen.append(spec)
        return 482

    monkeypatch.setattr(bs, "planned_cache_slots", planned)
    monkeypatch.setattr(bs, "RESULTS_DIR", tmp_path)
    f = tmp_path / "experts.bin"
    f.write_bytes(os.urandom(1 << 20))
    for want, slabs in (("auto", 482), (64, 64), (0, 0)):
        args = argparse.Namespace(bound_slabs=want, disk_bytes=256 << 10, sustained_bytes=0,
                                  sustained_depths=(1,))
        r = bs.Runner(args)
        monkeypatch.setattr(r, "log", lambda msg: None)
        assert r.resolve_slabs({"ram_budget": 1}, "moe-8g") == slabs
        assert r.doc["bound_slabs"]["moe-8g"] == {"setting": want, "slabs": slabs}
        def fake_sample(self: object, label: str) -> float:
            self.samples.append({"depth": 1, "gb_s": 1.0, "kind": "burst"})  # type: ignore
            return 1.0

        monkeypatch.setattr(db.DiskBound, "sample", fake_sample)
        r.disk(f, 64 << 10, "before")
        assert r.bound is not None and r.bound.slabs == slabs
        assert r.bound.to_dict()["destination_slabs"] == (slabs or "one per read in flight")
    assert len(seen) == 1  # the plan is consulted for "auto" only


def test_default_bound_slabs_is_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser's default is auto: capture the args main() would run with."""
    got: dict[str, object] = {}

    class _Stop(Exception):
        pass

    def fake_select(only: str | None) -> list[str]:
        raise _Stop

    monkeypatch.setattr(bs, "select_parts", fake_select)
    real_parse = bs.argparse.ArgumentParser.parse_args

    def parse(self: object, argv: object = None, namespace: object = None) -> object:
        ns = real_parse(self, argv, namespace)  # type: ignore[arg-type]
        got.update(vars(ns))
        return ns

    monkeypatch.setattr(bs.argparse.ArgumentParser, "parse_args", parse)
    with pytest.raises(_Stop):
        bs.main([])
    assert got["bound_slabs"] == "auto"
    with pytest.raises(_Stop):
        bs.main(["--bound-slabs", "0"])
    assert got["bound_slabs"] == 0


def test_result_files_are_compact(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Result JSON is written without indentation (bench_streaming's ran to 300 KB with
    indent=2): one line, no blank after a separator, and it reads back the same."""
    import argparse
    import json

    common = _load("_common")
    monkeypatch.setattr(common, "RESULTS_DIR", tmp_path)
    path = common.write_result("unit", {"runs": [{"a": 1, "b": [1.5, 2]}]})
    text = path.read_text()
    assert "\n" not in text and ", " not in text and ": " not in text
    assert json.loads(text)["runs"] == [{"a": 1, "b": [1.5, 2]}]
    monkeypatch.setattr(bs, "RESULTS_DIR", tmp_path)
    r = bs.Runner(argparse.Namespace(bound_slabs=0))
    r.doc["disk_bounds"] = [db.DiskBound(str(tmp_path / "x"), 4096)]
    r.save()
    text = r.path.read_text()
    assert "\n" not in text and json.dumps(json.loads(text), separators=(",", ":")) == text
    assert json.loads(text)["disk_bounds"][0]["destination_slabs"] == "one per read in flight"


def test_reference_bound_samples_beside_the_bound(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """--reference-slabs N: every disk sample is also taken into N slabs, alternately
    before and after the bound's own, kept apart (reference_bounds), never the yardstick,
    and reported in the bound table's figures."""
    import argparse

    order: list[tuple[int, str]] = []

    def fake_sample(self: object, label: str) -> float:
        gbs = 1.0 if self.slabs else 1.25  # type: ignore[attr-defined]
        self.samples.append({"depth": 1, "gb_s": gbs, "kind": "burst"})  # type: ignore
        order.append((self.slabs, label))  # type: ignore[attr-defined]
        return gbs

    monkeypatch.setattr(db.DiskBound, "sample", fake_sample)
    monkeypatch.setattr(bs, "RESULTS_DIR", tmp_path)
    args = argparse.Namespace(bound_slabs=100, reference_slabs=0, disk_bytes=1 << 20,
                              sustained_bytes=0, sustained_depths=(1,))
    r = bs.Runner(args)
    monkeypatch.setattr(r, "log", lambda msg: None)
    r.resolve_slabs({}, "m")
    f = tmp_path / "experts.bin"
    f.write_bytes(b"x")
    for label in ("a", "b", "c"):
        r.disk(f, 4096, label)
    assert order == [(100, "a"), (0, "a"), (0, "b"), (100, "b"), (100, "c"), (0, "c")]
    assert r.bound is not None and r.bound.bound_gbs == 1.0  # the yardstick: 100 slabs
    assert r.doc["reference_bounds"][0].bound_gbs == 1.25
    doc = {"disk_bounds": [r.bound.to_dict()],
           "reference_bounds": [b.to_dict() for b in r.doc["reference_bounds"]]}
    assert sr.yardstick_of(doc) == pytest.approx(1.0e9)
    assert sr.disk_figures(doc)["ref_bound_1_slab_per_read"] == pytest.approx(1.25e9)
