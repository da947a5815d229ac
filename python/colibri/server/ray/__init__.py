"""Scale-out on Ray Serve: several replicas of one colibri model (one per machine by
default) behind one OpenAI- and Anthropic-compatible HTTP ingress, with Ray's
prefix-aware request routing (docs/serving.md, "Several machines").

Needs the ``ray`` extra (``pip install 'colibri[ray]'``); Ray is imported only when a
deployment is built, so ``import colibri.server.ray`` works without it.

    import ray
    from ray import serve
    from colibri.server.ray import RayServeConfig, ReplicaSpec, build_app

    ray.init(address="auto")                 # the cluster (ray start --head / --address)
    serve.start(http_options={"host": "0.0.0.0", "port": 8000})
    app = build_app(ReplicaSpec("/models/qwen3-30b.gguf", server={"api_key": "sk-..."}),
                    RayServeConfig(placement="node"))
    serve.run(app, name="colibri", route_prefix="/")
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from ...errors import ConfigError, UnsupportedError
from .config import NUMA_RESOURCE, RayServeConfig, ReplicaSpec, autoscaling_from_flags

__all__ = ["NUMA_RESOURCE", "RayServeConfig", "ReplicaSpec", "autoscaling_from_flags",
           "build_app", "prefix_router_class", "require_ray"]

# Ray Serve's prefix-aware router. Its public home, ray.serve.llm, imports Ray Serve
# LLM's engine stack (pyarrow and more: the ray[llm] extra); the same class is importable
# from its implementation module with ray[serve] alone (Ray 2.60), which is the fallback.
_PREFIX_ROUTERS = (
    "ray.serve.llm.request_router.PrefixCacheAffinityRouter",
    "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router."
    "PrefixCacheAffinityRouter",
)


def require_ray() -> Any:
    """The ``ray.serve`` module, or a clear error when Ray is not installed."""
    try:
        from ray import serve
    except ImportError as exc:
        raise UnsupportedError(
            f"Ray Serve scale-out needs the ray extra ({exc.name} is missing): "
            "pip install 'colibri[ray]'") from exc
    return serve


def prefix_router_class() -> str:
    """The import path of Ray's PrefixCacheAffinityRouter in the installed Ray."""
    for path in _PREFIX_ROUTERS:
        module, _, name = path.rpartition(".")
        try:
            if hasattr(importlib.import_module(module), name):
                return path
        except ImportError:
            continue
    raise UnsupportedError("this Ray has no PrefixCacheAffinityRouter (Ray Serve >= 2.47 "
                           "has it); upgrade Ray or use router 'pow2' (--ray-router pow2)")


def _default_replicas(config: RayServeConfig) -> int:
    """One per alive node ("node"), one per colibri_numa unit ("numa"), else 1."""
    import ray

    if not ray.is_initialized():
        return 1
    ray_api: Any = ray  # untyped functions
    if config.placement == "numa":
        return max(1, int(ray_api.cluster_resources().get(NUMA_RESOURCE, 0)))
    if config.placement == "node":
        return max(1, len([n for n in ray_api.nodes() if n.get("Alive")]))
    return 1


def build_app(spec: ReplicaSpec, config: RayServeConfig | None = None) -> Any:
    """The Ray Serve application (``serve.run(app, route_prefix="/")``): the ingress
    bound to the replicas' deployment, configured by `config`."""
    config = config or RayServeConfig()
    serve = require_ray()
    from ray.serve.config import RequestRouterConfig

    from .deployments import ColibriIngress, ColibriReplica

    server = dict(spec.server)
    running = int(server.get("max_running", 4))
    queue = int(server.get("max_queue", 16))
    if config.placement == "numa" and not spec.numa:
        spec = dataclasses.replace(spec, numa=True)
    options: dict[str, Any] = {
        "name": "ColibriReplica",
        "max_ongoing_requests": config.max_ongoing_requests or max(1, running + queue),
        "max_queued_requests": config.max_queued_requests,
        "ray_actor_options": {"num_cpus": config.replica_cpus},
    }
    if config.autoscaling_config is not None:
        options["autoscaling_config"] = dict(config.autoscaling_config)
    else:
        options["num_replicas"] = (config.num_replicas if config.num_replicas is not None
                                   else _default_replicas(config))
    if config.placement == "node":
        options["max_replicas_per_node"] = 1
    elif config.placement == "numa":
        options["ray_actor_options"]["resources"] = {NUMA_RESOURCE: 1}
    if config.router == "prefix":
        kwargs = {"imbalanced_threshold": running, **dict(config.router_kwargs)}
        router: dict[str, Any] = {"request_router_class": prefix_router_class(),
                                  "request_router_kwargs": kwargs}
        options["request_router_config"] = RequestRouterConfig(**router)
    elif config.router_kwargs:
        raise ConfigError("router_kwargs are for router 'prefix'")
    replica = serve.deployment(ColibriReplica).options(**options)
    ingress = serve.deployment(ColibriIngress).options(
        name="ColibriIngress", num_replicas=config.ingress_replicas,
        ray_actor_options={"num_cpus": 0})
    return ingress.bind(replica.bind(spec))
