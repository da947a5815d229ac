"""gpt-oss's tool calls (OpenAI's harmony format; colibri.server.tool_formats lists it in its
table as ``harmony``): a message to a function on the commentary channel,

``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{JSON}<|call|>``

as gpt-oss's template writes one back, or with the recipient after the channel, as the
model writes it: ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
{JSON}<|call|>``. ``<|call|>`` is one of gpt-oss's end-of-generation tokens, so the last
call may end with the text instead.

Only the calls are read: the reasoning splitter (colibri.sampling.harmony) has taken the
``analysis`` channel out and passed call messages to the answer verbatim; what is not a
call (the ``final`` text, or any other channel left in) stays in the text. A call spans
from its ``<|start|>assistant`` (either order; the generation prompt ends with it, so the
output's first call starts at its ``<|channel|>``) to its ``<|call|>``. Each call is read
only up to the next ``to=functions.``, so the scan is linear in the text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .tool_format_base import Found, Tools, _name_at, _object, _skip_ws, json_end

__all__ = ["CALL", "RECIPIENT", "read_harmony", "scan_harmony"]

START, CHANNEL, MESSAGE, CALL = "<|start|>assistant", "<|channel|>", "<|message|>", "<|call|>"
RECIPIENT = "to=functions."
# After the function's name: the channel (template order), then the content type.
_HEADER_REST = re.compile(r"(?:<\|channel\|>commentary)?[ \t]*(?:<\|constrain\|>)?[ \t]*"
                          r"(?:json)?[ \t]*<\|message\|>")
# What may precede the recipient (the longest first).
_BEFORE = (START + CHANNEL + "commentary ", START + " ", CHANNEL + "commentary ")


def scan_harmony(text: str) -> Iterator[Found]:
    """Each call: its recipient, the rest of its header, a JSON object, then ``<|call|>``
    or the end of the text. The JSON's end is found by its brackets (a ``<|call|>``
    inside a string is text), and never past the next recipient: an unclosed call does
    not swallow the next one, and each stretch of text is read for one call."""
    i = text.find(RECIPIENT)
    while i >= 0:
        nxt = text.find(RECIPIENT, i + len(RECIPIENT))  # each found once: read on
        limit = len(text) if nxt < 0 else nxt
        found = _call_at(text, i, limit)
        if found is not None:
            yield found
        i = nxt


def _call_at(text: str, i: int, limit: int) -> Found | None:
    named = _name_at(text, i + len(RECIPIENT))
    header = None if named is None else _HEADER_REST.match(text, named[1], limit)
    if named is None or header is None:
        return None
    a = _skip_ws(text, header.end())
    close = json_end(text, a, limit) if text.startswith("{", a) else -1
    if close < 0:
        return None
    end = _skip_ws(text, close)
    if text.startswith(CALL, end):
        end += len(CALL)
    elif end < limit:  # something else after the JSON: not a call
        return None
    start = i
    for before in _BEFORE:
        if text.endswith(before, 0, i):
            start = i - len(before)
            break
    return start, end, (named[0], text[a:close])


def read_harmony(f: tuple[Any, ...], tools: Tools) -> tuple[str, dict[str, Any], None] | None:
    args = _object(f[1].strip())
    return None if args is None else (f[0], args, None)
