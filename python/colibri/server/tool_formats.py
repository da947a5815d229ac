"""The tool-call formats colibri parses, one entry of :data:`FORMATS` per model family, and
which one a chat template asks for (:func:`template_format`: the first entry whose markers
all appear in the template's source).

- ``glm`` (GLM-4.5, GLM-4.6): ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V
  </arg_value>...</tool_call>``, V as text for a string parameter, else JSON;
- ``kimi_k2`` (Kimi-K2): ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:I
  <|tool_call_argument_begin|>{JSON}<|tool_call_end|>...<|tool_calls_section_end|>``;
- ``deepseek_v3`` (DeepSeek-V3, R1 and its distills): ``<|tool calls begin|><|tool call
  begin|>function<|tool sep|>NAME\\n```json\\n{JSON}\\n```<|tool call end|>...<|tool calls
  end|>``;
- ``deepseek_v31`` (DeepSeek-V3.1): ``<|tool calls begin|><|tool call begin|>NAME<|tool
  sep|>{JSON}<|tool call end|>...<|tool calls end|>``;
- ``hermes`` (Qwen2.5, Qwen3, QwQ, Hermes 2 Pro / 3): ``<tool_call>{"name": NAME,
  "arguments": {JSON}}</tool_call>``.

DeepSeek's markers are written above with ASCII bars and spaces; in its vocabulary (and
the model's text) the bars are U+FF5C (full-width) and the spaces U+2581.

The formats were read off the templates themselves (llama.cpp's copies, build/test-data/
templates: what each renders for an assistant's tool calls) and checked against llama.cpp's
parsers (common/chat*.cpp); tests/server/test_server_tool_formats.py renders calls through each
template and parses them back. A call that does not parse (bad JSON, no name, a missing
closing tag in the middle of the text) stays in the text.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FORMATS", "CallFormat", "ToolCall", "template_format"]


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
# (a call's regex match, the request's tools) -> (name, arguments, the model's call id)
Reader = Callable[[re.Match[str], Tools], tuple[str, dict[str, Any], str | None] | None]


@dataclass(frozen=True)
class CallFormat:
    """How one family writes tool calls: ``markers`` (all in a template's source: that
    template asks for this format), ``opens`` (the texts that begin the calls: a stream
    holds back what follows), ``call`` (one call), ``read`` (its name and arguments),
    ``section`` (the wrapper around all calls, dropped once a call inside parsed)."""

    name: str
    markers: tuple[str, ...]
    opens: tuple[str, ...]
    call: re.Pattern[str]
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
        for m in self.call.finditer(text):
            got = self.read(m, tools)
            if got is None:
                continue
            name, args, call_id = got
            kept.append(text[pos:m.start()])
            pos = m.end()
            calls.append(ToolCall(name, args, call_id or f"{id_prefix}{uuid.uuid4().hex[:24]}"))
        kept.append(text[pos:])
        rest = "".join(kept)
        if calls:
            for marker in self.section:
                rest = rest.replace(marker, "")
        return rest.strip(), calls


def _object(body: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _read_hermes(m: re.Match[str], tools: Tools) -> tuple[str, dict[str, Any], None] | None:
    obj = _object(m.group(1))
    if obj is None or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args = _object(args)
    if not isinstance(args, dict):
        return None
    return obj["name"], args, None


def _read_json_args(name_group: int, args_group: int) -> Reader:
    def read(m: re.Match[str], tools: Tools) -> tuple[str, dict[str, Any], None] | None:
        args = _object(m.group(args_group))
        return None if args is None else (m.group(name_group), args, None)
    return read


def _read_kimi(m: re.Match[str], tools: Tools) -> tuple[str, dict[str, Any], str] | None:
    args = _object(m.group(3))
    if args is None:
        return None
    name, index = m.group(1), m.group(2) or "0"
    return name, args, f"functions.{name}:{index}"  # the id Kimi's template writes back


def _param_types(tools: Tools, name: str) -> dict[str, Any]:
    for t in tools or ():
        f = t.get("function", t)
        if f.get("name") == name:
            props = (f.get("parameters") or {}).get("properties") or {}
            return {k: (v or {}).get("type") for k, v in props.items()}
    return {}


_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _read_glm(m: re.Match[str], tools: Tools) -> tuple[str, dict[str, Any], None] | None:
    """GLM writes a string value as it is and any other value as JSON (its template:
    ``v | tojson if v is not string else v``): a value is JSON unless the function's
    schema says the parameter is a string, or it does not parse as JSON."""
    name = m.group(1)
    types = _param_types(tools, name)
    args: dict[str, Any] = {}
    for key, value in _GLM_ARG.findall(m.group(2)):
        key = key.strip()
        kind = types.get(key)
        if kind == "string" or (isinstance(kind, list) and kind == ["string"]):
            args[key] = value
            continue
        try:
            args[key] = json.loads(value)
        except ValueError:
            args[key] = value
    return name, args, None


_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"


def deepseek_marker(words: str) -> str:
    """DeepSeek's spelling of a marker: ``deepseek_marker("tool sep")`` is
    ``<`` U+FF5C ``tool`` U+2581 ``sep`` U+FF5C ``>``."""
    return "<\uff5c" + words.replace(" ", "\u2581") + "\uff5c>"


_DS_CALLS, _DS_CALLS_END = deepseek_marker("tool calls begin"), deepseek_marker("tool calls end")
_DS_CALL, _DS_CALL_END = deepseek_marker("tool call begin"), deepseek_marker("tool call end")
_DS_SEP = deepseek_marker("tool sep")
_KIMI_CALLS, _KIMI_CALLS_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
_KIMI_CALL, _KIMI_ARGS, _KIMI_CALL_END = ("<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                                          "<|tool_call_end|>")
_e = re.escape

FORMATS: dict[str, CallFormat] = {f.name: f for f in (
    CallFormat(
        "glm", markers=("<tool_call>", "<arg_key>"), opens=("<tool_call>",),
        call=re.compile(rf"<tool_call>[ \t]*({_NAME})[ \t]*\n?\s*"
                        r"((?:<arg_key>.*?</arg_key>\s*<arg_value>.*?</arg_value>\s*)*)"
                        r"(?:</tool_call>|\Z)", re.DOTALL),
        read=_read_glm),
    CallFormat(
        "kimi_k2", markers=(_KIMI_CALLS, _KIMI_CALL), opens=(_KIMI_CALLS, _KIMI_CALL),
        call=re.compile(rf"{_e(_KIMI_CALL)}\s*(?:functions\.)?({_NAME}?)(?::(\d+))?\s*"
                        rf"{_e(_KIMI_ARGS)}\s*(.*?)\s*(?:{_e(_KIMI_CALL_END)}|\Z)", re.DOTALL),
        read=_read_kimi, section=(_KIMI_CALLS, _KIMI_CALLS_END)),
    CallFormat(
        "deepseek_v3", markers=(_DS_SEP, "```json"), opens=(_DS_CALLS, _DS_CALL),
        call=re.compile(rf"{_e(_DS_CALL)}\s*(?:\w+\s*)?{_e(_DS_SEP)}\s*({_NAME})\s*"
                        rf"```(?:json)?\s*(.*?)\s*```\s*(?:{_e(_DS_CALL_END)}|\Z)", re.DOTALL),
        read=_read_json_args(1, 2), section=(_DS_CALLS, _DS_CALLS_END)),
    CallFormat(
        "deepseek_v31", markers=(_DS_SEP,), opens=(_DS_CALLS, _DS_CALL),
        call=re.compile(rf"{_e(_DS_CALL)}\s*({_NAME})\s*{_e(_DS_SEP)}\s*(.*?)\s*"
                        rf"(?:{_e(_DS_CALL_END)}|\Z)", re.DOTALL),
        read=_read_json_args(1, 2), section=(_DS_CALLS, _DS_CALLS_END)),
    CallFormat(
        "hermes", markers=("<tool_call>",), absent=("<function=",), opens=("<tool_call>",),
        call=re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL),
        read=_read_hermes),
)}


def template_format(source: str) -> str | None:
    """The name of the :data:`FORMATS` entry a chat template's source asks for (the
    first that matches, in the table's order), or None: tools may still be rendered,
    calls are not parsed."""
    return next((f.name for f in FORMATS.values() if f.matches(source)), None)
