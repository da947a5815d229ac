"""Forced tool calls (``tool_choice="required"`` or a named function): a Lark grammar
(llguidance's, with ``%json`` for JSON schemas) per tool-call format that admits exactly
one call, in the format the template asks for, to one of the allowed functions, its
arguments matching the function's parameters schema. The parser of the same format
(colibri.server.tool_formats) reads it back.

The markers are spelled as text: a model whose vocabulary has them as single tokens may
still write them that way, or in pieces; the decoded text, and so the parse, is the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from .tool_formats import deepseek_marker

Funcs = Sequence[dict[str, Any]]  # the OpenAI "function" objects allowed


def _lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def _params(f: dict[str, Any]) -> dict[str, Any]:
    return f.get("parameters") or {"type": "object"}


def _alternatives(funcs: Funcs, one: Callable[[int, dict[str, Any]], list[str]]) -> str:
    """``call: f0 | f1 ...`` and each function's rules."""
    rules = [f"call: {' | '.join(f'f{i}' for i in range(len(funcs)))}"]
    for i, f in enumerate(funcs):
        rules.extend(one(i, f))
    return "\n".join(rules) + "\n"


def _hermes(funcs: Funcs) -> str:
    schemas = [{"type": "object",
                "properties": {"name": {"const": f["name"]}, "arguments": _params(f)},
                "required": ["name", "arguments"], "additionalProperties": False}
               for f in funcs]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    return f'start: "<tool_call>\\n" call "\\n</tool_call>"\ncall: {_json(schema)}\n'


def _json_calls(opening: str, closing: str, head: Callable[[dict[str, Any]], str],
                tail: str) -> Callable[[Funcs], str]:
    """A format whose call is ``head(function) JSON tail`` inside opening/closing."""
    def build(funcs: Funcs) -> str:
        return (f"start: {_lit(opening)} call {_lit(closing)}\n"
                + _alternatives(funcs, lambda i, f: [
                    f"f{i}: {_lit(head(f))} {_json(_params(f))} {_lit(tail)}"]))
    return build


def _glm_value(schema: dict[str, Any]) -> str:
    """GLM's value of a parameter: bare text for a string (its enum, or up to its
    maxLength), JSON otherwise."""
    kind = schema.get("type")
    if kind == "string" or (kind is None and "enum" in schema
                            and all(isinstance(e, str) for e in schema["enum"])):
        if "enum" in schema:
            return " | ".join(_lit(e) for e in schema["enum"])
        most = schema.get("maxLength")
        return f"/[^<]{{0,{int(most)}}}/" if most is not None else "/[^<]*/"
    return _json(schema)


END_VALUE = "</arg_value>\n"


def _glm(funcs: Funcs) -> str:
    def one(i: int, f: dict[str, Any]) -> list[str]:
        params = _params(f)
        props: dict[str, Any] = params.get("properties") or {}
        required = set(params.get("required") or ())
        parts, rules = [], []
        for j, (key, schema) in enumerate(props.items()):
            opening = _lit("<arg_key>" + key + "</arg_key>\n<arg_value>")
            rules.append(f"a{i}_{j}: {opening} v{i}_{j} {_lit(END_VALUE)}")
            rules.append(f"v{i}_{j}: {_glm_value(schema or {})}")
            parts.append(f"a{i}_{j}" + ("" if key in required else "?"))
        return [f"f{i}: {_lit(f['name'] + chr(10))} {' '.join(parts)}".rstrip(), *rules]
    return 'start: "<tool_call>" call "</tool_call>"\n' + _alternatives(funcs, one)


_DS_OPEN = deepseek_marker("tool calls begin") + deepseek_marker("tool call begin")
_DS_CLOSE = deepseek_marker("tool call end") + deepseek_marker("tool calls end")
_DS_SEP = deepseek_marker("tool sep")

BUILDERS: dict[str, Callable[[Funcs], str]] = {
    "hermes": _hermes,
    "glm": _glm,
    "kimi_k2": _json_calls("<|tool_calls_section_begin|><|tool_call_begin|>",
                           "<|tool_calls_section_end|>",
                           lambda f: f"functions.{f['name']}:0<|tool_call_argument_begin|>",
                           "<|tool_call_end|>"),
    "deepseek_v3": _json_calls(_DS_OPEN, _DS_CLOSE,
                               lambda f: f"function{_DS_SEP}{f['name']}\n```json\n", "\n```"),
    "deepseek_v31": _json_calls(_DS_OPEN, _DS_CLOSE, lambda f: f"{f['name']}{_DS_SEP}", ""),
}


def forced_grammar_text(fmt: str, funcs: Funcs) -> str:
    """The Lark text admitting one call in format `fmt` to one of `funcs`."""
    return BUILDERS[fmt](funcs)
