"""The performance-core and available-memory probes on recorded hardware trees (sysfs,
cgroup, /proc, sysctl).

Each test writes the few files the kernel would expose for a given machine into tmp_path
and points the probe at them, so the result does not depend on the machine running the
tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from colibri import hardware as plan
from colibri.errors import ConfigError
from colibri.hardware import (
    CoreCount,
    available_memory,
    cgroup_cpu_limit,
    cgroup_memory_headroom,
    parse_cpu_list,
    performance_cores,
    probe_available_memory,
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


# --- available memory ---------------------------------------------------------------------------

GiB, MiB = 1 << 30, 1 << 20
# PAGE_COUNTER_MAX pages of 4 KiB: what cgroup v1 reports for "no limit".
V1_UNLIMITED = "9223372036854771712"


def make_root(tmp_path: Path, *, mem_available_kb: int | None = 8 * 1024 * 1024,
              cgroup_lines: str = "0::/\n", v2: bool = True) -> Path:
    """A file system root with proc/meminfo, proc/self/cgroup and sys/fs/cgroup/."""
    root = tmp_path / "root"
    (root / "proc" / "self").mkdir(parents=True)
    lines = ["MemTotal:       16384000 kB", "MemFree:         1024000 kB"]
    if mem_available_kb is not None:
        lines.append(f"MemAvailable:   {mem_available_kb:>8} kB")
    lines += ["Buffers:           20000 kB", "Cached:          4000000 kB"]
    (root / "proc" / "meminfo").write_text("\n".join(lines) + "\n")
    (root / "proc" / "self" / "cgroup").write_text(cgroup_lines)
    cg = root / "sys" / "fs" / "cgroup"
    cg.mkdir(parents=True)
    if v2:
        (cg / "cgroup.controllers").write_text("cpu memory pids\n")
    return root


def v2_group(root: Path, rel: str, *, max_: str = "max", current: int = 0,
             inactive_file: int = 0, high: str | None = None) -> Path:
    d = root / "sys" / "fs" / "cgroup" / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.max").write_text(max_ + "\n")
    if high is not None:
        (d / "memory.high").write_text(high + "\n")
    (d / "memory.current").write_text(f"{current}\n")
    (d / "memory.stat").write_text(f"anon 1000\nfile 5000\ninactive_file {inactive_file}\n"
                                   "active_file 77\n")
    return d


def no_physical() -> int | None:
    return None


def test_meminfo_without_a_cgroup_limit(tmp_path: Path) -> None:
    root = make_root(tmp_path, mem_available_kb=8 * 1024 * 1024)
    r = probe_available_memory(root, platform="linux")
    assert (r.available, r.method, r.notes) == (8 * GiB, "MemAvailable", ())
    assert available_memory(root) == 8 * GiB


def test_cgroup_v2_limit_minus_usage_caps_meminfo(tmp_path: Path) -> None:
    # A container limited to 4 GiB, 1.5 GiB in use of which 0.5 GiB is inactive page cache:
    # 4 - (1.5 - 0.5) = 3 GiB of headroom, below the host's 8 GiB MemAvailable.
    root = make_root(tmp_path, cgroup_lines="0::/user.slice/app\n")
    d = v2_group(root, "user.slice/app", max_=str(4 * GiB), current=3 * GiB // 2,
                 inactive_file=GiB // 2)
    r = probe_available_memory(root, platform="linux")
    assert (r.available, r.method) == (3 * GiB, "cgroup v2 memory.max")
    assert any("cgroup memory limit" in n and str(d / "memory.max") in n for n in r.notes)
    cg = root / "sys" / "fs" / "cgroup"
    assert cgroup_memory_headroom(cg, root / "proc") == (
        3 * GiB, str(d / "memory.max"), "cgroup v2 memory.max")


def test_cgroup_v2_parent_limit_applies(tmp_path: Path) -> None:
    root = make_root(tmp_path, cgroup_lines="0::/a/b\n")
    v2_group(root, "a/b", max_="max", current=GiB)
    parent = v2_group(root, "a", max_=str(2 * GiB), current=GiB + 256 * MiB)
    # The parent's usage counts its other children too: 2 GiB - 1.25 GiB.
    assert available_memory(root) == 768 * MiB
    cg = root / "sys" / "fs" / "cgroup"
    assert cgroup_memory_headroom(cg, root / "proc")[1] == str(parent / "memory.max")


def test_cgroup_v2_memory_high_counts_as_a_limit(tmp_path: Path) -> None:
    root = make_root(tmp_path, cgroup_lines="0::/app\n")
    d = v2_group(root, "app", max_=str(4 * GiB), high=str(2 * GiB), current=GiB)
    assert available_memory(root) == GiB
    cg = root / "sys" / "fs" / "cgroup"
    assert cgroup_memory_headroom(cg, root / "proc")[1] == str(d / "memory.high")


def test_cgroup_v2_unlimited_and_usage_above_the_limit(tmp_path: Path) -> None:
    root = make_root(tmp_path, cgroup_lines="0::/app\n")
    v2_group(root, "app", max_="max", high="max", current=5 * GiB)
    assert available_memory(root) == 8 * GiB  # no limit: MemAvailable
    v2_group(root, "app", max_=str(GiB), current=2 * GiB)
    assert available_memory(root) == 0  # over the limit already: nothing left, not negative


def test_cgroup_v2_inside_a_container_namespace(tmp_path: Path) -> None:
    # With a cgroup namespace /proc/self/cgroup names a path that does not exist under the
    # mount; the mount root is the container's own cgroup then.
    root = make_root(tmp_path, cgroup_lines="0::/../../kubepods/pod1\n")
    cg = root / "sys" / "fs" / "cgroup"
    (cg / "memory.max").write_text(f"{2 * GiB}\n")
    (cg / "memory.current").write_text(f"{GiB}\n")
    assert available_memory(root) == GiB


def test_cgroup_v1_limit(tmp_path: Path) -> None:
    root = make_root(tmp_path, v2=False,
                     cgroup_lines="4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n0::/\n")
    d = root / "sys" / "fs" / "cgroup" / "memory" / "docker" / "abc"
    d.mkdir(parents=True)
    (d.parent.parent / "memory.limit_in_bytes").write_text(V1_UNLIMITED + "\n")
    (d / "memory.limit_in_bytes").write_text(f"{6 * GiB}\n")
    (d / "memory.usage_in_bytes").write_text(f"{3 * GiB}\n")
    (d / "memory.stat").write_text(f"cache 100\ninactive_file 1\ntotal_inactive_file {GiB}\n")
    r = probe_available_memory(root, platform="linux")
    assert (r.available, r.method) == (4 * GiB, "cgroup v1 memory.limit_in_bytes")


def test_cgroup_v1_unlimited_uses_meminfo(tmp_path: Path) -> None:
    root = make_root(tmp_path, v2=False, cgroup_lines="4:memory:/\n0::/\n")
    m = root / "sys" / "fs" / "cgroup" / "memory"
    m.mkdir()
    (m / "memory.limit_in_bytes").write_text(V1_UNLIMITED + "\n")
    (m / "memory.usage_in_bytes").write_text(f"{GiB}\n")
    assert probe_available_memory(root, platform="linux").method == "MemAvailable"


def test_old_kernel_without_memavailable(tmp_path: Path) -> None:
    root = make_root(tmp_path, mem_available_kb=None)
    r = probe_available_memory(root, platform="linux")
    assert r.available == (1024000 + 20000 + 4000000) * 1024
    assert any("MemFree + Buffers + Cached" in n for n in r.notes)


def test_nothing_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    r = probe_available_memory(empty, platform="linux", physical_memory=lambda: 16 * GiB)
    assert (r.available, r.method) == (16 * GiB, "physical memory")
    assert any("physical memory" in n for n in r.notes)
    r = probe_available_memory(empty, platform="linux", physical_memory=no_physical)
    assert r.available is None and r.method == ""
    monkeypatch.setattr(plan, "_physical_memory", no_physical)
    with pytest.raises(ConfigError, match=r"EngineConfig\.ram_budget: the available memory "
                       r"could not be determined .* set EngineConfig\.ram_budget"):
        available_memory(empty)


def test_garbage_memory_files_do_not_crash(tmp_path: Path) -> None:
    root = make_root(tmp_path, cgroup_lines="garbage\n0::/app\n")
    (root / "proc" / "meminfo").write_text("MemAvailable: lots kB\nMemFree: 2048 kB\n")
    v2_group(root, "app", max_="a lot", current=0)
    r = probe_available_memory(root, platform="linux")
    assert r.available == 2048 * 1024


def test_other_platforms_use_physical_memory() -> None:
    r = probe_available_memory(platform="darwin", physical_memory=lambda: 32 * GiB)
    assert (r.available, r.method) == (32 * GiB, "physical memory")
    assert any("darwin" in n for n in r.notes)


def test_this_machines_memory() -> None:
    r = probe_available_memory()
    print(r)
    assert r.available is not None and r.available > 0
    assert available_memory() > 0
