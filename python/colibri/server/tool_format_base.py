"""What every tool-call format of colibri.server.tool_formats is built from: a parsed
:class:`ToolCall`, a :class:`CallFormat` (a scanner that finds the calls in the model's
text and a reader that turns each into a name and arguments), reading JSON with a depth
bound, and the linear-time scanning pieces (str.find and regexes without nested
repetition) the scanners share."""

from __future__ import annotations

import bisect
import json
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "CallFormat", "Found", "Reader", "Scanner", "ToolCall", "Tools",
           "json_end"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str

    def openai(self, index: int | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "type": "function",
                             "function": {"name": self.name,
                                          "arguments": json.dumps(self.arguments,
                                                                  ensure_ascii=False)}}
        if index is not None:
            d["index"] = index
        return d

    def anthropic(self) -> dict[str, Any]:
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": self.arguments}



Tools = Sequence[dict[str, Any]] | None
# One call found in the text: (where it starts, where it ends, what its reader needs).
Found = tuple[int, int, tuple[Any, ...]]
# All the calls of a text, left to right, none overlapping; each must run in linear time
# (the text is the model's output: untrusted).
Scanner = Callable[[str], Iterator[Found]]
# (a call's fields, the request's tools) -> (name, arguments, the model's call id)
Reader = Callable[[tuple[Any, ...], Tools], tuple[str, dict[str, Any], str | None] | None]


@dataclass(frozen=True)
class CallFormat:
    """How one family writes tool calls: ``markers`` (all in a template's source: that
    template asks for this format), ``opens`` (the texts that begin the calls: a stream
    holds back what follows), ``scan`` (finds the calls), ``read`` (a call's name and
    arguments), ``section`` (the wrapper around all calls, dropped once a call inside
    parsed)."""

    name: str
    markers: tuple[str, ...]
    opens: tuple[str, ...]
    scan: Scanner
    read: Reader
    section: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()  # none of these in the template's source

    def matches(self, source: str) -> bool:
        return (all(m in source for m in self.markers)
                and not any(a in source for a in self.absent))

    def parse(self, text: str, id_prefix: str = "call_", tools: Tools = None,
              ) -> tuple[str, list[ToolCall]]:
        """(the text without the parsed calls, stripped; the calls)."""
        calls: list[ToolCall] = []
        kept: list[str] = []
        pos = 0
        for start, end, fields in self.scan(text):
            got = self.read(fields, tools)
            if got is None:
                continue
            name, args, call_id = got
            kept.append(text[pos:start])
            pos = end
            calls.append(ToolCall(name, args, call_id or f"{id_prefix}{uuid.uuid4().hex[:24]}"))
        kept.append(text[pos:])
        rest = "".join(kept)
        if calls:
            for marker in self.section:
                rest = rest.replace(marker, "")
        return rest.strip(), calls


MAX_JSON_DEPTH = 128
"""JSON in a call nested deeper than this is not read (the call stays text): json.loads
would recurse once per level."""

# A JSON string (its closing quote optional, so a match never fails and never
# backtracks) or a bracket: what _too_deep counts.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def _too_deep(text: str) -> bool:
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        c = text[m.start()]
        if c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        elif c in "]}":
            depth -= 1
    return False


def json_end(text: str, start: int, stop: int | None = None) -> int:
    """Where the JSON object or array opening at `start` closes (the index after its last
    bracket), or minus where the reading stopped: it does not close before `stop` (the
    end of the text when None), or nests deeper than MAX_JSON_DEPTH."""
    depth = 0
    stop = len(text) if stop is None else stop
    for m in _JSON_TOKEN.finditer(text, start, stop):
        c = text[m.start()]
        if c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return -m.end()
        elif c in "]}":
            depth -= 1
            if depth == 0:
                return m.end()
    return -stop


_UNREAD = object()


def _json(text: str) -> Any:
    """The JSON value of `text`, or _UNREAD when it is not JSON, nests too deep, or holds a
    lone surrogate (``"\\ud800"``: json.loads keeps it, but no UTF-8 answer can carry it)."""
    if _too_deep(text):
        return _UNREAD
    try:
        value = json.loads(text)
        if "\\u" in text:  # only an escape can make a lone surrogate
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        return value
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        return _UNREAD


def _object(body: str) -> dict[str, Any] | None:
    obj = _json(body)
    return obj if isinstance(obj, dict) else None


# --- scanning: str.find, and regexes without nested repetition, each position read a
# bounded number of times.

_WS = re.compile(r"\s*")
_NAME_RUN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_WORD_RUN = re.compile(r"\w*")
_DIGITS = re.compile(r"\d+")


def _skip_ws(text: str, pos: int) -> int:
    m = _WS.match(text, pos)
    return m.end() if m else pos


def _name_at(text: str, pos: int) -> tuple[str, int] | None:
    m = _NAME_RUN.match(text, pos)
    return None if m is None else (m.group(), m.end())


def _body_to(text: str, a: int, end_marker: str) -> tuple[str, int]:
    """What ``\\s*(.*?)\\s*(?:END|\\Z)`` reads from `a`: (the body up to the first
    `end_marker`, or the end of the text, stripped; where the call ends)."""
    a = _skip_ws(text, a)
    c = text.find(end_marker, a)
    if c < 0:
        return text[a:].rstrip(), len(text)
    return text[a:c].rstrip(), c + len(end_marker)


class _Good:
    """The positions of `marker` in a text whose next text (after whitespace) is one
    of `then` (or the end of the text, when `or_end`), found once; :meth:`first` is
    the first at or after a position."""

    def __init__(self, text: str, marker: str, then: tuple[str, ...], or_end: bool) -> None:
        self._at: list[int] = []
        i = text.find(marker)
        while i >= 0:
            j = _skip_ws(text, i + len(marker))
            if (or_end and j == len(text)) or any(text.startswith(t, j) for t in then):
                self._at.append(i)
            i = text.find(marker, i + 1)

    def first(self, pos: int) -> int:
        k = bisect.bisect_left(self._at, pos)
        return self._at[k] if k < len(self._at) else -1


def _scan_starts(text: str, open_: str, at: Callable[[int], Found | None]) -> Iterator[Found]:
    """What ``finditer`` does with a pattern that begins with `open_`: the call at each
    `open_` not inside an earlier call."""
    i = text.find(open_)
    while i >= 0:
        found = at(i)
        if found is None:
            i = text.find(open_, i + 1)
        else:
            yield found
            i = text.find(open_, max(found[1], i + 1))

def _param_types(tools: Tools, name: str) -> dict[str, Any]:
    for t in tools or ():
        f = t.get("function", t)
        if f.get("name") == name:
            props = (f.get("parameters") or {}).get("properties") or {}
            return {k: _declared_type(v or {}) for k, v in props.items()}
    return {}


def _declared_type(schema: dict[str, Any]) -> Any:
    """A parameter's JSON type: its ``type``, or "string" for an untyped enum of strings
    (``{"enum": ["1", "2"]}``: its values are text even when they look like numbers)."""
    kind = schema.get("type")
    enum = schema.get("enum")
    if kind is None and isinstance(enum, list) and enum and all(isinstance(e, str) for e in enum):
        return "string"
    return kind
