"""The performance-core probe on recorded hardware trees (sysfs, cgroup, sysctl).

Each test writes the few files the kernel would expose for a given machine into tmp_path
and points the probe at them, so the result does not depend on the machine running the
tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from colibri.plan import (
    CoreCount,
    cgroup_cpu_limit,
    parse_cpu_list,
    performance_cores,
    probe_performance_cores,
)


def _cpu_list(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def make_sysfs(
    root: Path,
    cores: list[list[int]],
    *,
    packages: list[int] | None = None,
    p_cpus: Iterable[int] | None = None,
    e_cpus: Iterable[int] | None = None,
    sibling_lists: bool = True,
) -> Path:
    """Writes /sys/devices/system/cpu for `cores`, each a list of its logical CPUs
    (SMT siblings). packages[i] is core i's package (default 0). p_cpus/e_cpus make it a
    hybrid Intel part (cpu_core / cpu_atom PMU devices). Without sibling_lists only
    core_id and physical_package_id are written (older kernels)."""
    cpu_dir = root / "devices" / "system" / "cpu"
    all_cpus = sorted(c for core in cores for c in core)
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(f"0-{max(all_cpus)}\n")
    core_ids: dict[int, int] = {}
    for i, core in enumerate(cores):
        pkg = packages[i] if packages else 0
        core_ids[pkg] = core_ids.get(pkg, -1) + 1
        for cpu in core:
            topo = cpu_dir / f"cpu{cpu}" / "topology"
            topo.mkdir(parents=True)
            (topo / "core_id").write_text(f"{core_ids[pkg]}\n")
            (topo / "physical_package_id").write_text(f"{pkg}\n")
            if sibling_lists:
                (topo / "thread_siblings_list").write_text(_cpu_list(core) + "\n")
                (topo / "core_cpus_list").write_text(_cpu_list(core) + "\n")
    if p_cpus is not None:
        (root / "devices" / "cpu_core").mkdir(parents=True)
        (root / "devices" / "cpu_core" / "cpus").write_text(_cpu_list(p_cpus) + "\n")
    if e_cpus is not None:
        (root / "devices" / "cpu_atom").mkdir(parents=True)
        (root / "devices" / "cpu_atom" / "cpus").write_text(_cpu_list(e_cpus) + "\n")
    return root


def smt_cores(n_cores: int, first_cpu: int = 0) -> list[list[int]]:
    """Linux numbering of an SMT-2 part: core i has CPUs i and i + n_cores."""
    return [[first_cpu + i, first_cpu + i + n_cores] for i in range(n_cores)]


def empty_cgroup(tmp_path: Path) -> tuple[Path, Path]:
    """A cgroup v2 mount without a quota and a /proc/self/cgroup pointing at the root."""
    cg = tmp_path / "cgroup"
    cg.mkdir()
    (cg / "cgroup.controllers").write_text("cpu memory\n")
    (cg / "cpu.max").write_text("max 100000\n")
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/\n")
    return cg, proc


def probe_linux(tmp_path: Path, sysfs: Path, affinity: Iterable[int],
                cgroup: tuple[Path, Path] | None = None) -> CoreCount:
    cg, proc = cgroup or empty_cgroup(tmp_path)
    return probe_performance_cores(platform="linux", sysfs_root=sysfs, cgroup_root=cg,
                                   proc_root=proc, affinity=affinity, cpu_count=999)


# --- macOS --------------------------------------------------------------------------------------


def fake_sysctl(values: dict[str, str]) -> Callable[[str], str | None]:
    """A recorded `sysctl -n`: the value, or None for a name this machine lacks."""
    return values.get


def test_m1_max_counts_performance_cores_only() -> None:
    # M1 Max: 8 P + 2 E cores, no SMT. hw.physicalcpu (10) would include the E-cores.
    r = probe_performance_cores(platform="darwin", cpu_count=10, sysctl=fake_sysctl({
        "hw.perflevel0.logicalcpu": "8", "hw.perflevel1.logicalcpu": "2",
        "hw.physicalcpu": "10", "hw.logicalcpu": "10"}))
    assert r.count == 8
    assert r.method == "sysctl hw.perflevel0.logicalcpu"
    assert r.notes == ()


def test_intel_mac_without_perflevel_uses_physicalcpu() -> None:
    # An 8-core/16-thread Intel Mac: no hw.perflevel* at all.
    r = probe_performance_cores(platform="darwin", cpu_count=16, sysctl=fake_sysctl({
        "hw.physicalcpu": "8", "hw.logicalcpu": "16"}))
    assert r.count == 8
    assert r.method == "sysctl hw.physicalcpu"
    assert any("perflevel0" in n for n in r.notes)


def test_mac_without_any_sysctl_falls_back_to_cpu_count() -> None:
    r = probe_performance_cores(platform="darwin", cpu_count=4, sysctl=fake_sysctl({}))
    assert (r.count, r.method) == (4, "os.cpu_count")
    assert len(r.notes) == 2


def test_mac_sysctl_garbage_and_errors_do_not_crash() -> None:
    def broken(name: str) -> str | None:
        if name == "hw.perflevel0.logicalcpu":
            return "not a number"
        raise OSError("sysctl vanished")

    r = probe_performance_cores(platform="darwin", cpu_count=6, sysctl=broken)
    assert r.count == 6


# --- Linux --------------------------------------------------------------------------------------


def test_x86_8_cores_16_threads_gives_8(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path / "sys", smt_cores(8))
    r = probe_linux(tmp_path, sysfs, affinity=range(16))
    assert (r.count, r.method) == (8, "sysfs topology")


def test_without_sibling_lists_core_id_and_package_are_used(tmp_path: Path) -> None:
    # Two packages of 4 SMT cores each: core_id repeats across packages.
    cores = smt_cores(8)
    sysfs = make_sysfs(tmp_path / "sys", cores, packages=[0, 0, 0, 0, 1, 1, 1, 1],
                       sibling_lists=False)
    assert probe_linux(tmp_path, sysfs, affinity=range(16)).count == 8


def test_affinity_of_three_cpus_on_smt_machine(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path / "sys", smt_cores(8))
    cg = empty_cgroup(tmp_path)
    # CPUs 0 and 8 are the two threads of core 0; CPU 1 is core 1: two cores.
    assert probe_linux(tmp_path, sysfs, affinity={0, 8, 1}, cgroup=cg).count == 2
    # Three CPUs on three different cores: three cores.
    assert probe_linux(tmp_path, sysfs, affinity={0, 1, 2}, cgroup=cg).count == 3


def test_cgroup_v2_quota_of_1_5_cpus_gives_2(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path / "sys", smt_cores(8))
    cg, proc = empty_cgroup(tmp_path)
    (proc / "self" / "cgroup").write_text("0::/app/worker\n")
    (cg / "app" / "worker").mkdir(parents=True)
    (cg / "app" / "worker" / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(cg, proc) == (1.5, str(cg / "app" / "worker" / "cpu.max"))
    r = probe_linux(tmp_path, sysfs, affinity=range(16), cgroup=(cg, proc))
    assert r.count == 2
    assert any("quota" in n for n in r.notes)


def test_cgroup_v2_parent_quota_applies(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path / "sys", smt_cores(8))
    cg, proc = empty_cgroup(tmp_path)
    (proc / "self" / "cgroup").write_text("0::/app/worker\n")
    (cg / "app" / "worker").mkdir(parents=True)
    (cg / "app" / "cpu.max").write_text("300000 100000\n")
    (cg / "app" / "worker" / "cpu.max").write_text("max 100000\n")
    assert probe_linux(tmp_path, sysfs, affinity=range(16), cgroup=(cg, proc)).count == 3


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path / "sys", smt_cores(8))
    cg = tmp_path / "cgroup"
    (cg / "cpu,cpuacct").mkdir(parents=True)
    (cg / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("250000\n")
    (cg / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    # Inside a container the path names a host cgroup that is not under the mount.
    (proc / "self" / "cgroup").write_text("4:cpu,cpuacct:/docker/abc\n0::/\n")
    assert cgroup_cpu_limit(cg, proc)[0] == 2.5
    assert probe_linux(tmp_path, sysfs, affinity=range(16), cgroup=(cg, proc)).count == 3


def test_cgroup_v1_unlimited(tmp_path: Path) -> None:
    cg = tmp_path / "cgroup"
    (cg / "cpu").mkdir(parents=True)
    (cg / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (cg / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(cg, tmp_path / "no-proc") == (None, "")


def test_quota_never_raises_the_count(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path / "sys", smt_cores(2))
    cg, proc = empty_cgroup(tmp_path)
    (cg / "cpu.max").write_text("800000 100000\n")
    assert probe_linux(tmp_path, sysfs, affinity=range(4), cgroup=(cg, proc)).count == 2


def test_hybrid_intel_6p_8e_gives_6(tmp_path: Path) -> None:
    # i7-12700H-like: 6 P-cores with SMT (CPUs 0-11, siblings adjacent) + 8 E-cores (12-19).
    cores = [[2 * i, 2 * i + 1] for i in range(6)] + [[12 + i] for i in range(8)]
    sysfs = make_sysfs(tmp_path / "sys", cores, p_cpus=range(12), e_cpus=range(12, 20))
    r = probe_linux(tmp_path, sysfs, affinity=range(20))
    assert r.count == 6
    assert any("efficiency" in n for n in r.notes)


def test_hybrid_intel_affinity_on_e_cores_only(tmp_path: Path) -> None:
    cores = [[2 * i, 2 * i + 1] for i in range(6)] + [[12 + i] for i in range(8)]
    sysfs = make_sysfs(tmp_path / "sys", cores, p_cpus=range(12), e_cpus=range(12, 20))
    # A process pinned to E-cores still gets a team (of those cores).
    assert probe_linux(tmp_path, sysfs, affinity={12, 13, 14}).count == 3


def test_missing_sysfs_falls_back_to_affinity_with_reason(tmp_path: Path) -> None:
    r = probe_linux(tmp_path, tmp_path / "no-sys", affinity=range(6))
    assert (r.count, r.method) == (6, "affinity mask")
    assert any("no CPUs listed" in n for n in r.notes)


def test_missing_topology_counts_logical_cpus(tmp_path: Path) -> None:
    cpu_dir = tmp_path / "sys" / "devices" / "system" / "cpu"
    for c in range(4):
        (cpu_dir / f"cpu{c}").mkdir(parents=True)
    r = probe_linux(tmp_path, tmp_path / "sys", affinity=range(4))
    assert (r.count, r.method) == (4, "affinity mask")
    assert any("no usable core topology" in n for n in r.notes)


def test_garbage_files_do_not_crash(tmp_path: Path) -> None:
    sysfs = make_sysfs(tmp_path / "sys", smt_cores(2))
    cpu_dir = sysfs / "devices" / "system" / "cpu"
    (cpu_dir / "online").write_text("zero-three\n")
    (cpu_dir / "cpu0" / "topology" / "core_cpus_list").write_text("??\n")
    (cpu_dir / "cpu0" / "topology" / "thread_siblings_list").write_text("\n")
    cg, proc = empty_cgroup(tmp_path)
    (cg / "cpu.max").write_text("lots 100000\n")
    r = probe_linux(tmp_path, sysfs, affinity=range(4), cgroup=(cg, proc))
    assert r.count == 2


def test_unknown_platform_uses_cpu_count() -> None:
    r = probe_performance_cores(platform="win32", cpu_count=12)
    assert (r.count, r.method) == (12, "os.cpu_count")
    assert r.notes


def test_parse_cpu_list() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("") == set()


def test_this_machine() -> None:
    import os

    r = probe_performance_cores()
    print(r)
    assert 1 <= r.count <= (os.cpu_count() or 1)
    assert performance_cores() == r.count
