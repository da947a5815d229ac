"""Stop conditions for a generation loop: EOS tokens, stop strings and a token budget.

:class:`StopChecker` is fed each generated token id with the text it added (from an
incremental detokenizer; ``""`` while a multi-byte character is incomplete) and says
whether to stop, why, and how much text is safe to show now. Text that could be the start
of a stop string is held back until the following text settles it; a stop string is never
emitted, even when it spans several tokens, and nothing after it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Literal

import numpy as np

from ..errors import ConfigError, InvalidRequestError
from .params import MAX_TOKEN_ID

__all__ = ["FinishReason", "StopChecker", "StopStatus"]

FinishReason = Literal["stop", "length"]
"""``"stop"``: an EOS token or a stop string ended the text; ``"length"``: max_tokens did
(the OpenAI API's ``finish_reason`` values)."""


@dataclasses.dataclass(frozen=True)
class StopStatus:
    """What :meth:`StopChecker.feed` found after one token."""

    text: str
    """Text that is safe to emit now (possibly empty). Once done, this is the last text."""

    finish_reason: FinishReason | None
    """None while generation should go on."""

    stop_string: str | None = None
    """The stop string that matched (finish_reason "stop" by a string), else None."""

    @property
    def done(self) -> bool:
        """True when generation must stop."""
        return self.finish_reason is not None


class StopChecker:
    """Decides when a generation ends and what text may be shown meanwhile.

    ``stop_strings``: a string or strings that end the text (not emitted; the earliest
    match wins, the longest one on a tie). ``eos_ids``: token ids that end it (their text
    is not emitted). ``max_tokens``: the most tokens to generate, EOS included; None = no
    limit, 0 = none (the checker starts done). A stop string or EOS on the last allowed
    token reports "stop", not "length".

    ::

        stop = StopChecker(["\\n\\n"], eos_ids={2}, max_tokens=256)
        while not stop.done:
            tok = sampler(session.forward(...), history)
            status = stop.feed(tok, detok.add(tok))
            print(status.text, end="")
    """

    def __init__(
        self,
        stop_strings: str | Iterable[str] = (),
        eos_ids: int | Iterable[int] = (),
        max_tokens: int | None = None,
    ) -> None:
        if isinstance(stop_strings, str):
            stop_strings = (stop_strings,)
        strings: dict[str, None] = {}  # in order, each once
        for s in stop_strings:
            if not isinstance(s, str) or not s:
                raise ConfigError(
                    f"stop_strings: {s!r} is not allowed; use non-empty strings"
                )
            strings[s] = None
        if isinstance(eos_ids, (int, np.integer)):
            eos_ids = (int(eos_ids),)
        ids: set[int] = set()
        for t in eos_ids:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not (
                0 <= t <= MAX_TOKEN_ID
            ):
                raise ConfigError(f"eos_ids: {t!r} is not allowed; use token ids >= 0")
            ids.add(int(t))
        if max_tokens is not None and (
            isinstance(max_tokens, bool)
            or not isinstance(max_tokens, (int, np.integer))
            or max_tokens < 0
        ):
            raise ConfigError(
                f"max_tokens: {max_tokens!r} is not allowed; use an integer >= 0 or None"
            )
        self.stop_strings: tuple[str, ...] = tuple(strings)
        self.eos_ids: frozenset[int] = frozenset(ids)
        self.max_tokens: int | None = None if max_tokens is None else int(max_tokens)
        # Each string's KMP failure table: the text is read once, a character at a time,
        # so a token costs O(its characters x the strings), however long the text so far
        # and however long the strings.
        self._fail = [_failure(s) for s in strings]
        self.reset()

    def reset(self) -> None:
        """Starts over for a new generation (same settings)."""
        self._held = ""
        # Per string: the length of the longest suffix of the text so far that begins it.
        self._state = [0] * len(self.stop_strings)
        self._n_tokens = 0
        self._finish: FinishReason | None = "length" if self.max_tokens == 0 else None
        self._stop_string: str | None = None

    @property
    def done(self) -> bool:
        return self._finish is not None

    @property
    def finish_reason(self) -> FinishReason | None:
        return self._finish

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self._stop_string

    @property
    def n_tokens(self) -> int:
        """Tokens fed so far."""
        return self._n_tokens

    @property
    def held(self) -> str:
        """Text held back because it may begin a stop string."""
        return self._held

    def feed(self, token_id: int, text: str = "") -> StopStatus:
        """Records one generated token and the text it added; returns what to emit and
        whether to stop. Feeding after the checker is done raises InvalidRequestError."""
        if self._finish is not None:
            raise InvalidRequestError(
                f"StopChecker: generation already finished ({self._finish!r}); call reset()"
            )
        if not isinstance(text, str):
            raise InvalidRequestError(f"text: expected a str, got {type(text).__name__}")
        self._n_tokens += 1
        if int(token_id) in self.eos_ids:
            return self._finish_with("stop", self.flush())
        buf = self._held + text
        matched = self._advance(text)
        match = self._find_stop(buf) if matched else None
        if match is not None:
            at, s = match
            self._held = ""
            self._stop_string = s
            return self._finish_with("stop", buf[:at], s)
        if self.max_tokens is not None and self._n_tokens >= self.max_tokens:
            self._held = ""
            return self._finish_with("length", buf)
        keep = max(self._state, default=0)  # never more than buf: see _advance
        self._held = buf[len(buf) - keep:]
        return StopStatus(buf[: len(buf) - keep], None)

    def flush(self) -> str:
        """Returns and clears the held-back text: call it when generation ends for a
        reason the checker does not see (context full, cancelled)."""
        out, self._held = self._held, ""
        self._state = [0] * len(self.stop_strings)
        return out

    def _finish_with(self, reason: FinishReason, text: str, s: str | None = None) -> StopStatus:
        self._finish = reason
        return StopStatus(text, reason, s)

    def _find_stop(self, buf: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for s in self.stop_strings:
            at = buf.find(s)
            if at >= 0 and (best is None or at < best[0] or (at == best[0]
                                                             and len(s) > len(best[1]))):
                best = (at, s)
        return best

    def _advance(self, text: str) -> bool:
        """Reads `text` into each string's match state; True when a stop string ends in it.
        Without a match, the longest state is the longest suffix of the text so far that
        is a proper prefix of a stop string: it lies within the held text and `text` (a
        longer one would have been held before), so it is what must wait."""
        matched = False
        for k, (s, fail) in enumerate(zip(self.stop_strings, self._fail, strict=True)):
            q = self._state[k]
            for c in text:
                while q and s[q] != c:
                    q = fail[q - 1]
                if s[q] == c:
                    q += 1
                if q == len(s):
                    matched = True
                    q = fail[q - 1]
            self._state[k] = q
        return matched

    def __repr__(self) -> str:
        return (f"StopChecker(stop_strings={list(self.stop_strings)!r}, "
                f"eos_ids={sorted(self.eos_ids)!r}, max_tokens={self.max_tokens!r})")


def _failure(s: str) -> list[int]:
    """KMP's table: ``[i]`` is the length of the longest proper prefix of ``s[:i + 1]``
    that is also its suffix."""
    fail = [0] * len(s)
    q = 0
    for i in range(1, len(s)):
        while q and s[i] != s[q]:
            q = fail[q - 1]
        if s[i] == s[q]:
            q += 1
        fail[i] = q
    return fail
