"""ExpertCluster: the coordinator's side of the expert workers (issue 36, docs/cluster.md).

The core hands each MoE layer's remote experts over in one batch (csrc/model/
remote_experts.hpp): the distinct experts in ascending order, the rows routed to each, one
expert after the other. Worker ``w`` owns one contiguous range of every layer's experts
(ClusterConfig.shard), so the batch splits into one contiguous slice per worker: ``start``
sends each worker its slice at once (one request per worker per layer, whatever the batch),
``finish`` waits for all of them and puts the answers back together in the batch's order.
The core then sums each token's experts in the router's order, as without a cluster.

How the slices travel is a :class:`Transport`: Ray actors (ray_transport.py), or workers in
this process (LocalTransport: tests, and a check of the seam without Ray)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ... import _core
from ...errors import ClusterError
from ...settings.cluster import ClusterConfig
from .worker import ExpertWorker, WorkerHello

__all__ = ["ExpertCluster", "LocalTransport", "Transport", "WorkerStats"]

Rows = npt.NDArray[np.float32]


class Transport(Protocol):
    """Carries one layer's slices to the workers and their answers back."""

    def hello(self, timeout: float) -> list[WorkerHello]:
        """Each worker's report once it has loaded (ClusterError past `timeout`)."""
        ...

    def submit(self, worker: int, layer: int, experts: npt.NDArray[np.int32],
               counts: npt.NDArray[np.int64], rows: Rows) -> object:
        """Sends one slice; returns a handle for gather."""
        ...

    def gather(self, pending: Sequence[tuple[int, object]], layer: int,
               timeout: float) -> list[tuple[Rows, float]]:
        """Each pending slice's answer and when it arrived (time.perf_counter), in order;
        ClusterError naming the worker when one fails or takes longer than `timeout`."""
        ...

    def cancel(self, pending: Sequence[tuple[int, object]]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class WorkerStats:
    """One expert worker's share of the work since the cluster connected (or reset_stats).

    ``round_trip_seconds``: from sending a layer's slice to having its answer, summed;
    ``wait_seconds``: of the coordinator's time, how long it waited in ``finish`` for this
    worker after its own work for the layer was done (the part a faster link would save).
    """

    worker: int
    host: str
    experts: range  # of each MoE layer
    requests: int
    rows: int
    bytes_sent: int
    bytes_received: int
    round_trip_seconds: float
    wait_seconds: float

    @property
    def mean_round_trip_seconds(self) -> float:
        return self.round_trip_seconds / self.requests if self.requests else 0.0


class _Tally:
    def __init__(self) -> None:
        self.requests = self.rows = self.bytes_sent = self.bytes_received = 0
        self.round_trip = self.wait = 0.0


class ExpertCluster:
    """The workers of one loaded model and the callables the core calls per MoE layer."""

    def __init__(self, transport: Transport, config: ClusterConfig, n_layers: int,
                 n_experts: int, hidden: int) -> None:
        self.config = config
        self._transport = transport
        self._n_layers = n_layers  # the store's layers: the trunk's, then the MTP layers'
        self._n_experts = n_experts
        self._hidden = hidden
        self._owner = np.array([config.owner(e, n_experts) for e in range(n_experts)],
                               dtype=np.int64)
        self._hosts = ["?"] * config.workers
        self._tally = [_Tally() for _ in range(config.workers)]
        self._pending: list[tuple[int, object]] = []
        self._pending_rows: list[int] = []
        self._layer = -1
        self._sent_at = 0.0

    def check_workers(self, fingerprint: str, activation_precision: str) -> list[WorkerHello]:
        """Waits for every worker to load (ClusterConfig.connect_timeout) and refuses one
        that runs another model file or other arithmetic (ClusterError)."""
        hellos = self._transport.hello(self.config.connect_timeout)
        for h in hellos:
            self._hosts[h.worker] = h.host
            if h.fingerprint != fingerprint:
                raise ClusterError(
                    f"expert worker {h.worker} (on {h.host}) loaded another model file: "
                    f"fingerprint {h.fingerprint[:16]} where the coordinator's is "
                    f"{fingerprint[:16]}; give every machine the same file")
            if h.activation_precision != activation_precision:
                raise ClusterError(
                    f"expert worker {h.worker} (on {h.host}) computes with "
                    f"activation_precision={h.activation_precision!r}, the coordinator with "
                    f"{activation_precision!r}; the outputs would differ")
        return hellos

    def install(self, core: _core.Engine) -> None:
        """From the next forward on, `core` sends every routed expert to the workers."""
        mask = np.ones((self._n_layers, self._n_experts), dtype=np.uint8)
        core.set_remote_experts(mask, self._start, self._finish, self._cancel)

    # --- the core's callables (model/remote_experts.hpp), with the GIL -----------------

    def _start(self, layer: int, experts: npt.NDArray[np.int32], counts: npt.NDArray[np.int64],
               rows: Rows) -> None:
        self._cancel()
        owners = self._owner[experts]
        ends = np.cumsum(counts)
        starts = ends - counts
        self._layer = layer
        self._sent_at = time.perf_counter()
        # experts ascend and shards are contiguous ranges: each worker's slice is contiguous.
        cuts = np.flatnonzero(np.diff(owners)) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(experts)], strict=True):
            w = int(owners[lo])
            r0, r1 = int(starts[lo]), int(ends[hi - 1])
            self._pending.append((w, self._transport.submit(
                w, layer, experts[lo:hi], counts[lo:hi], rows[r0:r1])))
            self._pending_rows.append(r1 - r0)

    def _finish(self) -> Rows:
        pending, sizes = self._pending, self._pending_rows
        self._pending, self._pending_rows = [], []
        waited_from = time.perf_counter()
        answers = self._transport.gather(pending, self._layer, self.config.call_timeout)
        row_bytes = self._hidden * 4
        for (w, _), n, (out, arrived) in zip(pending, sizes, answers, strict=True):
            if out.shape != (n, self._hidden):
                raise ClusterError(f"expert worker {w} answered layer {self._layer} with "
                                   f"shape {out.shape}, not ({n}, {self._hidden})")
            t = self._tally[w]
            t.requests += 1
            t.rows += n
            t.bytes_sent += n * row_bytes
            t.bytes_received += int(out.nbytes)
            t.round_trip += arrived - self._sent_at
            t.wait += max(0.0, arrived - waited_from)
        if len(answers) == 1:
            return answers[0][0]
        return np.concatenate([a for a, _ in answers])

    def _cancel(self) -> None:
        if self._pending:
            self._transport.cancel(self._pending)
        self._pending, self._pending_rows = [], []

    # --- stats and lifetime -------------------------------------------------------------

    def stats(self) -> list[WorkerStats]:
        return [WorkerStats(worker=w, host=self._hosts[w],
                            experts=self.config.shard(w, self._n_experts),
                            requests=t.requests, rows=t.rows, bytes_sent=t.bytes_sent,
                            bytes_received=t.bytes_received, round_trip_seconds=t.round_trip,
                            wait_seconds=t.wait)
                for w, t in enumerate(self._tally)]

    def reset_stats(self) -> None:
        self._tally = [_Tally() for _ in range(self.config.workers)]

    def close(self) -> None:
        """Stops the workers (idempotent)."""
        self._cancel()
        self._transport.close()


class LocalTransport:
    """Workers in this process, computing when their answers are gathered (no overlap):
    the coordinator's logic and the core's seam, without Ray."""

    def __init__(self, workers: Sequence[ExpertWorker]) -> None:
        self._workers = list(workers)

    def hello(self, timeout: float) -> list[WorkerHello]:
        return [w.hello() for w in self._workers]

    def submit(self, worker: int, layer: int, experts: npt.NDArray[np.int32],
               counts: npt.NDArray[np.int64], rows: Rows) -> object:
        return (layer, experts.copy(), counts.copy(), rows.copy())

    def gather(self, pending: Sequence[tuple[int, object]], layer: int,
               timeout: float) -> list[tuple[Rows, float]]:
        out = []
        for w, args in pending:
            result = self._workers[w].compute(*args)  # type: ignore[misc]
            out.append((result, time.perf_counter()))
        return out

    def cancel(self, pending: Sequence[tuple[int, object]]) -> None:
        pass

    def close(self) -> None:
        for w in self._workers:
            w.close()
        self._workers = []
