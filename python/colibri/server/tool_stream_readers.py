"""Incremental readers of tool calls, one per format of colibri.server.tool_formats that
has one (:data:`READERS`): each takes an answer's text from its first call marker on,
piece by piece, and says when a call opens (:class:`CallOpened`: where, its name) and
what its arguments' JSON is so far (``str`` fragments), so a stream can send them as the
model writes them (colibri.server.tool_stream, which also settles every stream with the
format's whole parse).

- JSON arguments (hermes, kimi_k2, deepseek_v3, deepseek_v31): the call's header is read
  up to the ``{`` its arguments begin with, then the arguments go through
  :class:`~colibri.server.tool_json_echo.JsonEcho`, which writes them as ``json.dumps``
  would. A call opens once its arguments' first member has reached its value (``{"city":
  "``), so a call whose header or first key is wrong never opens.
  llama3_json, mistral, mistral_json and harmony read the same way
  (colibri.server.tool_stream_json).
- Key/value arguments (glm): each ``<arg_key>K</arg_key><arg_value>V</arg_value>`` pair
  is written as JSON when it ends (``{"a": 1``, then ``, "b": "x"``, then ``}``), its value
  read as the whole parse reads it (the tool's schema says whether it is a string);
  qwen3_coder, minimax_m2, deepseek_v32, deepseek_v4 and kimi_k3 the same way, a parameter at a time
  (colibri.server.tool_stream_xml).

What the readers share (:class:`CallOpened`, :class:`JsonCallReader`) is
colibri.server.tool_stream_base.

A reader that meets something it does not expect (a malformed call, a header longer than
:data:`MAX_HEADER`, a value it cannot follow) stops for good (:attr:`bailed`): the
stream's end then sends what is left, whole. Each reader holds back only the construct it
is reading (a header, a GLM key or value, a partial marker) and reads each character a
bounded number of times: linear in the answer (the model's text is untrusted).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from .tool_formats import FORMATS, deepseek_marker
from .tool_formats_xml import DEEPSEEK_V4, DEEPSEEK_V32, KIMI_K3, MINIMAX_M2, QWEN3_CODER
from .tool_stream_base import (
    _IN_KEY,
    _IN_VALUE,
    _NAME,
    _OUTSIDE,
    _PAIRS,
    _WS,
    MAX_HEADER,
    CallOpened,
    CallReader,
    JsonCallReader,
    Tools,
    _PairReader,
)
from .tool_stream_json import harmony_reader, llama3_reader, mistral_reader
from .tool_stream_xml import XmlCallReader

__all__ = ["MAX_HEADER", "READERS", "CallOpened", "CallReader"]

_KEY, _KEY_END, _VALUE, _VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_GLM_CALL, _GLM_CALL_END = "<tool_call>", "</tool_call>"
_GLM_HEADER = re.compile(r"<tool_call>[ \t]*" + _NAME + r"\s*")


def _pending_prefix(rest: str, *tags: str) -> bool:
    """Whether `rest` (what follows, maybe cut short) may still become one of `tags`."""
    return any(t.startswith(rest) for t in tags)


class GlmCallReader(_PairReader):
    """GLM-4.5/4.6's ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...
    </tool_call>`` (tool_formats._scan_glm: a key ends at the first ``</arg_key>`` that
    ``<arg_value>`` follows; a value at the first ``</arg_value>`` that a key or the
    call's end follows)."""

    def __init__(self, tools: Tools, start: int) -> None:
        super().__init__(_GLM_CALL, start)
        self._tools = tools
        self._name = ""
        self._call_at = 0
        self._pairs = 0
        self._key = ""
        self._search = 0  # where the next closing tag may begin in _pending
        self._value = []
        self._value_end, self._closers = _VALUE_END, (_KEY, _GLM_CALL_END)

    def _read_header(self) -> bool:
        window = self._pending[:MAX_HEADER]
        m = _GLM_HEADER.match(window)
        if m is not None:
            rest = window[m.end():]
            if rest.startswith((_KEY, _GLM_CALL_END)):
                self._name, self._call_at, self._pairs = m.group(1), self._at, 0
                self._advance(m.end())
                self._state = _PAIRS
                return True
            if not _pending_prefix(rest, _KEY, _GLM_CALL_END):
                self._bail()  # a name, then neither a key nor the call's end
        elif window[len(_GLM_CALL):].strip(" \t"):
            self._bail()  # no name
        if len(self._pending) >= MAX_HEADER:
            self._bail()
        return False

    def _read_pairs(self, out: list[CallOpened | str]) -> bool:
        p = self._pending
        if p.startswith(_GLM_CALL_END):
            if self._pairs == 0:
                out.append(CallOpened(self._call_at, self._name, None))
            out.append("}" if self._pairs else "{}")
            self._advance(len(_GLM_CALL_END))
            self._state = _OUTSIDE
            return True
        if p.startswith(_KEY):
            self._advance(len(_KEY))
            self._state, self._search = _IN_KEY, 0
            return True
        if not _pending_prefix(p, _KEY, _GLM_CALL_END):
            self._bail()
        return False

    def _read_key(self) -> bool:
        p = self._pending
        k = p.find(_KEY_END, self._search)
        while k >= 0:
            after = _WS.match(p, k + len(_KEY_END)).end()  # type: ignore[union-attr]
            rest = p[after:after + len(_VALUE)]
            if rest == _VALUE:
                self._key = p[:k]
                self._advance(after + len(_VALUE))
                self._state, self._value = _IN_VALUE, []
                return True
            if not _pending_prefix(rest, _VALUE):
                k = p.find(_KEY_END, k + 1)
                continue
            break  # maybe a key's end: wait for more
        if len(p) >= MAX_HEADER:
            self._bail()
        elif k < 0:
            self._search = max(0, len(p) - len(_KEY_END) + 1)
        else:
            self._search = k
        return False

    def _pair(self, out: list[CallOpened | str], value: str) -> None:
        got = FORMATS["glm"].read((self._name, [(self._key, value)]), self._tools)
        if got is None:
            self._bail()
            return
        ((key, parsed),) = got[1].items()
        if self._pairs == 0:
            out.append(CallOpened(self._call_at, self._name, None))
        out.append(("{" if self._pairs == 0 else ", ") + json.dumps(key, ensure_ascii=False)
                   + ": " + json.dumps(parsed, ensure_ascii=False))
        self._pairs += 1


# --- the JSON formats' headers (tool_formats' scanners, up to the arguments' "{")

_JWS = r"[ \t\n\r]*"  # JSON's whitespace
_HERMES = re.compile(r"<tool_call>\s*\{" + _JWS + r'"name"' + _JWS + ":" + _JWS
                     + r'"((?:[^"\\\x00-\x1f]|\\.)*)"' + _JWS + "," + _JWS + r'"arguments"'
                     + _JWS + ":" + _JWS)
_KIMI_CALL, _KIMI_ARGS = "<|tool_call_begin|>", "<|tool_call_argument_begin|>"
_KIMI = re.compile(re.escape(_KIMI_CALL) + r"\s*" + _NAME + r"(?::(\d+))?\s*"
                   + re.escape(_KIMI_ARGS) + r"\s*")
_DS_CALL, _DS_SEP = deepseek_marker("tool call begin"), deepseek_marker("tool sep")
_DS_CALL_END = deepseek_marker("tool call end")
_DS_V3 = re.compile(re.escape(_DS_CALL) + r"\s*\w*\s*" + re.escape(_DS_SEP) + r"\s*" + _NAME
                    + r"\s*```(?:json)?\s*")
_DS_V31 = re.compile(re.escape(_DS_CALL) + r"\s*" + _NAME + r"\s*" + re.escape(_DS_SEP)
                     + r"\s*")


def _hermes_name(m: re.Match[str]) -> tuple[str, None] | None:
    try:
        name = json.loads('"' + m.group(1) + '"')
    except ValueError:
        return None
    return name, None


def _kimi_name(m: re.Match[str]) -> tuple[str, str]:
    name = m.group(1)
    prefix = "functions."
    if name.startswith(prefix) and len(name) > len(prefix) and re.match(
            r"[A-Za-z0-9_]", name[len(prefix)]):
        name = name[len(prefix):]
    return name, f"functions.{name}:{m.group(2) or '0'}"  # tool_formats._read_kimi's id


def _plain_name(m: re.Match[str]) -> tuple[str, None]:
    return m.group(1), None


READERS: dict[str, Callable[[Tools, int], CallReader]] = {
    # The args object sits inside the call's own object: one level deeper.
    "hermes": lambda tools, at: JsonCallReader("<tool_call>", _HERMES, _hermes_name,
                                               ("}", "</tool_call>"), at, depth=1),
    "kimi_k2": lambda tools, at: JsonCallReader(_KIMI_CALL, _KIMI, _kimi_name,
                                                ("<|tool_call_end|>",), at),
    "deepseek_v3": lambda tools, at: JsonCallReader(_DS_CALL, _DS_V3, _plain_name,
                                                    ("```", _DS_CALL_END), at),
    "deepseek_v31": lambda tools, at: JsonCallReader(_DS_CALL, _DS_V31, _plain_name,
                                                     (_DS_CALL_END,), at),
    "glm": GlmCallReader,
    "qwen3_coder": lambda tools, at: XmlCallReader(QWEN3_CODER, tools, at),
    "minimax_m2": lambda tools, at: XmlCallReader(MINIMAX_M2, tools, at),
    "deepseek_v32": lambda tools, at: XmlCallReader(DEEPSEEK_V32, tools, at),
    "deepseek_v4": lambda tools, at: XmlCallReader(DEEPSEEK_V4, tools, at),
    "kimi_k3": lambda tools, at: XmlCallReader(KIMI_K3, tools, at),
    "llama3_json": llama3_reader,
    "mistral": mistral_reader,
    "mistral_json": mistral_reader,
    "harmony": harmony_reader,
}
"""The formats read as they stream, by name; a format not here has its calls sent whole
at the stream's end."""
