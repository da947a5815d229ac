"""A RAM-backed block device that accepts O_DIRECT, and a read throttle on a device: the
fast-disk test bed of benchmarks/fast_disk.py (root only, every step undone on exit).

* :class:`RamDisk`: the ``brd`` module's /dev/ram0 where the kernel has it, else a loop
  device over a file in /dev/shm (``losetup --direct-io=on``, which the kernel may refuse
  for a tmpfs file: the loop device then reads its file through the page cache, which for
  tmpfs *is* the file, so the reads stay RAM-speed), with an ext4 file system mounted on a
  fresh directory under /tmp. Reads of a file there with O_DIRECT reach the block device
  (the loop driver), never the file system's page cache. On exit: unmount, detach,
  delete the backing file and the directory, whatever failed before.
* :class:`ReadThrottle`: the calling process (and the children it starts from then on)
  in a blkio cgroup whose read rate on the device is capped: cgroup v2 ``io.max`` (``rbps``)
  where the io controller is available, else cgroup v1 ``blkio.throttle.read_bps_device``
  (the same throttle in the v1 hierarchy). On exit the process goes back to its own cgroup
  and the new one is removed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import _cgroup as cg

CGROUP = Path("/sys/fs/cgroup")


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def device_size(payload_bytes: int, slack: float = 0.15, extra: int = 96 << 20) -> int:
    """Bytes of a RAM device that holds `payload_bytes` of files under ext4: the payload
    plus `slack` of it (metadata, journal) plus `extra`, rounded up to 1 MiB."""
    n = int(payload_bytes * (1 + slack)) + extra
    return -(-n // (1 << 20)) << 20


def dev_numbers(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(major, minor) of the block device holding `path` (what a throttle names)."""
    st = os.stat(path)
    return os.major(st.st_dev), os.minor(st.st_dev)


def throttle_line(version: int, major: int, minor: int, bytes_per_s: int) -> str:
    """The line that caps reads of one device: io.max (v2) or blkio.throttle.*(v1)."""
    if bytes_per_s <= 0:
        raise ValueError(f"a read throttle needs a positive rate, got {bytes_per_s}")
    if version == 2:
        return f"{major}:{minor} rbps={bytes_per_s}"
    return f"{major}:{minor} {bytes_per_s}"


class RamDisk:
    """``with RamDisk(size) as rd: rd.mount`` — an ext4 file system in RAM (see module)."""

    def __init__(self, size: int, max_size: int = 6 << 30, log: Any = print) -> None:
        if size > max_size:
            raise ValueError(f"a RAM device of {cg.fmt_bytes(size)} is over the cap of "
                             f"{cg.fmt_bytes(max_size)} (a smaller preset, or raise the cap)")
        self.size, self.log = size, log
        self.kind = ""
        self.device: str | None = None
        self.backing: Path | None = None
        self.mount: Path | None = None
        self.direct_io: str = "n/a"

    def __enter__(self) -> RamDisk:
        try:
            self._attach()
            _run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                  str(self.device)])
            self.mount = Path(tempfile.mkdtemp(prefix="colibri-fastdisk-", dir="/tmp"))
            _run(["mount", "-o", "noatime", str(self.device), str(self.mount)])
        except BaseException:
            self.close()
            raise
        self.log(f"RAM device: {self.kind} {self.device} ({cg.fmt_bytes(self.size)}), ext4 "
                 f"at {self.mount}; loop direct I/O: {self.direct_io}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _attach(self) -> None:
        # brd: only where the module is already there or modprobe can load it
        if shutil.which("modprobe") and not Path("/sys/module/brd").exists():
            _run(["modprobe", "brd", "rd_nr=1", f"rd_size={self.size >> 10}"], check=False)
        if Path("/sys/module/brd").exists() and Path("/dev/ram0").exists():
            if int(Path("/sys/block/ram0/size").read_text()) * 512 >= self.size:
                self.kind, self.device = "brd", "/dev/ram0"
                return
        self.backing = Path(tempfile.mkstemp(prefix="colibri-fastdisk-", suffix=".img",
                                             dir="/dev/shm")[1])
        os.truncate(self.backing, self.size)
        p = _run(["losetup", "--find", "--show", "--direct-io=on", str(self.backing)],
                 check=False)
        if p.returncode != 0:  # older losetup / kernel: no direct-io option
            p = _run(["losetup", "--find", "--show", str(self.backing)])
        self.kind, self.device = "loop over /dev/shm", p.stdout.strip()
        name = Path(self.device).name
        dio = Path(f"/sys/block/{name}/loop/dio")
        self.direct_io = ("on" if dio.read_text().strip() == "1" else
                          "off (the kernel refused it for a tmpfs file: the loop reads "
                          "through tmpfs's pages, RAM either way)") if dio.exists() else "?"

    def close(self) -> None:
        """Unmount, detach, delete: each step tried even when an earlier one failed."""
        if self.mount is not None:
            if os.path.ismount(self.mount):
                _run(["umount", str(self.mount)], check=False)
            if not os.path.ismount(self.mount):
                shutil.rmtree(self.mount, ignore_errors=True)
                self.mount = None
        if self.device and self.kind.startswith("loop"):
            _run(["losetup", "-d", self.device], check=False)
            self.device = None
        if self.backing is not None:
            self.backing.unlink(missing_ok=True)
            self.backing = None


class ReadThrottle:
    """``with ReadThrottle(path, bytes_per_s):`` this process and its later children read
    the device holding `path` at most that fast (see module). bytes_per_s None: no-op."""

    def __init__(self, path: str | os.PathLike[str], bytes_per_s: int | None,
                 name: str = "colibri-throttle") -> None:
        self.path, self.bps, self.name = str(path), bytes_per_s, name
        self.dir: Path | None = None
        self.home: Path | None = None
        self.version = 0

    def _where(self) -> tuple[int, Path, Path]:
        """(version, the hierarchy's root, this process's cgroup in it)."""
        own = cg.parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
        v2 = CGROUP / "unified" if (CGROUP / "unified").is_dir() else CGROUP
        ctrl = v2 / "cgroup.controllers"
        if ctrl.exists() and "io" in ctrl.read_text().split() and "" in own:
            return 2, v2, v2 / own[""].lstrip("/")
        if (CGROUP / "blkio").is_dir() and "blkio" in own:
            return 1, CGROUP / "blkio", CGROUP / "blkio" / own["blkio"].lstrip("/")
        raise RuntimeError("no cgroup io (v2) or blkio (v1) controller to throttle with")

    def __enter__(self) -> ReadThrottle:
        if not self.bps:
            return self
        self.version, root, self.home = self._where()
        self.dir = root / f"{self.name}-{os.getpid()}"
        self.dir.mkdir(exist_ok=True)
        try:
            major, minor = dev_numbers(self.path)
            line = throttle_line(self.version, major, minor, self.bps)
            knob = "io.max" if self.version == 2 else "blkio.throttle.read_bps_device"
            (self.dir / knob).write_text(line)
            (self.dir / "cgroup.procs").write_text(str(os.getpid()))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.dir is None:
            return
        if self.home is not None:
            try:
                (self.home / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                pass
        try:
            self.dir.rmdir()
        except OSError:
            pass
        self.dir = None

    def describe(self) -> str:
        if not self.bps:
            return "unthrottled"
        how = "io.max rbps (cgroup v2)" if self.version == 2 else \
            "blkio.throttle.read_bps_device (cgroup v1)"
        return f"{self.bps / 1e9:.2f} GB/s ({how})"
