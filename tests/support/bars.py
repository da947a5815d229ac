"""Progress bars made visible at once for tests (colibri.progress.DelayedBar): the tests
see what a slow load or prefill shows without a slow step, and a fake terminal."""

from __future__ import annotations

import io
import time

import pytest

from colibri import progress


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def drawn_at_once(monkeypatch: pytest.MonkeyPatch) -> list[progress.DelayedBar]:
    """From now on every DelayedBar has no delay and its start() returns once the bar is
    on display (or closed): deterministic, whatever the machine's load. Returns the list
    of the bars started."""
    started: list[progress.DelayedBar] = []
    monkeypatch.setattr(progress, "PROGRESS_DELAY", 0.0)
    real_start = progress.DelayedBar.start

    def start(self: progress.DelayedBar) -> progress.DelayedBar:
        started.append(self)
        real_start(self)
        deadline = time.monotonic() + 30
        while not self.shown and not self._stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.002)
        return self

    monkeypatch.setattr(progress.DelayedBar, "start", start)
    return started
