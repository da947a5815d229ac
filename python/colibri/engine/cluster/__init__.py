"""Expert workers (issue 36, docs/cluster.md): a model's routed experts computed by
workers on a Ray cluster while this process (the coordinator) keeps the dense part,
attention, KV caches, routing and sampling. The outputs are the same bits as one process.

``EngineConfig(cluster=ClusterConfig(...))`` turns it on at load (engine/handle.py calls
:func:`connect_cluster`); Ray is imported only then."""

from __future__ import annotations

from pathlib import Path

from ... import _core
from ...errors import ConfigError, InternalError
from ...settings.cluster import ClusterConfig
from ...settings.config import EngineConfig
from ...sources import Manifest
from .coordinator import ExpertCluster, LocalTransport, Transport, WorkerStats
from .fingerprint import model_fingerprint
from .worker import ExpertWorker, WorkerHello

__all__ = ["ExpertCluster", "ExpertWorker", "LocalTransport", "Transport", "WorkerHello",
           "WorkerStats", "attach_cluster", "connect_cluster", "model_fingerprint"]


def attach_cluster(transport: Transport, manifest: Manifest, engine: EngineConfig,
                   core: _core.Engine) -> ExpertCluster:
    """Checks the workers behind `transport` against this model (fingerprint, arithmetic)
    and sends `core`'s routed experts to them; closes the transport on failure."""
    spec = core.spec
    layers = int(spec.n_layers) + int(core.mtp_layers)  # the store's: trunk, then MTP
    cluster = ExpertCluster(transport, _cluster_of(engine), layers, int(spec.n_experts),
                            int(spec.hidden_size))
    try:
        cluster.check_workers(model_fingerprint(manifest),
                              str(engine.activation_precision.value))
        cluster.install(core)
    except BaseException:
        cluster.close()
        raise
    return cluster


def connect_cluster(path: Path, manifest: Manifest, engine: EngineConfig,
                    core: _core.Engine) -> ExpertCluster:
    """Starts engine.cluster's workers as Ray actors, each loading the model at `path`
    with `engine`'s settings (resolved: the same arithmetic), and attaches them."""
    from .ray_transport import RayTransport

    if manifest.config.n_experts == 0:
        raise ConfigError(f"EngineConfig.cluster: {manifest.path.name} has no routed experts, "
                          "so expert workers would have nothing to compute; load it without "
                          "a cluster")
    return attach_cluster(RayTransport(path, engine, _cluster_of(engine)), manifest, engine,
                          core)


def _cluster_of(engine: EngineConfig) -> ClusterConfig:
    if engine.cluster is None:
        raise InternalError("an expert cluster was asked for without EngineConfig.cluster")
    return engine.cluster
