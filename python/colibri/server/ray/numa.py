"""One replica per NUMA node (``placement="numa"``, no Ray import): each replica claims a
NUMA node no other replica on the machine holds and pins itself to that node's CPUs
before it loads the model, so the engine's threads (and, by first touch, the memory they
fill) stay on the node. The claim is an exclusive ``flock`` on a file per node in the
system's temporary directory, released by the kernel when the replica's process ends,
so a crashed replica never keeps a node. Memory is not bound (no ``mbind``): pages land
where the pinned threads first touch them."""

from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ...errors import ConfigError

_NODES = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def numa_nodes(root: Path = _NODES) -> dict[int, list[int]]:
    """NUMA node -> its CPUs (nodes without CPUs left out); {} where sysfs has none."""
    nodes: dict[int, list[int]] = {}
    for d in sorted(root.glob("node[0-9]*")) if root.is_dir() else ():
        try:
            cpus = parse_cpulist((d / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cpus:
            nodes[int(d.name[4:])] = cpus
    return nodes


@dataclass
class NumaClaim:
    node: int
    cpus: list[int]
    _lock: IO[str]  # held open: closing it (or the process ending) frees the node


def claim_numa_node(root: Path = _NODES, lock_dir: str | None = None) -> NumaClaim:
    """Claims a free NUMA node and pins this process to its CPUs."""
    nodes = numa_nodes(root)
    if not nodes:
        raise ConfigError("placement 'numa': this machine reports no NUMA nodes "
                          f"({root}); use placement 'node'")
    lock_dir = lock_dir or tempfile.gettempdir()
    for node, cpus in nodes.items():
        f = open(os.path.join(lock_dir, f"colibri-numa-{node}.lock"), "w")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            continue
        os.sched_setaffinity(0, cpus)
        return NumaClaim(node, cpus, f)
    raise ConfigError(f"placement 'numa': all {len(nodes)} NUMA nodes of this machine "
                      "already hold a replica; give the node as many colibri_numa "
                      "resources as it has NUMA nodes (ray start --resources)")
