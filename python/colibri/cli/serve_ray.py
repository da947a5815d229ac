"""``colibri serve MODEL --ray``: the same server as replicas on a Ray cluster, behind one
ingress (colibri.server.ray; docs/serving.md, "Several machines")."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any, TextIO

from ..errors import ConfigError
from .parser import UsageError


def add_ray_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Ray Serve (--ray: replicas on a Ray cluster)")
    g.add_argument("--ray", action="store_true",
                   help="serve through Ray Serve: replicas of the model (one per machine by "
                        "default) behind one ingress at --host/--port")
    g.add_argument("--ray-address", metavar="ADDR",
                   help="the Ray cluster to join (host:port of `ray start --head`, or "
                        "'auto'); default: $RAY_ADDRESS, else a cluster started on this "
                        "machine, else a new local one")
    g.add_argument("--num-replicas", type=int, metavar="N",
                   help="a fixed number of replicas (default: one per alive node with "
                        "--placement node, one per colibri_numa resource with numa)")
    g.add_argument("--min-replicas", type=int, metavar="N",
                   help="autoscaling: fewest replicas (Ray Serve's autoscaling_config)")
    g.add_argument("--max-replicas", type=int, metavar="N", help="autoscaling: most replicas")
    g.add_argument("--target-ongoing-requests", type=float, metavar="N",
                   help="autoscaling: requests per replica Ray aims at (default: Ray's)")
    g.add_argument("--placement", choices=("node", "numa", "any"), default="node",
                   help="node: at most one replica per machine (default); numa: one per "
                        "NUMA node (each node started with --resources "
                        "'{\"colibri_numa\": K}'); any: no constraint")
    g.add_argument("--ray-router", choices=("prefix", "pow2"), default="prefix",
                   help="prefix: Ray's PrefixCacheAffinityRouter, a chat returns to the "
                        "replica holding its KV (default); pow2: Ray's default "
                        "power-of-two-choices on queue length")
    g.add_argument("--replica-cpus", type=float, default=1.0, metavar="N",
                   help="logical CPUs Ray reserves per replica (default 1; the engine's "
                        "threads are --threads)")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cmd_serve_ray(args: argparse.Namespace, server: dict[str, Any], err: TextIO) -> int:
    """Deploys and blocks until SIGTERM / Ctrl-C, then deletes the deployment."""
    from ..server.ray import RayServeConfig, ReplicaSpec, autoscaling_from_flags, build_app
    from ..server.ray import require_ray as _require_ray
    from .parser import engine_from_args

    serve = _require_ray()
    import ray

    try:
        autoscaling = autoscaling_from_flags(args.min_replicas, args.max_replicas,
                                             args.target_ongoing_requests)
        config = RayServeConfig(num_replicas=args.num_replicas,
                                autoscaling_config=autoscaling, placement=args.placement,
                                router=args.ray_router, replica_cpus=args.replica_cpus)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    engine = engine_from_args(args)
    if args.prompt_cache is not None:
        engine = engine.replace(prompt_cache=args.prompt_cache)
    # A path that exists here is made absolute: replicas run in other directories (and
    # on other machines, where the same path must hold the same files).
    model = os.path.abspath(args.model) if Path(args.model).exists() else args.model
    spec = ReplicaSpec(model, engine, args.cache_dir, server, download=args.download)
    ray_api: Any = ray
    started_here = not ray_api.is_initialized()
    if started_here:
        ray_api.init(address=args.ray_address, log_to_driver=not args.quiet)
    port = args.port or _free_port(args.host)
    serve.start(http_options={"host": args.host, "port": port})
    # Serve already running on the cluster keeps its own HTTP options: say where it is.
    try:
        from ray.serve.context import _get_global_client

        client: Any = _get_global_client()
        http: Any = client.http_config
        host, port = str(http.host), int(http.port)
    except Exception:  # a Ray without that (internal) accessor: the requested address
        host = args.host
    app_name = config.app_name
    serve.run(build_app(spec, config), name=app_name, route_prefix="/")
    name = args.served_model_name or args.model
    err.write(f"colibri: serving {name} at http://{host}:{port}/v1 (Ray Serve, "
              f"placement {args.placement}, router {args.ray_router})\n")
    err.flush()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    err.write("colibri: stopping (draining the replicas)\n")
    serve.delete(app_name)
    if not serve.status().applications:
        serve.shutdown()
    if started_here:
        ray_api.shutdown()
    return 0
