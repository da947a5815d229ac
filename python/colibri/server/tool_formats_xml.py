"""The XML-like tool-call formats, whose arguments are written one parameter at a time as
raw text (colibri.server.tool_formats lists them in its table):

- ``qwen3_coder`` (Qwen3-Coder, Qwen3.5): ``<tool_call>\\n<function=NAME>\\n<parameter=K>
  \\nV\\n</parameter>\\n...</function>\\n</tool_call>``;
- ``minimax_m2`` (MiniMax-M2): ``<minimax:tool_call>\\n<invoke name="NAME"><parameter
  name="K">V</parameter>...</invoke>\\n...</minimax:tool_call>``;
- ``deepseek_v32`` (DeepSeek-V3.2) and ``deepseek_v4`` (DeepSeek-V4, V4-Flash), DeepSeek's
  DSML: ``<|DSML|function_calls>`` (V4: ``<|DSML|tool_calls>``) around ``<|DSML|invoke
  name="NAME"><|DSML|parameter name="K" string="true">V</|DSML|parameter>...
  </|DSML|invoke>`` (the bars U+FF5C, :data:`DSML`);
- ``kimi_k3`` (Kimi-K3): ``<|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
  <|open|>argument key="K" type="string"<|sep|>V<|close|>argument<|sep|>...<|close|>call
  <|sep|>...<|close|>tools<|sep|>`` (its template's JSON-block form, written for
  arguments given as a string, is not read: it stays text).

DSML says how to read a value: ``string="true"``, as it is; ``string="false"``, as JSON
(the template's ``tojson``; text that is not JSON is typed by the schema, as is a value
without the attribute); Kimi-K3 the same with ``type="string"`` or another type. Qwen's
and MiniMax's templates write a string value as it is and any other value as text:
Qwen's with jinja's ``string`` filter for numbers and booleans (``3``, ``True``) and JSON
for objects and arrays, MiniMax's as JSON. So a value's type comes from the tool's JSON
schema (:func:`typed_value`): a parameter declared a string keeps its text, a number,
boolean, object or array is read as one when the text is one, and anything else stays
text.

A value ends at the first closing tag followed (after whitespace) by the next parameter,
the call's end or the end of the text, so a value may itself hold the closing tag (code
that writes XML), but not the start of another call (an unclosed value does not swallow
the next call). Scanning is linear in the text: where a parameter starts decides all
that follows it, so each is read once and remembered (as the GLM scanner does).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .tool_format_base import (
    _UNREAD,
    Found,
    Reader,
    Scanner,
    Tools,
    _Good,
    _json,
    _param_types,
    _scan_starts,
    _skip_ws,
)

__all__ = ["DEEPSEEK_V4", "DEEPSEEK_V32", "DSML", "KIMI_K3", "MINIMAX_M2", "QWEN3_CODER",
           "XmlShape", "call_name", "label_pattern", "typed_value", "xml_reader", "xml_scanner"]


@dataclass(frozen=True)
class XmlShape:
    """How one family spells a call: ``call`` NAME ``call_end`` then pairs ``key`` K
    ``key_end`` V ``value_end``, then ``end`` (or the end of the text); ``wrapper``, when
    it comes just before the call (whitespace apart), and ``trailer``, just after its end,
    belong to the call too. ``stop`` also ends the pairs (a wrapper's closing tag where
    the model left out ``end``). ``newlines``: the template puts a newline on each side of
    a value (dropped when reading). ``string_attr``: ``key_end`` is the key's closing
    quote, and the value begins with the rest of the tag (DSML's ``string`` attribute,
    which says how to read the value). ``name_attrs`` / ``key_attrs`` (Kimi-K3): the
    label between ``call`` and ``call_end`` (``key`` and ``key_end``) holds the rest of
    the tag's attributes, quotes included; these read the name (the key and its
    ``type``) out of it."""

    call: str
    call_end: str
    key: str
    key_end: str
    value_end: str
    end: str
    wrapper: str = ""
    trailer: str = ""
    stop: str = ""
    newlines: bool = False
    string_attr: bool = False  # the value begins with ` string="true|false">` (DSML)
    name_attrs: re.Pattern[str] | None = None
    key_attrs: re.Pattern[str] | None = None


QWEN3_CODER = XmlShape(call="<function=", call_end=">", key="<parameter=", key_end=">",
                       value_end="</parameter>", end="</function>", wrapper="<tool_call>",
                       trailer="</tool_call>", stop="</tool_call>", newlines=True)
MINIMAX_M2 = XmlShape(call='<invoke name="', call_end='">', key='<parameter name="',
                      key_end='">', value_end="</parameter>", end="</invoke>",
                      stop="</minimax:tool_call>")

DSML = "\uff5cDSML\uff5c"  # DeepSeek's tag prefix: "|DSML|" with full-width bars


def _dsml(wrapper: str) -> XmlShape:
    return XmlShape(call=f'<{DSML}invoke name="', call_end='">', key=f'<{DSML}parameter name="',
                    key_end='"', value_end=f"</{DSML}parameter>", end=f"</{DSML}invoke>",
                    stop=f"</{DSML}{wrapper}>", string_attr=True)


DEEPSEEK_V32, DEEPSEEK_V4 = _dsml("function_calls"), _dsml("tool_calls")
# The rest of a DSML parameter's tag: its string attribute (optional), then ">".
_STRING_ATTR = re.compile(r'[ \t]*(?:string="(true|false)"[ \t]*)?>')

# Kimi-K3's XTML: <|open|>TAG ATTR="V"...<|sep|> ... <|close|>TAG<|sep|>, its attribute
# values escaped (& and " as &amp; and &quot;), its values raw, typed by a type attribute.
KIMI_K3 = XmlShape(call='<|open|>call tool="', call_end="<|sep|>",
                   key='<|open|>argument key="', key_end="<|sep|>",
                   value_end="<|close|>argument<|sep|>", end="<|close|>call<|sep|>",
                   stop="<|close|>tools<|sep|>",
                   name_attrs=re.compile(r'([^"]*)"(?:[ \t]+index="\d*")?[ \t]*'),
                   key_attrs=re.compile(r'([^"]*)"(?:[ \t]+type="(\w*)")?[ \t]*'))

# A function's or parameter's name: no tag characters, quotes or line breaks (so a run
# never reaches into the next tag: each is read once); with the tag's other attributes
# (Kimi-K3), quotes allowed.
_LABEL = re.compile(r'[^<>"\n]*')
_ATTRS_LABEL = re.compile(r"[^<>\n]*")


def label_pattern(shape: XmlShape) -> re.Pattern[str]:
    return _LABEL if shape.name_attrs is None else _ATTRS_LABEL


def _unescape(text: str) -> str:
    return text.replace("&quot;", '"').replace("&amp;", "&")


def call_name(shape: XmlShape, label: str) -> str | None:
    """The function's name a call's label gives (stripped), or None: not a call."""
    if shape.name_attrs is not None:
        m = shape.name_attrs.fullmatch(label)
        label = "" if m is None else _unescape(m.group(1)).strip()
    return label or None


def xml_scanner(shape: XmlShape) -> Scanner:
    ends = tuple(t for t in (shape.end, shape.stop) if t)

    def scan(text: str) -> Iterator[Found]:
        value_ends = _Good(text, shape.value_end, (shape.key, *ends), or_end=True)
        calls = _Good(text, shape.call, ("",), or_end=True)  # every call's start
        pairs: dict[int, tuple[str, str, int] | None] = {}  # start -> (key, value, next)
        call_ends: dict[int, int] = {}  # a pair's start -> where its call ends, -1: none

        def label(p: int, close: str) -> tuple[str, int] | None:
            m = label_pattern(shape).match(text, p)
            if m is None or not text.startswith(close, m.end()):
                return None
            return m.group().strip(), m.end() + len(close)

        def pair(p: int) -> tuple[str, str, int] | None:
            if p not in pairs:
                pairs[p] = None
                got = label(p + len(shape.key), shape.key_end)
                if got is not None:
                    key, vs = got
                    ve = value_ends.first(vs)
                    if ve >= 0 and not -1 < calls.first(vs) < ve:  # never spans a call
                        pairs[p] = key, text[vs:ve], _skip_ws(text, ve + len(shape.value_end))
            return pairs[p]

        def end_at(q: int) -> int:
            """Where a call ends whose pairs are done at `q`, or -1."""
            if text.startswith(shape.end, q):
                end = q + len(shape.end)
                if shape.trailer:
                    after = _skip_ws(text, end)
                    if text.startswith(shape.trailer, after):
                        end = after + len(shape.trailer)
                return end
            if shape.stop and text.startswith(shape.stop, q):
                return q + len(shape.stop)
            return len(text) if q == len(text) else -1

        def call_end(q: int) -> int:
            chain: list[int] = []
            while text.startswith(shape.key, q) and q not in call_ends:
                chain.append(q)
                got = pair(q)
                if got is None:
                    q = -1
                    break
                q = got[2]
            end = -1 if q < 0 else call_ends[q] if q in call_ends else end_at(q)
            for p in chain:
                call_ends[p] = end
            return end

        def at(i: int) -> Found | None:
            named = label(i + len(shape.call), shape.call_end)
            name = None if named is None else call_name(shape, named[0])
            if named is None or name is None:
                return None
            q = _skip_ws(text, named[1])
            end = call_end(q)
            if end < 0:
                return None
            args: list[tuple[str, str]] = []
            while text.startswith(shape.key, q) and (got := pair(q)) is not None:
                args.append((got[0], got[1]))
                q = got[2]
            start = i  # the wrapper before the call (each whitespace run is walked once)
            while start > 0 and text[start - 1].isspace():
                start -= 1
            wrapped = shape.wrapper and text.endswith(shape.wrapper, 0, start)
            return (start - len(shape.wrapper) if wrapped else i), end, (name, args)

        return _scan_starts(text, shape.call, at)
    return scan


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string",
               list: "array", dict: "object", type(None): "null"}
# How Python (and so a jinja ``string`` filter) spells these.
_PYTHON_WORDS: dict[str, Any] = {"True": True, "False": False, "None": None}


def typed_value(value: str, kind: Any) -> Any:
    """`value` (a parameter's raw text) read as the schema's ``type`` `kind` asks: text
    for a string, the JSON (or Python-spelled boolean/null) value when its type is one
    `kind` allows; with no type known, JSON when it parses. Otherwise the text."""
    kinds = {kind} if isinstance(kind, str) else set(kind) if isinstance(kind, list) else set()
    if kinds == {"string"}:
        return value
    got = _json(value)
    if got is _UNREAD and kinds & {"boolean", "null"} and value.strip() in _PYTHON_WORDS:
        got = _PYTHON_WORDS[value.strip()]
    if got is _UNREAD:
        return value
    have = _JSON_TYPES.get(type(got))
    if not kinds or have in kinds or (have == "integer" and "number" in kinds):
        return got
    return value


def xml_reader(shape: XmlShape) -> Reader:
    def read(f: tuple[Any, ...], tools: Tools) -> tuple[str, dict[str, Any], None] | None:
        name, pairs = f
        types = _param_types(tools, name)
        args: dict[str, Any] = {}
        for key, value in pairs:
            as_text = None  # True: text; False: JSON when it is; None: as the schema says
            if shape.string_attr:
                attr = _STRING_ATTR.match(value)
                if attr is None:
                    return None
                value = value[attr.end():]
                as_text = None if attr.group(1) is None else attr.group(1) == "true"
            if shape.key_attrs is not None:
                m = shape.key_attrs.fullmatch(key)
                if m is None:
                    return None
                key = _unescape(m.group(1))
                as_text = None if m.group(2) is None else m.group(2) == "string"
            kind = "string" if as_text else types.get(key)
            if as_text is False and (got := _json(value)) is not _UNREAD:
                args[key] = got
                continue
            if shape.newlines:
                value = value.removeprefix("\n").removesuffix("\n")
            args[key] = typed_value(value, kind)
        return name, args, None
    return read
