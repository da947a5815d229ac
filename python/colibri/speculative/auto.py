"""The "auto" rule: draft while it pays, measured.

Drafting pays when the verify forwards produce tokens faster than one-token forwards do:
``emitted tokens / verify seconds`` over the recent verifies against ``1 / seconds`` of a
one-token forward. Both are measured in this generation (so the rule sees the real cost of a
verify on this machine, this model and this load, streamed expert reads included). When
drafting loses it is switched off for a number of steps that doubles on each loss in a
row (16 up to 256), then probed again; a win resets the back-off.
"""

from __future__ import annotations

from collections import deque

__all__ = ["AutoSwitch"]

WINDOW = 6  # verifies the decision is made over
MIN_BACKOFF = 16  # one-token steps after a loss before probing again
MAX_BACKOFF = 256
REFRESH_EVERY = 48  # while drafting, one one-token forward this often keeps its cost fresh


class AutoSwitch:
    def __init__(self) -> None:
        self.drafting = True
        self.plain_s: float | None = None  # mean seconds of a one-token forward (EMA)
        self._window: deque[tuple[int, float]] = deque(maxlen=WINDOW)  # (tokens, seconds)
        self._off_left = 0
        self._backoff = MIN_BACKOFF
        self._since_plain = 0
        self.off_steps = 0
        self.switches = 0

    def wants_draft(self) -> bool:
        """Whether the next step should draft (a False step is a one-token forward)."""
        if not self.drafting:
            self._off_left -= 1
            self.off_steps += 1
            if self._off_left <= 0:  # probe again, with a fresh window
                self.drafting = True
                self.switches += 1
                self._window.clear()
            return False
        if self.plain_s is None or self._since_plain >= REFRESH_EVERY:
            return False  # measure a one-token forward
        return True

    def plain(self, seconds: float) -> None:
        self._since_plain = 0
        self.plain_s = seconds if self.plain_s is None else 0.8 * self.plain_s + 0.2 * seconds

    def verified(self, tokens: int, seconds: float) -> None:
        """A verify forward took `seconds` and produced `tokens` (accepted drafts + 1)."""
        self._since_plain += 1
        self._window.append((tokens, seconds))
        if len(self._window) < WINDOW or self.plain_s is None:
            return
        tok = sum(t for t, _ in self._window)
        sec = sum(s for _, s in self._window)
        if sec <= tok * self.plain_s:  # at least as many tokens per second: keep drafting
            self._backoff = MIN_BACKOFF
            return
        self.drafting = False
        self.switches += 1
        self._off_left = self._backoff
        self._backoff = min(2 * self._backoff, MAX_BACKOFF)
