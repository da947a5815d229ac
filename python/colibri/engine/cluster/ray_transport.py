"""The expert workers as Ray actors (docs/cluster.md): connecting to the cluster, starting
one ExpertWorker actor per ClusterConfig.workers (spread over the nodes), and carrying each
layer's slices as plain actor calls. Ray is imported here only, when a model loads with a
cluster (the optional ``ray`` extra)."""

from __future__ import annotations

import importlib
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import ClusterError
from ...settings.cluster import ClusterConfig
from ...settings.config import EngineConfig
from .worker import WorkerHello

__all__ = ["RayTransport", "check_reachable", "import_ray"]

Rows = npt.NDArray[np.float32]
PROBE_TIMEOUT_S = 5.0


def check_reachable(address: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """A "host:port" address must accept a TCP connection (ClusterError otherwise): Ray's
    own connect retries for a long time before it gives up on a wrong address."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise ClusterError(
            f"the Ray cluster at {address} does not answer ({e.strerror or e}); start it "
            f"with `ray start --head --port {port}` on that machine (docs/cluster.md) or "
            f"fix ClusterConfig.address") from None


def import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ClusterError("an expert cluster needs Ray: pip install 'colibri[ray]' on the "
                           "coordinator and on every worker machine") from None


def _connect(ray: Any, config: ClusterConfig) -> None:
    """Joins the cluster; a process already connected (ray.init was called) stays so."""
    if ray.is_initialized():
        return
    try:
        if config.address == "local":
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=config.address, log_to_driver=False)
    except (ConnectionError, RuntimeError, TimeoutError) as e:
        raise ClusterError(f"could not join the Ray cluster at {config.address!r}: {e}") from None


class RayTransport:
    """One ExpertWorker actor per worker, called with plain actor calls."""

    def __init__(self, path: Path, engine: EngineConfig, config: ClusterConfig) -> None:
        check_reachable(config.address)
        ray = import_ray()
        _connect(ray, config)
        self._ray = ray
        from .worker import ExpertWorker

        actor = ray.remote(num_cpus=config.worker_cpus, max_restarts=0)(ExpertWorker)
        worker_engine = engine.replace(cluster=None, ram_budget=config.worker_ram_budget)
        self._actors = [
            actor.options(scheduling_strategy="SPREAD").remote(
                config.model_path or str(path), worker_engine, w)
            for w in range(config.workers)]

    def hello(self, timeout: float) -> list[WorkerHello]:
        refs = [a.hello.remote() for a in self._actors]
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout)
        if len(ready) < len(refs):
            late = [w for w, r in enumerate(refs) if r not in ready]
            self.close()
            raise ClusterError(
                f"expert worker(s) {late} did not load the model within {timeout:g} s "
                f"(ClusterConfig.connect_timeout); does the cluster have "
                f"{len(refs)} x worker_cpus free CPUs and the model file on every node?")
        hellos = []
        for w, ref in enumerate(refs):
            try:
                hellos.append(self._ray.get(ref))
            except Exception as e:  # the actor's __init__ failed: its error, re-raised by Ray
                self.close()
                raise ClusterError(f"expert worker {w} failed to start: {_cause(e)}") from None
        return hellos

    def submit(self, worker: int, layer: int, experts: npt.NDArray[np.int32],
               counts: npt.NDArray[np.int64], rows: Rows) -> object:
        return self._actors[worker].compute.remote(layer, experts, counts, rows)

    def gather(self, pending: Sequence[tuple[int, object]], layer: int,
               timeout: float) -> list[tuple[Rows, float]]:
        ray = self._ray
        refs = [ref for _, ref in pending]
        arrived: dict[Any, float] = {}
        deadline = time.perf_counter() + timeout
        waiting = list(refs)
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1,
                                      timeout=max(0.0, deadline - time.perf_counter()))
            if not ready:
                late = [w for (w, r) in pending if r in waiting]
                raise ClusterError(f"expert worker(s) {late} did not answer layer {layer} "
                                   f"within {timeout:g} s (ClusterConfig.call_timeout)")
            now = time.perf_counter()
            for r in ready:
                arrived[r] = now
        out = []
        for w, ref in pending:
            try:
                out.append((ray.get(ref), arrived[ref]))
            except Exception as e:
                raise ClusterError(f"expert worker {w} failed on layer {layer}: "
                                   f"{_cause(e)}") from None
        return out

    def cancel(self, pending: Sequence[tuple[int, object]]) -> None:
        pass  # an actor call cannot be withdrawn; its answer is dropped with the reference

    def close(self) -> None:
        for a in self._actors:
            try:
                self._ray.kill(a)
            except Exception:  # already gone with its node or the cluster
                pass
        self._actors = []


_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception)): (.*)$")


def _cause(e: BaseException) -> str:
    """The worker's own exception, as one line. Ray wraps it (RayTaskError, ActorDiedError
    from a failed __init__) in a message holding the remote traceback; its last exception
    line is the worker's."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException) and not hasattr(cause, "cause"):
        return f"{type(cause).__name__}: {cause}"
    for line in reversed(str(e).splitlines()):
        m = _EXCEPTION_LINE.match(line.strip())
        if m:
            return f"{m.group(1)}: {m.group(2)}"
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
