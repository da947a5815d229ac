"""The incremental reader of the XML-like tool-call formats (qwen3_coder, minimax_m2:
colibri.server.tool_formats_xml), one of colibri.server.tool_stream_readers' READERS.

Like GLM's reader, each parameter is written as JSON once it ends (``{"city": "Lyon"``,
then ``, "days": 3``, then ``}``), its value typed as the whole parse types it (the tool's
schema, :func:`~colibri.server.tool_formats_xml.typed_value`). It follows the scanner's
rules (tool_formats_xml.xml_scanner): a name or key is a run without tag characters,
quotes or line breaks; a value ends at the first closing tag that a key, the call's end,
or the wrapper's end follows (after whitespace), and may not hold the start of another
call. A call starts at its wrapper (``<tool_call>``) when one comes just before it.

A call whose header is not one (no name, no closing ``>``) is passed over, as the scanner
does; anything else unexpected (a value that holds another call, text where a key or
the call's end should be) stops the reader (:attr:`bailed`): the stream's end sends the
rest whole. Held back: the header, key or value being read, and a partial closing tag.
"""

from __future__ import annotations

import json

from .tool_formats_xml import XmlShape, call_name, label_pattern, xml_reader
from .tool_stream_base import (
    _IN_KEY,
    _IN_VALUE,
    _OUTSIDE,
    _PAIRS,
    _WS,
    MAX_HEADER,
    CallOpened,
    Tools,
    _PairReader,
)

__all__ = ["XmlCallReader"]



class XmlCallReader(_PairReader):
    def __init__(self, shape: XmlShape, tools: Tools, start: int) -> None:
        super().__init__(shape.call, start)
        self._shape = shape
        self._read = xml_reader(shape)
        self._tools = tools
        self._value_end = shape.value_end
        self._closers = tuple(t for t in (shape.key, shape.end, shape.stop) if t)
        self._name = ""
        self._call_at = 0
        self._pairs = 0
        self._key = ""
        self._value = []

    def _label(self, start: int, close: str) -> tuple[str, int] | str:
        """The label from `start` and where its `close` ends; or "wait", "no" (not a
        label), "long" (longer than MAX_HEADER: this reader gives up)."""
        window = self._pending[:start + MAX_HEADER]
        m = label_pattern(self._shape).match(window, start)
        assert m is not None
        rest = window[m.end():]
        if rest.startswith(close):
            return m.group().strip(), m.end() + len(close)
        if not close.startswith(rest):
            return "no"
        return "long" if len(self._pending) >= start + MAX_HEADER else "wait"

    def _read_header(self) -> bool:
        shape = self._shape
        got = self._label(len(shape.call), shape.call_end)
        if got == "wait":
            return False
        if got == "long":
            self._bail()
            return False
        name = None if isinstance(got, str) else call_name(shape, got[0])
        if name is None:  # not a call: the scanner looks on past its start
            self._advance(1)
            self._state = _OUTSIDE
            return True
        assert not isinstance(got, str)
        before = self._before((shape.wrapper,), skip_ws=True) if shape.wrapper else 0
        self._name, self._call_at, self._pairs = name, self._at - before, 0
        self._advance(got[1])
        self._state = _PAIRS
        return True

    def _read_pairs(self, out: list[CallOpened | str]) -> bool:
        ws = _WS.match(self._pending).end()  # type: ignore[union-attr]
        if ws:
            self._advance(ws)
            return True
        shape, p = self._shape, self._pending
        if p.startswith(shape.key):
            self._state = _IN_KEY
            return True
        for close in (shape.end, shape.stop):
            if close and p.startswith(close):
                if self._pairs == 0:
                    out.append(CallOpened(self._call_at, self._name, None))
                out.append("}" if self._pairs else "{}")
                self._advance(len(close))
                self._state = _OUTSIDE
                return True
        if not any(c.startswith(p) for c in self._closers):
            self._bail()
        return False

    def _read_key(self) -> bool:
        shape = self._shape
        got = self._label(len(shape.key), shape.key_end)
        if got == "wait":
            return False
        if isinstance(got, str):
            self._bail()
            return False
        self._key = got[0]
        self._advance(got[1])
        self._state, self._value = _IN_VALUE, []
        return True

    def _pair(self, out: list[CallOpened | str], value: str) -> None:
        if self._shape.call in value:  # the scanner's value never spans a call
            self._bail()
            return
        got = self._read((self._name, [(self._key, value)]), self._tools)
        if got is None:
            self._bail()
            return
        ((key, parsed),) = got[1].items()
        if self._pairs == 0:
            out.append(CallOpened(self._call_at, self._name, None))
        out.append(("{" if self._pairs == 0 else ", ") + json.dumps(key, ensure_ascii=False)
                   + ": " + json.dumps(parsed, ensure_ascii=False))
        self._pairs += 1
