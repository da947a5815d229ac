"""ClusterConfig: routed experts computed by expert workers on a Ray cluster
(``EngineConfig(cluster=...)``, docs/cluster.md).

Validated like every other settings class: an unknown name or a bad value raises
:class:`colibri.errors.ConfigError` naming the field. Only the settings live here; the
workers and the coordinator's side are colibri.engine.cluster (Ray is imported there, and
only when a model loads with a cluster).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..errors import ConfigError
from .fields import RAM_BUDGET, _int, optional_path
from .table import Check, Setting, Settings

__all__ = ["CLUSTER", "MAX_WORKERS", "ClusterConfig", "as_cluster"]

MAX_WORKERS = 256
"""Most expert workers one model spreads its experts over."""

MAX_TIMEOUT_S = 24 * 3600.0


def _address(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{field}: expected a Ray address: \"auto\" (the cluster this machine "
                          f"joined with `ray start`), \"local\" (start Ray in this process), "
                          f"\"host:port\" or \"ray://host:port\", got {type(value).__name__} "
                          f"{value!r}")
    text = value.strip()
    if text in ("auto", "local"):
        return text
    hostport = text.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{field}: {value!r} is not an address; use \"host:port\" (the head "
                          f"node's GCS port, 6379 by default), \"ray://host:port\", \"auto\" "
                          f"or \"local\"")
    return text


def _seconds(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{field}: expected seconds (a number), got {type(value).__name__} "
                          f"{value!r}")
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
        raise ConfigError(f"{field}: {value!r} is out of range; allowed more than 0 and at "
                          f"most {MAX_TIMEOUT_S:g} seconds")
    return float(value)


class ClusterConfig(Settings):
    """Where the expert workers run and how long the coordinator waits for them.

    The coordinator (the process that loads the model) keeps the dense weights, attention,
    KV caches, routing and sampling; ``workers`` Ray actors each load the same model file
    and compute one contiguous share of every MoE layer's routed experts. Outputs are the
    same bits as without a cluster.
    """

    address: Setting[str, str] = Setting(
        Check(_address), default="auto",
        doc='the Ray cluster: "auto", "local", "host:port" or "ray://host:port"')
    """``"auto"`` (default): the cluster this machine joined (``ray start --head`` or
    ``ray start --address ...``). ``"local"``: start a one-machine Ray inside this process
    (tests, trying it out). ``"host:port"``: the head node's address; ``"ray://host:port"``:
    a Ray Client address."""

    workers: Setting[int, int] = Setting(
        Check(lambda field, value: _int(field, value, 1, MAX_WORKERS, "workers")), default=2,
        doc="expert worker actors; each owns a contiguous share of every layer's experts")
    """Expert worker actors, 1..MAX_WORKERS (default 2). Worker ``w`` of ``W`` owns experts
    ``[w * E // W, (w + 1) * E // W)`` of every MoE layer (E: the model's routed experts)."""

    model_path: Setting[str | None, str | None] = Setting(
        optional_path("the path the coordinator loaded"), default=None,
        doc="the model's path on the worker machines (None: the coordinator's path)")
    """Where the workers find the model file (or directory) on their machines; ``None``
    (default): the path the coordinator loaded. Every worker must hold the same file: one
    whose fingerprint differs is refused at load."""

    worker_cpus: Setting[int, int] = Setting(
        Check(lambda field, value: _int(field, value, 1, 4096, "CPUs")), default=1,
        doc="the CPUs Ray reserves for each worker (its compute team is sized by the machine)")
    """The ``num_cpus`` Ray reserves for each worker actor (default 1), which decides how
    many fit on one node. The worker's compute team follows the coordinator's
    ``EngineConfig.threads`` resolved on the worker's machine."""

    worker_ram_budget: Setting[int | str | None, int | None] = Setting(
        RAM_BUDGET, default=None,
        doc="each worker's EngineConfig.ram_budget on its machine, e.g. 64GiB")
    """Each worker's ``EngineConfig.ram_budget`` (bytes or a size text): its resident
    weights, buffers and the expert cache that holds its share of the experts. ``None``
    (default): the memory the worker's process may use on its machine, less the margin."""

    connect_timeout: Setting[int | float, float] = Setting(
        Check(_seconds), default=120.0,
        doc="seconds to reach the cluster and have every worker loaded")
    """Seconds to connect to Ray and have every worker load its model (default 120); past
    it :class:`colibri.errors.ClusterError`."""

    call_timeout: Setting[int | float, float] = Setting(
        Check(_seconds), default=60.0, doc="seconds one layer's request to a worker may take")
    """Seconds one MoE layer's request to one worker may take (default 60; a cold worker
    reads its experts from disk first); past it the forward fails with
    :class:`colibri.errors.ClusterError` and the session is unchanged."""

    def owner(self, expert: int, n_experts: int) -> int:
        """The worker that owns `expert` of a layer of `n_experts` routed experts."""
        return next(w for w in range(self.workers) if expert < (w + 1) * n_experts // self.workers)

    def shard(self, worker: int, n_experts: int) -> range:
        """The experts of one layer that `worker` owns."""
        return range(worker * n_experts // self.workers, (worker + 1) * n_experts // self.workers)


def as_cluster(value: object, field: str = "cluster") -> ClusterConfig | None:
    """A ClusterConfig from a ClusterConfig or a mapping of its fields; None stays None
    (no cluster: every expert computed in this process)."""
    if value is None or isinstance(value, ClusterConfig):
        return value
    if isinstance(value, Mapping):
        return ClusterConfig.from_dict(value)
    raise ConfigError(f"{field}: expected a colibri.ClusterConfig, a mapping of its fields or "
                      f"None, got {type(value).__name__}")


CLUSTER: Check[ClusterConfig | None] = Check(lambda field, value: as_cluster(value, field))
"""The check of EngineConfig.cluster: None (the default) is no cluster."""
