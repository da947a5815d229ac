"""Expert clusters for the tests (colibri.engine.cluster): a model whose routed experts are
computed by in-process workers (LocalTransport: the coordinator's logic and the core's
seam without Ray), and one forward sequence whose logits are compared bit for bit."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import colibri
from colibri.engine.cluster import ExpertWorker, LocalTransport, attach_cluster
from colibri.engine.handle import load_engine
from colibri.settings.cluster import ClusterConfig
from colibri.settings.config import EngineConfig


def local_cluster_model(path: Path, engine: EngineConfig, workers: int,
                        worker_path: Path | None = None) -> colibri.Model:
    """`path` loaded with `workers` in-process expert workers (each loading `worker_path`,
    by default the same file) computing its routed experts."""
    handle = load_engine(path, engine)
    resolved = handle.engine_config.replace(cluster=ClusterConfig(workers=workers))
    transport = LocalTransport([ExpertWorker(str(worker_path or path), resolved, w)
                                for w in range(workers)])
    handle.cluster = attach_cluster(transport, handle.manifest, resolved, handle.core)
    handle.engine_config = resolved
    return colibri.Model(handle)


def forward_run(model: colibri.Model, prompt: list[int],
                n_decode: int = 5) -> tuple[np.ndarray, list[np.ndarray]]:
    """The prompt's logits at every position, then greedy decode steps' logits."""
    s = model.session()
    prefill = s.forward(prompt, all_logits=True)
    steps = []
    logits = prefill[-1]
    for _ in range(n_decode):
        logits = s.forward([int(np.argmax(logits))])
        steps.append(logits.copy())
    return prefill, steps


def assert_same_run(got: tuple[np.ndarray, list[np.ndarray]],
                    want: tuple[np.ndarray, list[np.ndarray]], what: str) -> None:
    np.testing.assert_array_equal(got[0], want[0], err_msg=f"prefill, {what}")
    for i, (a, b) in enumerate(zip(got[1], want[1], strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"decode step {i}, {what}")
