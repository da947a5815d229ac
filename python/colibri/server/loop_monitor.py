"""The event-loop stall monitor: a task that sleeps a short interval and records how late
it wakes. Work run on the loop (a backtracking regex, tokenization, a grammar compiled
inline) delays every coroutine, ``/health`` included, and shows here as lag; ``/metrics``
exposes the largest lag seen and the count of stalls over ``STALL_SECONDS`` (issue 35:
the loop must stay responsive, a health probe answered within 100 ms, whatever one
request sends).

Python's cyclic garbage collector is the other source of stalls: a full collection
stops every thread while it traverses every tracked object, and with a model's tokenizer,
template and server loaded that took 80-250 ms here (a request that allocates many
objects, e.g. 19,000 wrong items, sets one off). While the monitor runs, what exists at
its start (everything the server keeps for its life) is moved out of the collector's
reach (``gc.freeze``; still freed by reference counting), so a full collection traverses
only what came after; its pauses are timed (``gc_max_pause``, ``gc_stalls``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator

__all__ = ["INTERVAL_SECONDS", "STALL_SECONDS", "LoopMonitor"]

INTERVAL_SECONDS = 0.01
STALL_SECONDS = 0.1  # the health probe's budget


class LoopMonitor:
    """Lag figures of the running loop, kept by :meth:`running` while the app lives."""

    def __init__(self, interval: float = INTERVAL_SECONDS,
                 stall: float = STALL_SECONDS) -> None:
        self.interval = interval
        self.stall = stall
        self.max_lag = 0.0  # seconds: the latest any wake-up came
        self.stalls = 0  # wake-ups later than `stall`
        self.ticks = 0
        self.gc_max_pause = 0.0  # seconds: the longest collection of the cyclic GC
        self.gc_stalls = 0  # collections longer than `stall`
        self._gc_started = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_started
        self.gc_max_pause = max(self.gc_max_pause, pause)
        if pause > self.stall:
            self.gc_stalls += 1

    def observe(self, lag: float) -> None:
        self.ticks += 1
        self.max_lag = max(self.max_lag, lag)
        if lag > self.stall:
            self.stalls += 1

    async def _run(self) -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(self.interval)
            self.observe(max(0.0, time.monotonic() - t0 - self.interval))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Monitor the current loop for the duration of the block; the heap that exists
        at its start is frozen meanwhile (the module's docstring)."""
        gc.collect()  # garbage is not frozen
        gc.freeze()
        gc.callbacks.append(self._on_gc)
        task = asyncio.get_running_loop().create_task(self._run(), name="colibri-loop-monitor")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            gc.callbacks.remove(self._on_gc)
            gc.unfreeze()
