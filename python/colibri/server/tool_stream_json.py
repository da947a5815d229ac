"""Incremental readers of the bare-JSON and harmony tool-call formats (llama3_json,
mistral, mistral_json: colibri.server.tool_formats_json; harmony:
colibri.server.tool_formats_harmony), for colibri.server.tool_stream_readers' READERS.

Each is a :class:`~colibri.server.tool_stream_base.JsonCallReader`: a header up to the
``{`` of the arguments, which are echoed as ``json.dumps`` writes them, then what closes
the call. Where each call starts is where its scanner starts it (a ``<|python_tag|>``
before a Llama call, harmony's ``<|start|>assistant`` before the recipient), so the stream
matches its calls to the whole parse's (colibri.server.tool_stream).

- llama3_json: ``{"name": NAME, "parameters": {`` (or ``"arguments"``, a leading
  ``"type": "function"``, a ``<|python_tag|>`` before); Llama 3.1's built-in
  ``NAME.call(...)`` form is not read as it streams (sent whole at the end).
- mistral, mistral_json: ``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{`` (the id optional), and
  the list ``[TOOL_CALLS][{"name": NAME, "arguments": {...}, "id": ID}, ...]``, each item
  a call. A list item's id follows its arguments, so the stream cannot send the model's
  id when the call opens: it sends 9 letters and digits of its own (which Mistral's
  templates take back), where the non-streamed answer keeps the model's.
- harmony: ``to=functions.NAME<|channel|>commentary json<|message|>{`` (the channel and
  content type in either order, as tool_formats_harmony reads them), then ``<|call|>``.
"""

from __future__ import annotations

import json
import re
import uuid

from .tool_formats_harmony import _BEFORE, _HEADER_REST, RECIPIENT
from .tool_formats_json import ARGS, CALL_ID, PYTHON_TAG, TOOL_CALLS
from .tool_json_echo import JsonEcho
from .tool_stream_base import _ARGS, _HEADER, _NAME, _OUTSIDE, MAX_HEADER, JsonCallReader, Tools

__all__ = ["harmony_reader", "llama3_reader", "mistral_reader"]

_JWS = r"[ \t\n\r]*"  # JSON's whitespace
_JSON_STRING = r'"((?:[^"\\\x00-\x1f]|\\.)*)"'


def _json_name(m: re.Match[str]) -> tuple[str, None] | None:
    try:
        name = json.loads('"' + m.group(1) + '"')
    except ValueError:
        return None
    return name, None


# --- Llama 3.x

LLAMA_OPENS = ('{"name"', '{"type"', '{ "name"', '{ "type"', PYTHON_TAG)  # its FORMATS opens
_LLAMA = re.compile(r"(?:" + re.escape(PYTHON_TAG) + r"\s*)?\{" + _JWS + r'(?:"type"' + _JWS
                    + ":" + _JWS + r'"function"' + _JWS + "," + _JWS + r')?"name"' + _JWS + ":"
                    + _JWS + _JSON_STRING + _JWS + "," + _JWS + r'"(?:parameters|arguments)"'
                    + _JWS + ":" + _JWS)


def llama3_reader(tools: Tools, at: int) -> JsonCallReader:
    # The arguments sit inside the call's own object: one level deeper; "}" closes it.
    return JsonCallReader(LLAMA_OPENS, _LLAMA, _json_name, ("}",), at, depth=1)


# --- Mistral

_MISTRAL = re.compile(re.escape(TOOL_CALLS) + r"\s*" + _NAME + r"(?:" + re.escape(CALL_ID)
                      + r"([A-Za-z0-9]+))?" + re.escape(ARGS) + r"\s*")
_LIST = re.compile(re.escape(TOOL_CALLS) + r"\s*\[")
_ITEM = re.compile(_JWS + r"\{" + _JWS + r'"name"' + _JWS + ":" + _JWS + _JSON_STRING + _JWS
                   + "," + _JWS + r'"arguments"' + _JWS + ":" + _JWS)
# After an item's arguments: its id (optional), the item's end, then the next or the end.
_ITEM_END = re.compile(_JWS + r"(?:," + _JWS + r'"id"' + _JWS + ":" + _JWS + _JSON_STRING
                       + _JWS + r")?\}" + _JWS + r"([,\]])")


def _new_id() -> str:
    return uuid.uuid4().hex[:9]  # tool_formats_json.read_mistral's


def _mistral_name(m: re.Match[str]) -> tuple[str, str]:
    return m.group(1), m.group(2) or _new_id()


class _MistralReader(JsonCallReader):
    """Both Mistral spellings: a call per ``[TOOL_CALLS]NAME[ARGS]{...}``, or a list of
    calls after one ``[TOOL_CALLS]``, all of whose calls start at that marker (its
    scanner gives the first the list's span and the others empty spans at its end)."""

    def __init__(self, tools: Tools, at: int) -> None:
        super().__init__(TOOL_CALLS, _MISTRAL, _mistral_name, (), at)
        self._list_at = -1  # where the list being read began; -1: not in a list

    def _read_header(self) -> bool:
        if self._list_at < 0:
            m = _LIST.match(self._pending[:MAX_HEADER])
            if m is None:
                return super()._read_header()
            self._list_at = self._at
            self._advance(m.end())
        return self._read_item()

    def _read_trailer(self) -> bool:
        if self._list_at < 0:
            return super()._read_trailer()
        return self._read_item_end()

    def _read_item(self) -> bool:
        window = self._pending[:MAX_HEADER]
        m = _ITEM.match(window)
        if m is None or m.end() >= len(window) or window[m.end()] != "{":
            if len(self._pending) >= MAX_HEADER:
                self._bail()
            return False
        named = _json_name(m)
        if named is None:
            self._bail()
            return False
        self._call = (self._list_at, named[0], _new_id())
        self._advance(m.end())
        self._echo, self._opened, self._state = JsonEcho(2), None, _ARGS
        return True

    def _read_item_end(self) -> bool:
        m = _ITEM_END.match(self._pending[:MAX_HEADER])
        if m is None:
            if len(self._pending) >= MAX_HEADER:
                self._bail()
            return False
        self._advance(m.end())
        if m.group(2) == "]":
            self._list_at, self._state = -1, _OUTSIDE
        else:
            self._state = _HEADER
        return True


def mistral_reader(tools: Tools, at: int) -> JsonCallReader:
    return _MistralReader(tools, at)


# --- harmony

_HARMONY = re.compile(re.escape(RECIPIENT) + _NAME + _HEADER_REST.pattern + r"\s*")


def _harmony_name(m: re.Match[str]) -> tuple[str, None]:
    return m.group(1), None


def harmony_reader(tools: Tools, at: int) -> JsonCallReader:
    return JsonCallReader(RECIPIENT, _HARMONY, _harmony_name, ("<|call|>",), at,
                          before=_BEFORE)

