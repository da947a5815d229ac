"""Summaries of a read trace (``ReadPool.trace()`` / ``Engine.io_trace()``): how the reads
of a decode, or of the disk bench, used the device.

The columns are numpy arrays, one entry per finished read: ``submitted``, ``started``,
``finished`` (seconds since the trace started), ``bytes``, ``urgent``, ``inline``. The
summary answers the questions of issue 14's gap between a decode's read rate and the disk
bench on the same device: how large the reads were, how many ran at once (a time-weighted
histogram), how long the device had *none* (gaps the decode left), how fast a read was
served, and how long demand reads queued behind others.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def _pct(v: np.ndarray, q: float) -> float:
    return float(np.percentile(v, q)) if v.size else 0.0


def running_histogram(started: np.ndarray, finished: np.ndarray, t0: float, t1: float,
                      cap: int = 4) -> list[float]:
    """Share of [t0, t1] with 0, 1, ..., ``cap`` or more reads running (sums to 1)."""
    span = t1 - t0
    out = [0.0] * (cap + 1)
    if span <= 0:
        return out
    s = np.clip(started, t0, t1)
    f = np.clip(finished, t0, t1)
    times = np.concatenate([s, f, [t0, t1]])
    steps = np.concatenate([np.ones_like(s), -np.ones_like(f), [0.0, 0.0]])
    order = np.lexsort((steps, times))  # at equal times an end before a start
    times, steps = times[order], steps[order]
    level = np.cumsum(steps)[:-1]
    dur = np.diff(times)
    for k in range(cap + 1):
        sel = level >= cap if k == cap else level == k
        out[k] = float(dur[sel].sum() / span)
    return out


def stalled_share(submitted: np.ndarray, started: np.ndarray, finished: np.ndarray,
                  t0: float, t1: float, workers: int) -> float:
    """Share of [t0, t1] in which a read was queued (submitted, not started) while fewer
    than ``workers`` reads ran: a worker was free but had not taken it yet (it was
    waiting for a CPU, or for the pool's lock)."""
    span = t1 - t0
    if span <= 0 or submitted.size == 0:
        return 0.0
    s = np.clip(submitted, t0, t1)
    b = np.clip(started, t0, t1)
    f = np.clip(finished, t0, t1)
    # events: +queued at submit, -queued & +running at start, -running at finish
    times = np.concatenate([s, b, f, [t0, t1]])
    dq = np.concatenate([np.ones_like(s), -np.ones_like(b), np.zeros_like(f), [0.0, 0.0]])
    dr = np.concatenate([np.zeros_like(s), np.ones_like(b), -np.ones_like(f), [0.0, 0.0]])
    order = np.argsort(times, kind="stable")
    times, dq, dr = times[order], dq[order], dr[order]
    q, r = np.cumsum(dq)[:-1], np.cumsum(dr)[:-1]
    dur = np.diff(times)
    return float(dur[(q > 0.5) & (r < workers - 0.5)].sum() / span)


def summarize(trace: Mapping[str, Any], window: tuple[float, float] | None = None,
              workers: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The trace's reads that started inside ``window`` (default: first start to last
    end): sizes, reads running at once, idle share, service rate and queueing.
    ``workers``: the pool's I/O workers, for ``stalled_share`` (None: not computed)."""
    started = np.asarray(trace["started"], dtype=float)
    finished = np.asarray(trace["finished"], dtype=float)
    submitted = np.asarray(trace["submitted"], dtype=float)
    nbytes = np.asarray(trace["bytes"], dtype=float)
    urgent = np.asarray(trace["urgent"], dtype=bool)
    inline = np.asarray(trace["inline"], dtype=bool)
    if window is None:
        if started.size == 0:
            return {"reads": 0}
        window = (float(started.min()), float(finished.max()))
    t0, t1 = window
    if t1 <= t0:
        raise ValueError(f"empty trace window {window}")
    sel = (started >= t0) & (started < t1)
    started, finished, submitted = started[sel], finished[sel], submitted[sel]
    nbytes, urgent, inline = nbytes[sel], urgent[sel], inline[sel]
    span = t1 - t0
    lat = (finished - started) * 1e3
    queued = (started - submitted) * 1e3
    hist = running_histogram(started, finished, t0, t1)
    busy = 1.0 - hist[0]
    total = float(nbytes.sum())
    return {
        "reads": int(started.size), "window_s": span, "bytes": total,
        "gb_s": total / span / 1e9,
        "mean_read_mib": float(nbytes.mean() / 2**20) if nbytes.size else 0.0,
        "read_ms_median": _pct(lat, 50), "read_ms_p90": _pct(lat, 90),
        "read_ms_mean": float(lat.mean()) if lat.size else 0.0,
        # time-weighted: the share of the window with 0, 1, 2, 3, >= 4 reads running
        "running_share": hist,
        "mean_running": float(((finished - started).clip(min=0)).sum() / span),
        "idle_share": hist[0],
        # bytes per second of the time at least one read ran: what the device gave while
        # it had work, apart from the gaps
        "gb_s_while_busy": total / (busy * span) / 1e9 if busy > 0 else 0.0,
        "stalled_share": (stalled_share(submitted, started, finished, t0, t1, workers)
                          if workers else None),
        "demand_reads": int(urgent.sum()), "inline_reads": int(inline.sum()),
        "demand_queued_ms_mean": float(queued[urgent].mean()) if urgent.any() else 0.0,
        "prefetch_queued_ms_mean": float(queued[~urgent].mean()) if (~urgent).any() else 0.0,
    }
