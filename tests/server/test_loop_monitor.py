"""The event-loop stall monitor (server/loop_monitor.py): a loop blocked by synchronous
work shows as lag and a stall; an idle loop shows neither."""

from __future__ import annotations

import asyncio
import time

from colibri.server.loop_monitor import LoopMonitor


async def _watch(monitor: LoopMonitor, block: float) -> None:
    async with monitor.running():
        await asyncio.sleep(0.05)
        time.sleep(block)  # synchronous work on the loop: what the monitor is for
        await asyncio.sleep(0.05)


def test_a_blocked_loop_is_a_stall() -> None:
    m = LoopMonitor()
    asyncio.run(_watch(m, 0.3))
    assert m.stalls >= 1 and m.max_lag >= 0.2
    assert m.ticks >= 2


def test_lag_is_counted_as_a_stall_only_past_the_threshold() -> None:
    m = LoopMonitor(stall=0.1)
    for lag in (0.0, 0.05, 0.1, 0.101, 2.0):
        m.observe(lag)
    assert (m.ticks, m.stalls, m.max_lag) == (5, 2, 2.0)
