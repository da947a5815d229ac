"""colibri doctor (issue 14): the settings it reports come from recorded sysfs / proc /
cgroup trees written here (each value chosen so a mix-up between fields would show), and
its read measurement runs the engine's read pool on a real temporary file."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from colibri.cli import main
from colibri.engine import doctor
from colibri.errors import InvalidRequestError


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def recorded_machine(root: Path) -> Path:
    """A machine whose model disk is partition vdb1 (254:17) of a virtio disk vdb, with
    THP on madvise, a 6 GiB cgroup v2 limit of which 1 GiB is used, and 4 CPUs (2 cores
    with 2 SMT siblings each)."""
    sys_ = root / "sys"
    disk = sys_ / "devices" / "pci0000:00" / "virtio3" / "block" / "vdb"
    write(disk / "queue" / "read_ahead_kb", "128\n")
    write(disk / "queue" / "max_sectors_kb", "1280\n")
    write(disk / "queue" / "max_segments", "254\n")
    write(disk / "queue" / "rotational", "0\n")
    write(disk / "queue" / "scheduler", "[mq-deadline] none\n")
    write(disk / "vdb1" / "partition", "1\n")
    (sys_ / "dev" / "block").mkdir(parents=True)
    os.symlink(disk / "vdb1", sys_ / "dev" / "block" / "254:17")
    thp = sys_ / "kernel" / "mm" / "transparent_hugepage"
    write(thp / "enabled", "always [madvise] never\n")
    write(thp / "defrag", "always defer defer+madvise [madvise] never\n")
    for cpu in range(4):
        topo = sys_ / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        write(topo / "core_id", f"{cpu // 2}\n")
        write(topo / "physical_package_id", "0\n")
        write(topo / "thread_siblings_list", f"{cpu // 2 * 2}-{cpu // 2 * 2 + 1}\n")
    write(sys_ / "devices" / "system" / "cpu" / "online", "0-3\n")
    cg = sys_ / "fs" / "cgroup"
    write(cg / "cgroup.controllers", "cpu memory\n")
    write(cg / "job" / "memory.max", str(6 << 30) + "\n")
    write(cg / "job" / "memory.current", str(1 << 30) + "\n")
    write(cg / "job" / "memory.stat", "inactive_file 0\n")
    proc = root / "proc"
    write(proc / "self" / "cgroup", "0::/job\n")
    write(proc / "meminfo", "MemTotal: 24000000 kB\nMemAvailable: 20000000 kB\n")
    write(proc / "self" / "mountinfo",
          "22 1 254:2 / / rw - ext4 /dev/vda2 rw\n"
          "40 22 254:17 / /models rw,relatime - xfs /dev/vdb1 rw\n")
    return root


def probe(root: Path, path: str = "/models/glm") -> doctor.SystemReport:
    return doctor.probe_system(
        path, sysfs_root=root / "sys", proc_root=root / "proc",
        cgroup_root=root / "sys" / "fs" / "cgroup", root=root, dev=(254, 17),
        affinity=range(4))


def test_settings_come_from_the_recorded_machine(tmp_path: Path) -> None:
    s = probe(recorded_machine(tmp_path))
    d = s.device
    assert (d.name, d.read_ahead_kb, d.max_sectors_kb, d.max_segments) == ("vdb", 128, 1280, 254)
    assert d.rotational is False and d.scheduler == "mq-deadline" and d.note == ""
    assert (s.filesystem, s.mount_source) == ("xfs", "/dev/vdb1")  # not the root mount's ext4
    assert (s.transparent_hugepages, s.thp_defrag) == ("madvise", "madvise")
    assert s.cgroup_memory_headroom == 5 << 30 and s.cgroup_limit_file.endswith("job/memory.max")
    assert s.available_memory == 5 << 30  # the cgroup is tighter than MemAvailable (~19 GiB)
    assert s.performance_cores == 2  # SMT siblings count once
    text = "\n".join(doctor.system_lines(s))
    assert "128 KiB" in text and "254 segments" in text and "madvise" in text


def test_unknown_device_and_thp_off_are_said(tmp_path: Path) -> None:
    root = recorded_machine(tmp_path)
    thp = root / "sys" / "kernel" / "mm" / "transparent_hugepage"
    write(thp / "enabled", "always madvise [never]\n")
    s = doctor.probe_system("/models", sysfs_root=root / "sys", proc_root=root / "proc",
                            cgroup_root=root / "sys" / "fs" / "cgroup", root=root, dev=(0, 52))
    assert s.device.name is None and s.device.read_ahead_kb is None
    assert "no block device 0:52" in s.device.note
    assert s.transparent_hugepages == "never"
    assert any("transparent huge pages are off" in n for n in s.notes)
    assert "readahead       unknown" in "\n".join(doctor.system_lines(s))


def test_a_whole_disk_without_partition(tmp_path: Path) -> None:
    root = recorded_machine(tmp_path)
    disk = root / "sys" / "devices" / "pci0000:00" / "virtio3" / "block" / "vdb"
    os.symlink(disk, root / "sys" / "dev" / "block" / "254:16")
    assert doctor.probe_block_device((254, 16), root / "sys").read_ahead_kb == 128


def test_measure_reads_through_the_engine(tmp_path: Path) -> None:
    f = tmp_path / "experts.bin"
    f.write_bytes(os.urandom(8 << 20))
    (tmp_path / "small.gguf").write_bytes(b"x" * 4096)
    assert doctor.model_data_file(tmp_path) == f  # the largest data file
    r = doctor.measure_reads(f, depths=[1, 2], block_bytes=1 << 20, bytes_per_row=4 << 20)
    assert {(row.in_flight, row.huge_pages) for row in r.rows} == {(1, True), (1, False),
                                                                    (2, True), (2, False)}
    assert all(row.gb_per_s > 0 for row in r.rows)
    assert r.bytes_per_row == 4 << 20 and r.file_bytes == 8 << 20
    best = r.best(True)
    assert best is not None and best.gb_per_s == max(x.gb_per_s for x in r.rows if x.huge_pages)
    table = "\n".join(doctor.read_lines(r))
    assert "| 2 |" in table and "disk bound for streaming" in table


@pytest.mark.parametrize("kwargs, message", [
    ({"block_bytes": 1000}, "multiple of 4096"),
    ({"block_bytes": 16 << 20}, "smaller than one read"),
    ({"depths": [0]}, "queue depths must be"),
])
def test_bad_measure_settings_are_refused(tmp_path: Path, kwargs: dict[str, object],
                                          message: str) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"\0" * (1 << 20))
    with pytest.raises(InvalidRequestError, match=message):
        doctor.measure_reads(f, **kwargs)  # type: ignore[arg-type]


def test_a_directory_without_model_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(InvalidRequestError, match="no model data file"):
        doctor.model_data_file(tmp_path)


def test_cli_doctor_json_and_table(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(os.urandom(2 << 20))
    out, err = io.StringIO(), io.StringIO()
    import sys

    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        rc = main(["doctor", str(tmp_path), "--json", "--depths", "1", "--read-mib", "1",
                   "--block-kib", "1024"])
        rc2 = main(["doctor", str(tmp_path), "--no-measure"])
    finally:
        sys.stdout, sys.stderr = old
    assert rc == 0 and rc2 == 0
    first, table = out.getvalue().split("\n", 1)
    record = json.loads(first)
    assert record["disk_bound_gb_per_s"] > 0
    assert record["system"]["path"] == str(tmp_path.resolve())
    assert "huge pages      transparent:" in table and "reads in flight" not in table


def test_cli_doctor_without_a_model_prints_the_settings(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``colibri doctor`` in a directory without a model file (issue 38, item 7): the
    machine's settings and exit 0, with a line saying how to measure a disk; a PATH given
    explicitly without a model file is still an error."""
    (tmp_path / "notes.txt").write_text("hi")
    monkeypatch.chdir(tmp_path)
    assert main(["doctor"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("colibri doctor\n") and "huge pages      transparent:" in out
    assert "reads in flight" not in out
    assert "no model file here" in err and "colibri doctor MODEL" in err
    assert main(["doctor", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["system"]["path"] == str(tmp_path.resolve())
    assert record.get("reads") is None and record.get("disk_bound_gb_per_s") is None
    assert main(["doctor", str(tmp_path)]) == 1
    assert "no model data file" in capsys.readouterr().err
