"""ExpertWorker: one expert worker's side (a Ray actor in a cluster, a plain object in the
in-process transport). It loads the same model file as the coordinator with the
coordinator's settings (no cluster of its own) and computes the routed experts it is sent
through the core's ``Engine.compute_experts``: the same store and kernels as the MoE block,
so each expert's rows come back the same bits as the coordinator would have computed."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ...settings.config import EngineConfig
from ..handle import load_engine
from .fingerprint import model_fingerprint

__all__ = ["ExpertWorker", "WorkerHello"]


@dataclass(frozen=True)
class WorkerHello:
    """What a worker reports once loaded: the coordinator checks the fingerprint."""

    worker: int
    fingerprint: str
    host: str
    pid: int
    activation_precision: str
    load_seconds: float


class ExpertWorker:
    """Owns a loaded engine; computes the experts of the batches it is sent."""

    def __init__(self, path: str, engine: EngineConfig, worker: int) -> None:
        t0 = time.monotonic()
        self._worker = worker
        self._handle = load_engine(Path(path), engine.replace(cluster=None))
        self._hello = WorkerHello(
            worker=worker, fingerprint=model_fingerprint(self._handle.manifest),
            host=socket.gethostname(), pid=os.getpid(),
            activation_precision=str(self._handle.engine_config.activation_precision.value),
            load_seconds=time.monotonic() - t0)
        self._compute_seconds = 0.0

    def hello(self) -> WorkerHello:
        return self._hello

    def compute(self, layer: int, experts: npt.NDArray[np.int32], counts: npt.NDArray[np.int64],
                rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """experts[i] over counts[i] rows of `rows`, expert after expert (the same layout
        back)."""
        t0 = time.perf_counter()
        out = self._handle.core.compute_experts(layer, experts.tolist(), counts.tolist(), rows)
        self._compute_seconds += time.perf_counter() - t0
        return out

    def compute_seconds(self) -> float:
        """Seconds spent computing since load (the rest of a round trip is the transport)."""
        return self._compute_seconds

    def close(self) -> None:
        self._handle.release()
