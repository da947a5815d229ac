"""What the incremental tool-call readers share (colibri.server.tool_stream_readers lists
them in READERS): :class:`CallOpened`, the :class:`CallReader` protocol, the base that
holds the text not yet read and what came just before it, and :class:`JsonCallReader`,
the reader of every format whose arguments are one JSON object after a header."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .tool_json_echo import JsonEcho

__all__ = ["MAX_HEADER", "CallOpened", "CallReader", "JsonCallReader", "Tools"]

MAX_HEADER = 512
"""Most characters a call's header (marker, name, up to its arguments), a GLM key, or the
whitespace after a closing tag may take while a reader waits for its end."""

Tools = Sequence[dict[str, Any]] | None


@dataclass(frozen=True)
class CallOpened:
    at: int  # where the call's marker begins in the answer
    name: str
    call_id: str | None  # the id the model wrote (Kimi's), or None


class CallReader(Protocol):
    bailed: bool

    def feed(self, text: str) -> list[CallOpened | str]: ...


_NAME = r"([A-Za-z0-9_][A-Za-z0-9_.\-]*)"  # tool_formats._NAME_RUN
_WS = re.compile(r"\s*")
_OUTSIDE, _HEADER, _ARGS, _TRAILER = range(4)
_TAIL = 64  # what _Reader keeps of the text read before a call's marker


class _Reader:
    """What the readers share: the text not yet read (`_pending`, small), where it begins
    in the answer (`_at`), and what was read just before it (:meth:`_before`: a scanner
    may start a call at a wrapper written before its marker)."""

    def __init__(self, marker: str | tuple[str, ...], start: int) -> None:
        self.bailed = False
        self._markers = (marker,) if isinstance(marker, str) else marker
        self._pending = ""
        self._at = start
        self._state = _OUTSIDE
        self._word = ""  # the last _TAIL characters read, up to the last non-whitespace
        self._gap = ""  # the whitespace read after it (its last _TAIL characters)
        self._gap_len = 0  # ... and its whole length

    def _advance(self, n: int) -> None:
        read = self._pending[:n]
        self._pending = self._pending[n:]
        self._at += n
        body = read.rstrip()
        if body:
            self._word = (self._word + self._gap + body[-_TAIL:])[-_TAIL:]
            self._gap, self._gap_len = read[len(body):][-_TAIL:], n - len(body)
        else:
            self._gap, self._gap_len = (self._gap + read)[-_TAIL:], self._gap_len + n

    def _before(self, prefixes: tuple[str, ...], skip_ws: bool = False) -> int:
        """How far before `_at` the call starts: the length of the first of `prefixes`
        that the text read ends with (with `skip_ws`, after the whitespace that ends it,
        counted too), else 0."""
        if skip_ws:
            return next((self._gap_len + len(p) for p in prefixes if self._word.endswith(p)), 0)
        if self._gap_len > _TAIL:
            return 0
        read = self._word + self._gap
        return next((len(p) for p in prefixes if read.endswith(p)), 0)

    def _find_call(self) -> bool:
        """Skips to the next call marker; False when there is none yet (a partial one
        is kept)."""
        found = [j for j in (self._pending.find(m) for m in self._markers) if j >= 0]
        if not found:
            longest = max(len(m) for m in self._markers)
            self._advance(max(0, len(self._pending) - longest + 1))
            return False
        self._advance(min(found))
        self._state = _HEADER
        return True

    def _bail(self) -> None:
        self.bailed = True
        self._pending = ""


_PAIRS, _IN_KEY, _IN_VALUE = range(4, 7)  # after _Reader's states


class _PairReader(_Reader):
    """The driver of the readers whose calls write one tag pair per parameter (GLM's,
    colibri.server.tool_stream_xml's): each reads its header, keys and values in its own
    ``_read_*`` methods."""

    def feed(self, text: str) -> list[CallOpened | str]:
        if self.bailed:
            return []
        out: list[CallOpened | str] = []
        self._pending += text
        while not self.bailed and self._pending and self._step(out):
            pass
        return out

    def _step(self, out: list[CallOpened | str]) -> bool:
        """Reads on from the state it is in; False: wait for more text."""
        if self._state == _OUTSIDE:
            return self._find_call()
        if self._state == _HEADER:
            return self._read_header()
        if self._state == _PAIRS:
            return self._read_pairs(out)
        if self._state == _IN_KEY:
            return self._read_key()
        return self._read_value(out)

    def _read_header(self) -> bool:
        raise NotImplementedError

    def _read_pairs(self, out: list[CallOpened | str]) -> bool:
        raise NotImplementedError

    def _read_key(self) -> bool:
        raise NotImplementedError

    # Each reader sets these: the tag that ends a value, the tags that may follow it (a
    # value ends at the first value end that one of them follows, whitespace between).
    _value_end: str
    _closers: tuple[str, ...]
    _value: list[str]

    def _read_value(self, out: list[CallOpened | str]) -> bool:
        end, p = self._value_end, self._pending
        e = p.find(end)
        if e < 0:
            keep = len(end) - 1
            if len(p) > keep:
                self._value.append(p[:len(p) - keep])
                self._advance(len(p) - keep)
            return False
        after = _WS.match(p, e + len(end)).end()  # type: ignore[union-attr]
        rest = p[after:]
        if rest.startswith(self._closers):
            self._pair(out, "".join(self._value) + p[:e])
            self._advance(after)
            self._state = _PAIRS
            return True
        if any(c.startswith(rest) for c in self._closers):  # maybe the value's end: wait
            self._value.append(p[:e])
            self._advance(e)
            if after - e > MAX_HEADER:
                self._bail()
            return False
        self._value.append(p[:e + 1])  # a closing tag inside the value
        self._advance(e + 1)
        return True

    def _pair(self, out: list[CallOpened | str], value: str) -> None:
        """One parameter read whole: its value parsed, sent as JSON."""
        raise NotImplementedError


class JsonCallReader(_Reader):
    """The JSON-argument formats: `header` matches a call's marker up to the ``{`` of its
    arguments; `naming` turns its match into (name, the model's call id) or None;
    `trailer`, what closes a call after its arguments (whitespace allowed before each):
    anything else there stops the reader (the call is not the format's). `marker` may be
    several (the first found begins the header); `before`: texts that, written just
    before the marker, belong to the call (its scanner starts the call there)."""

    def __init__(self, marker: str | tuple[str, ...], header: re.Pattern[str],
                 naming: Callable[[re.Match[str]], tuple[str, str | None] | None],
                 trailer: tuple[str, ...], start: int, depth: int = 0,
                 before: tuple[str, ...] = ()) -> None:
        super().__init__(marker, start)
        self._header, self._naming, self._depth = header, naming, depth
        self._prefixes = before
        self._trailer, self._closed = trailer, 0
        self._echo = JsonEcho(depth)
        self._opened: CallOpened | None = None
        self._call: tuple[int, str, str | None] = (0, "", None)

    def feed(self, text: str) -> list[CallOpened | str]:
        if self.bailed:
            return []
        out: list[CallOpened | str] = []
        self._pending += text
        while not self.bailed and self._pending:
            if self._state == _OUTSIDE:
                if not self._find_call():
                    break
            elif self._state == _HEADER:
                if not self._read_header():
                    break
            elif self._state == _TRAILER:
                if not self._read_trailer():
                    break
            else:
                used = self._echo.feed(self._pending)
                if self._echo.failed:
                    self._bail()
                    break
                if self._echo.started:
                    if self._opened is None:
                        self._opened = CallOpened(*self._call)
                        out.append(self._opened)
                    fragment = self._echo.take()
                    if fragment:
                        out.append(fragment)
                self._advance(used)
                if not self._echo.done:
                    break
                self._state, self._closed = _TRAILER, 0
        return out

    def _read_trailer(self) -> bool:
        while self._closed < len(self._trailer):
            at = _WS.match(self._pending).end()  # type: ignore[union-attr]
            tag, rest = self._trailer[self._closed], self._pending[at:]
            if rest.startswith(tag):
                self._advance(at + len(tag))
                self._closed += 1
                continue
            if at > MAX_HEADER or not tag.startswith(rest):
                self._bail()
            elif at:
                self._advance(at)
            return False
        self._state = _OUTSIDE
        return True

    def _read_header(self) -> bool:
        window = self._pending[:MAX_HEADER]
        m = self._header.match(window)
        if m is None or m.end() >= len(window) or window[m.end()] != "{":
            if len(self._pending) >= MAX_HEADER:
                self._bail()
            return False
        named = self._naming(m)
        if named is None:
            self._bail()
            return False
        self._call = (self._at - self._before(self._prefixes), *named)
        self._advance(m.end())
        self._echo, self._opened, self._state = JsonEcho(self._depth), None, _ARGS
        return True
