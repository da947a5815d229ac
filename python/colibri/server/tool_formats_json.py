"""The tool-call formats whose calls are bare JSON with no closing tag of their own (the
JSON's last bracket ends the call); colibri.server.tool_formats lists them in its table:

- ``llama3_json`` (Llama 3.1, 3.2, 3.3): ``{"name": NAME, "parameters": {JSON}}``, the
  whole answer (``"arguments"`` for ``"parameters"`` and a leading ``"type": "function"``
  are read too); with ``<|python_tag|>`` before it, or Llama 3.1's built-in tool form
  ``<|python_tag|>NAME.call(K="V", ...)``;
- ``mistral`` (Mistral Small 3.2, Ministral 3, Devstral): ``[TOOL_CALLS]NAME[ARGS]{JSON}``
  per call (Small 3.2's template puts ``[CALL_ID]ID`` before ``[ARGS]``);
- ``mistral_json`` (Mistral Nemo): ``[TOOL_CALLS][{"name": NAME, "arguments": {JSON},
  "id": ID}, ...]``.

Both Mistral entries read both spellings; they differ in the forced-call grammar. A
Mistral call keeps the id the model wrote, else gets 9 letters and digits: the Mistral
templates refuse any other id when the conversation comes back.

Where a JSON value ends is found by counting brackets outside strings (one pass, bounded
by MAX_JSON_DEPTH); a value that does not close, nests too deep or does not parse is text,
and scanning goes on after it, so every character is read a bounded number of times.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

from .tool_format_base import (
    _UNREAD,
    Found,
    Tools,
    _json,
    _name_at,
    _skip_ws,
    json_end,
)

__all__ = ["PYTHON_TAG", "TOOL_CALLS", "read_llama3", "read_mistral", "scan_llama3",
           "scan_mistral"]

PYTHON_TAG, TOOL_CALLS, ARGS, CALL_ID = "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def _value_at(text: str, start: int) -> tuple[Any, int]:
    """(the JSON value whose bracket opens at `start`, or _UNREAD; where reading ended)."""
    end = json_end(text, start)
    return (_UNREAD, -end) if end < 0 else (_json(text[start:end]), end)


def _arguments(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):  # some models write the arguments as a JSON string
        value = _json(value)
    return value if isinstance(value, dict) else None


# --- Llama 3.x -------------------------------------------------------------------------

# What a call's JSON begins with: {"name": " (after an optional "type": "function").
# Each whitespace run follows one fixed token of one candidate: read once.
_LLAMA_HEAD = re.compile(r'\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:\s*"')
_LLAMA_KEYS = {"type", "name", "parameters", "arguments"}
# Llama 3.1's built-in tools: NAME.call(K="V", ...) (strings, as its template writes them).
_BUILTIN = re.compile(r"\s*([A-Za-z_]\w*)\.call\(")
_BUILTIN_ARG = re.compile(r'\s*([A-Za-z_]\w*)\s*=\s*"([^"]*)"\s*([,)])')


def _llama_call(value: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    if not value.keys() <= _LLAMA_KEYS or value.get("type", "function") != "function":
        return None
    args = _arguments(value.get("parameters", value.get("arguments", {})))
    return None if args is None else (value["name"], args)


def _builtin_call(text: str, i: int) -> Found | None:
    m = _BUILTIN.match(text, i)
    if m is None:
        return None
    args: dict[str, Any] = {}
    j = m.end()
    if text.startswith(")", _skip_ws(text, j)):
        return i, _skip_ws(text, j) + 1, (m.group(1), args)
    while (a := _BUILTIN_ARG.match(text, j)) is not None:
        args[a.group(1)] = a.group(2)
        j = a.end()
        if a.group(3) == ")":
            return i, j, (m.group(1), args)
    return None


def scan_llama3(text: str) -> Iterator[Found]:
    """Each ``{"name": ...`` whose JSON is a call (a ``<|python_tag|>`` just before it is
    part of it), and each ``<|python_tag|>NAME.call(...)``."""
    pos, tag = 0, text.find(PYTHON_TAG)
    while True:
        if 0 <= tag < pos:  # (found again only once passed: each find reads on)
            tag = text.find(PYTHON_TAG, pos)
        i = text.find("{", pos)
        if tag >= 0 and (i < 0 or tag < i):
            after = tag + len(PYTHON_TAG)
            found = _builtin_call(text, after)
            if found is not None:
                yield tag, found[1], found[2]
                pos = found[1]
                continue
            j = _skip_ws(text, after)
            if text.startswith("{", j) and _LLAMA_HEAD.match(text, j):
                value, end = _value_at(text, j)
                if (call := _llama_call(value)) is not None:
                    yield tag, end, call
                pos = max(end, after)
            else:
                pos = after
            continue
        if i < 0:
            return
        if not _LLAMA_HEAD.match(text, i):
            pos = i + 1
            continue
        value, end = _value_at(text, i)
        if (call := _llama_call(value)) is not None:
            yield i, end, call
        pos = max(end, i + 1)


def read_llama3(f: tuple[Any, ...], tools: Tools) -> tuple[str, dict[str, Any], None]:
    return f[0], f[1], None


# --- Mistral ---------------------------------------------------------------------------

_ID = re.compile(r"[A-Za-z0-9]+")


def _mistral_item(value: Any) -> tuple[str, dict[str, Any], str | None] | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = _arguments(value.get("arguments", value.get("parameters", {})))
    call_id = value.get("id")
    if args is None or not (call_id is None or isinstance(call_id, str)):
        return None
    return value["name"], args, call_id


def scan_mistral(text: str) -> Iterator[Found]:
    """Each ``[TOOL_CALLS]`` followed by NAME ``[CALL_ID]ID``? ``[ARGS]{...}``, or by a
    JSON list of calls (all good, or all text): the first call of a list spans it, the
    others are empty spans at its end."""
    pos = 0
    while (i := text.find(TOOL_CALLS, pos)) >= 0:
        j = _skip_ws(text, i + len(TOOL_CALLS))
        pos = j
        if text.startswith("[", j):  # [TOOL_CALLS][{...}, ...]
            value, end = _value_at(text, j)
            pos = max(end, j)
            items = [_mistral_item(v) for v in value] if isinstance(value, list) else []
            good = [item for item in items if item is not None]
            if good and len(good) == len(items):
                for k, item in enumerate(good):
                    yield (i if k == 0 else end), end, item
            continue
        named = _name_at(text, j)
        if named is None:
            continue
        name, j = named
        call_id = None
        if text.startswith(CALL_ID, j) and (m := _ID.match(text, j + len(CALL_ID))):
            call_id, j = m.group(), m.end()
        if not text.startswith(ARGS, j):
            continue
        j = _skip_ws(text, j + len(ARGS))
        if not text.startswith("{", j):
            continue
        value, end = _value_at(text, j)
        pos = max(end, j)
        if isinstance(value, dict):
            yield i, end, (name, value, call_id)


def read_mistral(f: tuple[Any, ...], tools: Tools) -> tuple[str, dict[str, Any], str]:
    name, args, call_id = f
    return name, args, call_id or uuid.uuid4().hex[:9]
