"""The event-loop stall monitor: a task that sleeps a short interval and records how late
it wakes. Work run on the loop (a backtracking regex, tokenization, a grammar compiled
inline) delays every coroutine, ``/health`` included, and shows here as lag; ``/metrics``
exposes the largest lag seen and the count of stalls over ``STALL_SECONDS`` (issue 35:
the loop must stay responsive, a health probe answered within 100 ms, whatever one
request sends)."""

from __future__ import annotations

import asyncio
import contextlib
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
        """Monitor the current loop for the duration of the block."""
        task = asyncio.get_running_loop().create_task(self._run(), name="colibri-loop-monitor")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
