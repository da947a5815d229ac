"""benchmarks/_iotrace.py: the summaries of a read trace, against hand-computed oracles,
and the trace of a real ReadPool.bench run."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from test_bench_helpers import _load

it = _load("_iotrace")


def _trace(rows: list[tuple[float, float, float, bool]],
           nbytes: int = 1000) -> dict[str, np.ndarray]:
    sub, st, fin, urg = (np.array(c) for c in zip(*rows, strict=True))
    n = len(rows)
    return {"submitted": sub.astype(float), "started": st.astype(float),
            "finished": fin.astype(float), "bytes": np.full(n, nbytes, dtype=np.uint64),
            "urgent": urg.astype(bool), "inline": np.zeros(n, dtype=bool)}


def test_running_histogram_by_hand() -> None:
    # reads [0, 2) and [1, 3) in a window [0, 4): 0 running 1 s, 1 running 2 s, 2 running 1 s
    h = it.running_histogram(np.array([0.0, 1.0]), np.array([2.0, 3.0]), 0.0, 4.0)
    assert h == pytest.approx([0.25, 0.5, 0.25, 0.0, 0.0])
    # clipped to the window, and >= cap pooled in the last bin
    h = it.running_histogram(np.zeros(5), np.full(5, 10.0), 1.0, 2.0, cap=4)
    assert h == pytest.approx([0.0, 0.0, 0.0, 0.0, 1.0])
    # back to back: an end and a start at the same time leave no gap and no overlap
    h = it.running_histogram(np.array([0.0, 1.0]), np.array([1.0, 2.0]), 0.0, 2.0)
    assert h == pytest.approx([0.0, 1.0, 0.0, 0.0, 0.0])
    assert it.running_histogram(np.array([]), np.array([]), 0.0, 0.0) == [0.0] * 5


def test_summarize_by_hand() -> None:
    # a demand read queued 1 s while the only worker was free (stalled), then a prefetch
    tr = _trace([(0.0, 1.0, 2.0, True), (2.0, 2.0, 3.0, False)])
    s = it.summarize(tr, (0.0, 4.0), workers=1)
    assert s["reads"] == 2 and s["bytes"] == 2000
    assert s["gb_s"] == pytest.approx(2000 / 4 / 1e9)
    assert s["idle_share"] == pytest.approx(0.5) and s["mean_running"] == pytest.approx(0.5)
    assert s["gb_s_while_busy"] == pytest.approx(2000 / 2 / 1e9)
    assert s["stalled_share"] == pytest.approx(0.25)
    assert s["demand_queued_ms_mean"] == pytest.approx(1000.0)
    assert s["prefetch_queued_ms_mean"] == pytest.approx(0.0)
    assert s["read_ms_median"] == pytest.approx(1000.0)
    # a read that started before the window is left out; the default window spans the reads
    tr = _trace([(-1.0, -0.5, 0.5, True), (0.0, 0.0, 1.0, True)])
    assert it.summarize(tr, (0.0, 1.0))["reads"] == 1
    assert it.summarize(tr)["window_s"] == pytest.approx(1.5)
    assert it.summarize(tr)["stalled_share"] is None  # workers not given
    assert it.summarize(_trace([(0.0, 0.0, 1.0, True)]), (0.0, 1.0))["idle_share"] == 0.0


def test_summarize_bad_input() -> None:
    empty = {k: np.array([]) for k in ("submitted", "started", "finished", "bytes", "urgent",
                                       "inline")}
    assert it.summarize(empty) == {"reads": 0}
    with pytest.raises(ValueError, match="empty trace window"):
        it.summarize(_trace([(0.0, 0.0, 1.0, True)]), (1.0, 1.0))


def test_bench_trace_is_summarized(tmp_path: Path) -> None:
    """engine_read: ReadPool.bench's own trace, one record per read, at most `depth`
    running at once (the bench keeps exactly that many outstanding)."""
    db = _load("_diskbound")
    f = tmp_path / "experts.bin"
    f.write_bytes(os.urandom(2 << 20))
    try:
        gbs, tr = db.engine_read(str(f), 64 << 10, 2, 1 << 20)
    except OSError as e:  # tmpfs and some file systems refuse O_DIRECT
        pytest.skip(f"O_DIRECT not supported here: {e}")
    assert gbs > 0 and tr is not None
    assert tr["reads"] == 16 and tr["bytes"] == 16 * (64 << 10)
    assert tr["running_share"][3] == 0.0 and tr["running_share"][4] == 0.0
    assert 0.0 <= tr["stalled_share"] <= 1.0
