"""Tool calls: which format a chat template writes them in, the grammar that forces one
(``tool_choice="required"`` or a named function), and parsing them back out of the text.

One format is parsed: **Hermes / Qwen's** ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` (a JSON object per call, whitespace around it free), which the
templates of Qwen2.5, Qwen3, QwQ and NousResearch's Hermes 2 Pro / Hermes 3 ask the model
for. A template that renders tools in another format (Llama 3.1's bare JSON, Mistral's
``[TOOL_CALLS]``, Qwen3-Coder's XML ``<function=...>``) still gets the tools in its prompt,
but its answers come back as plain text (``content``), never as ``tool_calls``, and
``tool_choice="required"``/named is refused there (docs/serving.md).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..structured import Grammar
from .errors import ApiError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)


def template_format(source: str) -> str | None:
    """"hermes" when the template asks for ``<tool_call>{json}</tool_call>`` calls, else
    None (tools may still be rendered; calls are not parsed)."""
    if OPEN in source and "<function=" not in source:
        return "hermes"
    return None


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


def _call(body: str, id_prefix: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], args, f"{id_prefix}{uuid.uuid4().hex[:24]}")


def parse_calls(text: str, id_prefix: str = "call_") -> tuple[str, list[ToolCall]]:
    """(the text with the parsed calls removed and stripped, the calls). A block that is
    not a JSON object with a ``name`` stays in the text; an unterminated last block (EOS
    or max_tokens before ``</tool_call>``) is parsed if its JSON is complete."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        call = _call(m.group(1), id_prefix)
        if call is None:
            continue
        kept.append(text[pos:m.start()])
        pos = m.end()
        calls.append(call)
    kept.append(text[pos:])
    return "".join(kept).strip(), calls


class CallSplitter:
    """For a stream: :meth:`feed` returns the text that is surely content (everything
    before a ``<tool_call>``, holding back a partial tag); :meth:`finish` parses what was
    held back."""

    def __init__(self) -> None:
        self._held = ""
        self._in_call = False

    def feed(self, text: str) -> str:
        if self._in_call:
            self._held += text
            return ""
        buf = self._held + text
        i = buf.find(OPEN)
        if i >= 0:
            self._in_call = True
            self._held = buf[i:]
            return buf[:i]
        # Hold back the longest suffix that could start the tag.
        keep = next((k for k in range(min(len(OPEN) - 1, len(buf)), 0, -1)
                     if OPEN.startswith(buf[-k:])), 0)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def finish(self, id_prefix: str = "call_") -> tuple[str, list[ToolCall]]:
        held, self._held = self._held, ""
        if not self._in_call:
            return held, []
        return parse_calls(held, id_prefix)


def _function_schema(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    return {"type": "object",
            "properties": {"name": {"const": name},
                           "arguments": parameters or {"type": "object"}},
            "required": ["name", "arguments"], "additionalProperties": False}


def forced_call_grammar(tools: Sequence[dict[str, Any]], only: str | None) -> Grammar:
    """A Lark grammar (llguidance's ``%json``) that admits exactly one Hermes-style call
    to `only` (a named tool_choice) or to any of `tools` ("required"), its arguments
    matching the function's JSON schema."""
    funcs = [t["function"] for t in tools]
    if only is not None:
        funcs = [f for f in funcs if f["name"] == only]
        if not funcs:
            raise ApiError(400, f"tool_choice names the function {only!r}, which is not in "
                                "tools", param="tool_choice")
    schemas = [_function_schema(f["name"], f.get("parameters")) for f in funcs]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    text = (f'start: "{OPEN}\\n" call "\\n{CLOSE}"\n'
            f"call: %json {json.dumps(schema, separators=(',', ':'))}\n")
    return Grammar(text)
