"""An incremental reader of one JSON object in a model's output (a tool call's arguments):
:class:`JsonEcho` takes the text piece by piece, checks it as Python's ``json.loads``
would, and writes it back out as ``json.dumps(value, ensure_ascii=False)`` writes the
parsed value: ``", "`` and ``": "`` between items, no other whitespace, strings re-escaped
(``\\u00e9`` becomes ``é``, ``\\/`` becomes ``/``), numbers as Python prints the number
they parse to (``1e2`` becomes ``100.0``). So the concatenated output is the very string
the non-streamed answer sends as a call's ``arguments``, whatever the model's spacing
(colibri.server.tool_stream). The one exception: an object with a repeated key, which the
output keeps twice where ``json.loads`` keeps the last (``json.loads`` of either gives the
same value).

Each character is read once (runs of plain string characters by one regex match); held
back are at most a number or literal being read (:data:`MAX_TOKEN` characters) and a
``\\uXXXX`` escape.
"""

from __future__ import annotations

import json
import re

from .tool_formats import MAX_JSON_DEPTH

__all__ = ["JsonEcho"]

MAX_TOKEN = 4096
"""The longest number or literal read as it streams; a longer one stops the echo (the
whole answer's parse still reads it)."""

_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LITERALS = {"true", "false", "null", "NaN", "Infinity", "-Infinity"}
_TOKEN_CHARS = frozenset("-+.0123456789eEabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_VALUE_START = frozenset('-0123456789tfnNI"{[')
_SIMPLE_ESCAPES = {'"': '\\"', "\\": "\\\\", "/": "/", "b": "\\b", "f": "\\f", "n": "\\n",
                   "r": "\\r", "t": "\\t"}
_JSON_WS = " \t\n\r"
_HEX = frozenset("0123456789abcdefABCDEF")

# What comes next: a value, an object's key (or its end, right after "{"), a colon, a
# comma or the container's end, an array's first value (or its end).
_VALUE, _KEY_OR_END, _KEY, _COLON, _COMMA_OR_END, _VALUE_OR_END = range(6)


def _dumped(ch: str) -> str:
    """One decoded string character as json.dumps(ensure_ascii=False) writes it."""
    if ch == '"':
        return '\\"'
    if ch == "\\":
        return "\\\\"
    if ch < " ":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b",
                "\f": "\\f"}.get(ch, f"\\u{ord(ch):04x}")
    return ch


class JsonEcho:
    """Reads one JSON object (`depth` containers already open around it, for the depth
    limit). :meth:`feed` returns how much of its text belonged to the object (all of it
    until the object's end); :meth:`take` the normalized text written since the last
    take. :attr:`done`: the object ended; :attr:`failed`: the text is not JSON that
    ``json.loads`` reads (or a number or literal ran past MAX_TOKEN); :attr:`started`:
    the object's first member reached its value (or the object closed), the point after
    which a tool call is announced (colibri.server.tool_stream)."""

    def __init__(self, depth: int = 0) -> None:
        self.done = False
        self.failed = False
        self.started = False
        self._base = depth
        self._stack: list[str] = []  # "{" or "["
        self._expect = _VALUE
        self._out: list[str] = []
        self._token: list[str] = []  # a number or literal being read
        self._token_len = 0
        self._in_string = False
        self._escape: str | None = None  # None: not in an escape; "": after "\"; "u..."
        self._high: int | None = None  # a \uD8xx escape waiting for its low half
        self._high_slash = False  # ... and the backslash after it was read

    def take(self) -> str:
        out = "".join(self._out)
        self._out.clear()
        return out

    def feed(self, text: str) -> int:
        i, n = 0, len(text)
        while i < n and not (self.done or self.failed):
            if self._in_string:
                i = self._string(text, i)
                continue
            ch = text[i]
            if self._token:
                if ch in _TOKEN_CHARS:
                    self._token.append(ch)
                    self._token_len += 1
                    if self._token_len > MAX_TOKEN:
                        self.failed = True
                    i += 1
                    continue
                self._end_token()
                continue  # the same character again, after the token
            i += 1
            if ch in _JSON_WS:
                continue
            self._char(ch)
        return i if not self.failed else n

    # --- outside strings

    def _char(self, ch: str) -> None:
        e = self._expect
        if e in (_VALUE, _VALUE_OR_END) and not (e == _VALUE_OR_END and ch == "]"):
            self._value(ch)
        elif e in (_KEY, _KEY_OR_END) and ch == '"':
            self._out.append('"')
            self._in_string = True
        elif (e == _KEY_OR_END and ch == "}") or (e == _VALUE_OR_END and ch == "]") or (
                e == _COMMA_OR_END and ch == ("}" if self._stack[-1] == "{" else "]")):
            self._close(ch)
        elif e == _COLON and ch == ":":
            self._out.append(": ")
            self._expect = _VALUE
        elif e == _COMMA_OR_END and ch == ",":
            self._out.append(", ")
            self._expect = _KEY if self._stack[-1] == "{" else _VALUE
        else:
            self.failed = True

    def _value(self, ch: str) -> None:
        if not self._stack and ch != "{":  # the arguments are an object
            self.failed = True
            return
        if ch not in _VALUE_START:
            self.failed = True
            return
        if len(self._stack) == 1 and self._stack[0] == "{":
            self.started = True
        if ch in "{[":
            if self._base + len(self._stack) + 1 > MAX_JSON_DEPTH:
                self.failed = True
                return
            self._stack.append(ch)
            self._out.append(ch)
            self._expect = _KEY_OR_END if ch == "{" else _VALUE_OR_END
        elif ch == '"':
            self._out.append('"')
            self._in_string = True
        else:
            self._token.append(ch)
            self._token_len = 1

    def _close(self, ch: str) -> None:
        self._stack.pop()
        self._out.append(ch)
        self._after_value()

    def _after_value(self) -> None:
        if self._stack:
            self._expect = _COMMA_OR_END
        else:
            self.done = self.started = True

    def _end_token(self) -> None:
        token = "".join(self._token)
        self._token.clear()
        if token in _LITERALS:
            self._out.append(token)
        elif _NUMBER.fullmatch(token):
            try:
                self._out.append(json.dumps(json.loads(token)))
            except ValueError:  # an integer past Python's digit limit: json.loads fails too
                self.failed = True
                return
        else:
            self.failed = True
            return
        self._after_value()

    # --- strings

    def _string(self, text: str, i: int) -> int:
        if self._escape is not None or self._high is not None:
            self._escaped(text[i])
            return i + 1
        m = _PLAIN.match(text, i)
        if m:
            self._out.append(m.group())
            return m.end()
        ch = text[i]
        if ch == '"':
            self._out.append('"')
            self._in_string = False
            if self._expect in (_KEY, _KEY_OR_END):
                self._expect = _COLON
            else:
                self._after_value()
        elif ch == "\\":
            self._escape = ""
        else:  # a raw control character: json.loads (strict) refuses it
            self.failed = True
        return i + 1

    def _escaped(self, ch: str) -> None:
        if self._high is not None and self._escape is None:
            # After a high surrogate: a "\u" follows (maybe its low half), or not.
            if not self._high_slash and ch == "\\":
                self._high_slash = True
                return
            if self._high_slash and ch == "u":
                self._high_slash = False
                self._escape = "u"
                return
            # A lone high surrogate: json.loads keeps it, but no UTF-8 answer can hold it,
            # so the call is not JSON colibri returns (tool_format_base._json agrees).
            self.failed = True
            return
        assert self._escape is not None
        if self._escape == "":
            if ch in _SIMPLE_ESCAPES:
                self._out.append(_SIMPLE_ESCAPES[ch])
                self._escape = None
            elif ch == "u":
                self._escape = "u"
            else:
                self.failed = True
            return
        if ch not in _HEX:
            self.failed = True
            return
        self._escape += ch
        if len(self._escape) < 5:
            return
        code = int(self._escape[1:], 16)
        self._escape = None
        if self._high is not None:  # the second escape after a high surrogate
            high, self._high = self._high, None
            if 0xDC00 <= code <= 0xDFFF:
                self._out.append(chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00)))
                return
            self.failed = True  # a lone high surrogate (see above)
            return
        if 0xD800 <= code <= 0xDBFF:
            self._high = code
        elif 0xDC00 <= code <= 0xDFFF:
            self.failed = True  # a lone low surrogate
        else:
            self._out.append(_dumped(chr(code)))
