"""What a Ray Serve deployment of colibri is made of, as plain data (no Ray import): the
model each replica loads, the server options each replica's app gets, and how Ray
places, routes and scales the replicas. ``colibri serve --ray`` builds these from its
flags; Python callers build them directly (docs/serving.md, "Several machines")."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Literal

from ...errors import ConfigError
from ...settings.config import EngineConfig

Placement = Literal["node", "numa", "any"]
Router = Literal["prefix", "pow2"]

PLACEMENTS: tuple[Placement, ...] = ("node", "numa", "any")
ROUTERS: tuple[Router, ...] = ("prefix", "pow2")

# The custom Ray resource a NUMA-placed replica asks for: start each node with
# `ray start --resources '{"colibri_numa": K}'` for its K NUMA nodes.
NUMA_RESOURCE = "colibri_numa"


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    """What one replica loads and serves: ``Model.load(model, engine, cache_dir=...,
    download=...)``
    then ``colibri.server.create_app(model, **server)``. The model path must name the
    same files on every machine (each machine reads its own copy from its own disk)."""

    model: str
    engine: EngineConfig | None = None
    cache_dir: str | None = None
    server: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    numa: bool = False  # claim one NUMA node of the machine and pin to its CPUs
    download: bool = False  # fetch a Hugging Face repository id missing from the cache

    def __post_init__(self) -> None:
        if "close_model" in self.server:
            raise ConfigError("ReplicaSpec.server: close_model is set by the replica itself")
        if isinstance(self.model, os.PathLike):
            object.__setattr__(self, "model", os.fspath(self.model))


@dataclasses.dataclass(frozen=True)
class RayServeConfig:
    """How Ray runs the replicas.

    ``num_replicas``: a fixed count, ``"auto"`` (Ray's default autoscaling), or None with
    ``autoscaling_config`` set (a mapping passed to Ray Serve as is: ``min_replicas``,
    ``max_replicas``, ``target_ongoing_requests``, ``upscale_delay_s``...). With neither,
    one replica per alive node of the cluster (``placement="node"``) or one per
    ``colibri_numa`` resource unit (``"numa"``), else 1.

    ``placement``: ``"node"`` (default) at most one replica per Ray node
    (``max_replicas_per_node=1``); ``"numa"`` one per NUMA node: each replica asks for one
    unit of the ``colibri_numa`` custom resource and pins itself to a free NUMA node's
    CPUs; ``"any"`` no constraint (several replicas on one machine: tests, small models).

    ``router``: ``"prefix"`` (default) Ray's PrefixCacheAffinityRouter (requests whose
    prompt text extends one a replica served go back to it), ``"pow2"`` Ray's default
    power-of-two-choices on queue length. ``router_kwargs`` go to the router
    (``imbalanced_threshold``, ``match_rate_threshold``, ``do_eviction``...).

    ``max_ongoing_requests``: requests Ray sends one replica at once (default: its
    ``max_running`` + ``max_queue``, so the replica's own queue answers 429 when full).
    ``replica_cpus``: the logical CPUs Ray accounts for one replica (the engine's threads
    are set by its EngineConfig). ``ingress_replicas``: copies of the HTTP ingress."""

    num_replicas: int | Literal["auto"] | None = None
    autoscaling_config: Mapping[str, Any] | None = None
    placement: Placement = "node"
    router: Router = "prefix"
    router_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    max_ongoing_requests: int | None = None
    max_queued_requests: int = -1
    replica_cpus: float = 1.0
    ingress_replicas: int = 1
    app_name: str = "colibri"

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement {self.placement!r}: use one of {', '.join(PLACEMENTS)}")
        if self.router not in ROUTERS:
            raise ConfigError(f"router {self.router!r}: use one of {', '.join(ROUTERS)}")
        n = self.num_replicas
        if n is not None and n != "auto" and (isinstance(n, bool) or not isinstance(n, int)
                                              or n < 1):
            raise ConfigError(f"num_replicas {n!r}: a count >= 1, 'auto' or None")
        if n is not None and self.autoscaling_config is not None:
            raise ConfigError("give num_replicas or autoscaling_config, not both")
        if self.max_ongoing_requests is not None and self.max_ongoing_requests < 1:
            raise ConfigError("max_ongoing_requests must be >= 1")
        if self.replica_cpus < 0:
            raise ConfigError("replica_cpus must be >= 0")
        if self.ingress_replicas < 1:
            raise ConfigError("ingress_replicas must be >= 1")


def autoscaling_from_flags(min_replicas: int | None, max_replicas: int | None,
                           target_ongoing: float | None) -> dict[str, Any] | None:
    """Ray Serve's autoscaling_config from ``--min-replicas/--max-replicas/--target-
    ongoing-requests``; None when none is given."""
    if min_replicas is None and max_replicas is None and target_ongoing is None:
        return None
    cfg: dict[str, Any] = {}
    if min_replicas is not None:
        if min_replicas < 0:
            raise ConfigError("--min-replicas must be >= 0")
        cfg["min_replicas"] = min_replicas
    if max_replicas is not None:
        if max_replicas < 1 or (min_replicas is not None and max_replicas < min_replicas):
            raise ConfigError("--max-replicas must be >= 1 and >= --min-replicas")
        cfg["max_replicas"] = max_replicas
    if target_ongoing is not None:
        if target_ongoing <= 0:
            raise ConfigError("--target-ongoing-requests must be > 0")
        cfg["target_ongoing_requests"] = target_ongoing
    return cfg
