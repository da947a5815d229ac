"""EngineHandle: a loaded model's engine, as the generation layer sees it.

It holds what sessions and generations need of a loaded model (the core engine, the
manifest, the settings in effect, the context length and KV type sessions get, the RAM
budget plan) and the changes that act on the engine itself (threads, activation precision,
routing history, close). The generation layer (colibri.generate) is given a handle, never
the Model, so it does not depend on the facade above it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .. import _core
from ..errors import InvalidRequestError
from ..settings.config import ActivationPrecision, CachePolicy, EngineConfig, ThreadConfig
from ..sources import Manifest, ModelConfig, open_model_source
from .budget import BudgetPlan
from .core_spec import (
    ACT_PRECISION,
    model_spec,
    resolved_context_length,
    tensor_specs,
    thread_settings,
)
from .gpu_offload import attach_device
from .streaming import (
    RoutingHistory,
    check_resident_fits,
    expert_blobs,
    pin_order,
    plan_store,
    session_kv_type,
    store_settings,
    with_resolved_precision,
)

if TYPE_CHECKING:
    from .cluster import ExpertCluster, WorkerStats

__all__ = ["EngineHandle", "load_engine"]


class EngineHandle:
    """The core engine of one loaded model and the settings it runs under."""

    def __init__(self, manifest: Manifest, engine: EngineConfig, core: _core.Engine,
                 plan: BudgetPlan | None = None, history: RoutingHistory | None = None,
                 history_base: npt.NDArray[np.uint64] | None = None,
                 cluster: ExpertCluster | None = None) -> None:
        self.manifest = manifest
        self.engine_config = engine
        self._core: _core.Engine | None = core
        self.context_length = resolved_context_length(manifest.config, engine)
        # The RAM split the expert cache was sized from (the server re-splits it for its
        # slots' KV caches: colibri.server.memory).
        self.plan = plan
        self._history = history
        self._history_base = history_base
        self.name = manifest.path.name
        self.kv_type = session_kv_type(manifest, engine)
        # The expert workers computing the routed experts (EngineConfig.cluster), or None.
        self.cluster = cluster

    @property
    def config(self) -> ModelConfig:
        return self.manifest.config

    @property
    def closed(self) -> bool:
        return self._core is None

    @property
    def core(self) -> _core.Engine:
        """The core engine; InvalidRequestError once the model is closed."""
        if self._core is None:
            raise InvalidRequestError("the model is closed; load it again to use it")
        return self._core

    def set_threads(self, threads: ThreadConfig) -> None:
        self.core.configure_threads(thread_settings(threads))
        self.engine_config = self.engine_config.replace(threads=threads)

    def set_activation_precision(self, precision: ActivationPrecision | str) -> None:
        """Switches the arithmetic; under ``kv_cache_type="auto"`` new sessions get the KV
        type of the new precision and the budget is re-split for it (ConfigError, changing
        nothing, if it no longer fits)."""
        cfg = with_resolved_precision(
            self.manifest, self.engine_config.replace(activation_precision=precision))
        core = self.core
        kv_type = session_kv_type(self.manifest, cfg)
        if kv_type != self.kv_type and self.plan is not None:
            plan = plan_store(self.manifest, cfg, core, self.context_length)
            if plan.cache_bytes != self.plan.cache_bytes:
                core.configure_store(store_settings(cfg, plan.cache_bytes))
            self.plan = plan
        core.activation_precision = ACT_PRECISION[cfg.activation_precision]
        self.engine_config = cfg
        self.kv_type = kv_type

    def save_routing_history(self) -> None:
        """Adds this run's routing counts to the model's history file (atomically)."""
        core, history, base = self._core, self._history, self._history_base
        if core is None or history is None or base is None:
            return
        history.save(base + core.route_counts())

    def cluster_stats(self) -> list[WorkerStats]:
        """Per expert worker: requests, rows, bytes, round-trip and wait time (empty
        without a cluster)."""
        return self.cluster.stats() if self.cluster is not None else []

    def release(self) -> None:
        """Drops the engine: its memory is freed once no session holds it, and stops its
        expert workers. Idempotent."""
        if self._core is not None and self.cluster is not None:
            self._core.set_remote_experts(None)
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None
        self._core = None


def load_engine(path: Path, engine: EngineConfig | None) -> EngineHandle:
    """Opens the model at `path`, checks that its resident part fits the budget, reads the
    resident weights and sizes the expert cache (docs/architecture.md, "From a path to
    logits")."""
    engine = engine if engine is not None else EngineConfig()
    manifest = open_model_source(path)
    engine = with_resolved_precision(manifest, engine)  # "auto" -> what this model gets
    context_length = resolved_context_length(manifest.config, engine)
    check_resident_fits(manifest, engine, context_length)  # before reading any weight
    core = _core.Engine(
        model_spec(manifest, context_length),
        tensor_specs(manifest, engine.io.checksums != "off"),
        [str(f) for f in manifest.files],
        thread_settings(engine.threads),
        expert_blobs(manifest),
    )
    core.activation_precision = ACT_PRECISION[engine.activation_precision]
    attach_device(core, engine)  # device="gpu": the linear layers go up now
    plan = plan_store(manifest, engine, core, context_length)
    core.configure_store(store_settings(engine, plan.cache_bytes))
    history = RoutingHistory.for_model(manifest, engine)
    base = history.load() if history is not None else None
    if base is not None and engine.cache.policy is CachePolicy.PINNED:
        core.set_expert_pins(pin_order(base))
    cluster = None
    if engine.cluster is not None:  # the workers compute every routed expert: none to preload
        from .cluster import connect_cluster

        cluster = connect_cluster(path, manifest, engine, core)
    elif engine.cache.preload and plan.cache_slots >= int(core.streamed_experts):
        core.preload_experts()
    return EngineHandle(manifest, engine, core, plan, history, base, cluster)
