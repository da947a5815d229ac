"""Forced tool calls (``tool_choice="required"`` or a named function): a Lark grammar
(llguidance's, with ``%json`` for JSON schemas) per tool-call format that admits exactly
one call, in the format the template asks for, to one of the allowed functions, its
arguments matching the function's parameters schema. The parser of the same format
(colibri.server.tool_formats) reads it back.

The schema is followed as llama.cpp's JSON-schema grammars follow it, which is stricter
than a JSON Schema validator on one point: an object that lists ``properties`` and says
nothing of ``additionalProperties`` gets no other keys (the model cannot add junk
arguments); ``additionalProperties: true`` or a schema allows them. The rest is JSON Schema
as llguidance implements it (required keys, types, ``enum``/``const``, string
``minLength``/``maxLength``/``pattern``, number bounds, array sizes, ``anyOf``, ``$ref``).
The JSON is compact (``{"a": 1, "b": [2, 3]}``): no token goes to whitespace.

The markers are spelled as text: a model whose vocabulary has them as single tokens may
still write them that way, or in pieces; the decoded text, and so the parse, is the same.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import InvalidRequestError
from .tool_formats import deepseek_marker
from .tool_formats_xml import DSML

Funcs = Sequence[dict[str, Any]]  # the OpenAI "function" objects allowed


def _lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


# llguidance's options for a %json schema: compact JSON, as the templates' tojson writes it.
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Keywords beside "properties" that may admit keys the properties do not list: such an
# object is left as its schema says.
_OPEN_KEYS = ("additionalProperties", "patternProperties", "unevaluatedProperties", "allOf",
              "anyOf", "oneOf", "$ref", "if", "dependentSchemas")


def closed(schema: Any) -> Any:
    """A copy of `schema` in which every object that lists ``properties`` (all its
    ``required`` keys among them) and nothing that could admit other keys
    (:data:`_OPEN_KEYS`) gets ``additionalProperties: false``. Only subschemas whose
    values must match them are visited: not the branches of ``allOf`` (closing them
    would make their intersection empty), nor ``not``, ``if`` and ``dependentSchemas``."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "$defs",
                   "definitions") and isinstance(value, dict):
            out[key] = {k: closed(v) for k, v in value.items()}
        elif key in ("items", "prefixItems", "anyOf", "oneOf", "additionalProperties",
                     "contains"):
            out[key] = closed(value)
        else:
            out[key] = value
    props = schema.get("properties")
    if (isinstance(props, dict) and not any(k in schema for k in _OPEN_KEYS)
            and all(k in props for k in schema.get("required") or ())):
        out["additionalProperties"] = False
    return out


def _json(schema: dict[str, Any]) -> str:
    """llguidance's ``%json`` of `schema` (:func:`closed`, compact)."""
    options = {**_COMPACT, **(schema.get("x-guidance") or {})}
    body = {**closed(schema), "x-guidance": options}
    return "%json " + json.dumps(body, separators=(",", ":"), ensure_ascii=False)


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
    def around(middle: str, before: str, after: str) -> str:  # (no empty literals)
        return " ".join(p for p in (before and _lit(before), middle, after and _lit(after)) if p)

    def build(funcs: Funcs) -> str:
        return (f"start: {around('call', opening, closing)}\n"
                + _alternatives(funcs, lambda i, f: [
                    f"f{i}: {around(_json(_params(f)), head(f), tail)}"]))
    return build


_MAX_BARE_LENGTH = 100_000  # as GrammarLimits.max_regex_size


def is_bare(schema: dict[str, Any]) -> bool:
    """Whether :func:`_bare_value` writes the value bare (a string) rather than as JSON."""
    kind = schema.get("type")
    strings = "enum" in schema and all(isinstance(e, str) for e in schema["enum"])
    return (kind == "string" and ("enum" not in schema or strings)) or (
        kind is None and strings)


def _bare_value(schema: dict[str, Any], close: str = "") -> str:
    """A parameter's value in a format that writes strings bare (GLM's, Qwen3-Coder's,
    MiniMax-M2's): bare text for a string (its enum, or between its minLength and
    maxLength, without ``<``: the closing tag's first character), JSON otherwise. A
    `close` that begins with a newline (Qwen3-Coder's) is taken into the text's regex,
    the text not ending in a newline and that newline optional: llguidance's lexer takes
    the longest match, so a separate close would have its newline eaten by the text,
    and the parser drops one newline there (a text ending in one would come back short
    of it)."""
    if is_bare(schema):
        if "enum" in schema:
            alternatives = " | ".join(_lit(e) for e in schema["enum"])
            return f"({alternatives}) {_lit(close)}" if close else alternatives
        least, most = int(schema.get("minLength") or 0), schema.get("maxLength")
        if max(least, most or 0) > _MAX_BARE_LENGTH:  # a counted regex: its states grow
            raise InvalidRequestError(f"a string parameter's minLength/maxLength over "
                                      f"{_MAX_BARE_LENGTH:,} cannot be forced in a format "
                                      "that writes strings bare (GLM, Qwen3-Coder, MiniMax)")
        upto = "" if most is None else int(most)
        if not close:
            return f"/[^<]{{{least},{upto}}}/"
        upto_less = "" if most is None else int(most) - 1
        body = "" if most == 0 else f"[^<]{{{max(least - 1, 0)},{upto_less}}}[^<\\n]"
        if least == 0 and body:
            body = f"(?:{body})?"
        tail = close[1:].replace("\n", "\\n").replace("/", "\\/")
        return f"/{body}\\n?{tail}/"
    return _json(schema) + (f" {_lit(close)}" if close else "")


END_VALUE = "</arg_value>\n"


def _tagged_calls(opening: str, closing: str, head: Callable[[dict[str, Any]], str],
                  key_open: Callable[[str, dict[str, Any]], str], value_close: str,
                  tail: str = "") -> Callable[[Funcs], str]:
    """A format whose call is ``head(function)``, then each parameter (the schema's
    order; the required ones always) as ``key_open(key, its schema) VALUE value_close``
    (:func:`_bare_value`), then `tail`, inside opening/closing."""
    merged = not value_close.startswith("<")  # see _bare_value
    def build(funcs: Funcs) -> str:
        def one(i: int, f: dict[str, Any]) -> list[str]:
            params = _params(f)
            props: dict[str, Any] = params.get("properties") or {}
            required = set(params.get("required") or ())
            parts, rules = [], []
            for j, (key, schema) in enumerate(props.items()):
                if merged:
                    rules.append(f"a{i}_{j}: {_lit(key_open(key, schema or {}))} v{i}_{j}")
                    rules.append(f"v{i}_{j}: {_bare_value(schema or {}, value_close)}")
                else:
                    rules.append(f"a{i}_{j}: {_lit(key_open(key, schema or {}))} v{i}_{j} "
                                 f"{_lit(value_close)}")
                    rules.append(f"v{i}_{j}: {_bare_value(schema or {})}")
                parts.append(f"a{i}_{j}" + ("" if key in required else "?"))
            end = f" {_lit(tail)}" if tail else ""
            return [f"f{i}: {_lit(head(f))} {' '.join(parts)}".rstrip() + end, *rules]
        return f"start: {_lit(opening)} call {_lit(closing)}\n" + _alternatives(funcs, one)
    return build


_glm = _tagged_calls("<tool_call>", "</tool_call>", lambda f: f["name"] + "\n",
                     lambda k, _: "<arg_key>" + k + "</arg_key>\n<arg_value>", END_VALUE)
# Qwen3-Coder's template writes each value between newlines (the parser drops them).
_qwen3_coder = _tagged_calls("<tool_call>\n", "</tool_call>",
                             lambda f: f"<function={f['name']}>\n",
                             lambda k, _: f"<parameter={k}>\n", "\n</parameter>\n",
                             "</function>\n")
_minimax_m2 = _tagged_calls("<minimax:tool_call>\n", "</minimax:tool_call>",
                            lambda f: f'<invoke name="{f["name"]}">\n',
                            lambda k, _: f'<parameter name="{k}">', "</parameter>\n",
                            "</invoke>\n")



def _dsml(wrapper: str) -> Callable[[Funcs], str]:
    """DeepSeek-V3.2's and V4's DSML: a string bare (``string="true"``), else JSON."""
    return _tagged_calls(f"<{DSML}{wrapper}>\n", f"</{DSML}{wrapper}>",
                         lambda f: f'<{DSML}invoke name="{f["name"]}">\n',
                         lambda k, schema: f'<{DSML}parameter name="{k}" string="'
                                           f'{"true" if is_bare(schema) else "false"}">',
                         f"</{DSML}parameter>\n", f"</{DSML}invoke>\n")



def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;")  # Kimi-K3's escape_attr


_K3_TYPES = {"integer": "number", "number": "number", "boolean": "boolean", "null": "null",
             "array": "array", "object": "object"}
# Kimi-K3: a string bare (type="string"), else JSON (its type, as its template names it).
_kimi_k3 = _tagged_calls("<|open|>tools<|sep|>", "<|close|>tools<|sep|>",
                         lambda f: f'<|open|>call tool="{_attr(f["name"])}" index="1"<|sep|>',
                         lambda k, schema: f'<|open|>argument key="{_attr(k)}" type="'
                         + ("string" if is_bare(schema) else
                            _K3_TYPES.get(str(schema.get("type")), "object")) + '"<|sep|>',
                         "<|close|>argument<|sep|>", "<|close|>call<|sep|>")


_DS_OPEN = deepseek_marker("tool calls begin") + deepseek_marker("tool call begin")
_DS_CLOSE = deepseek_marker("tool call end") + deepseek_marker("tool calls end")
_DS_SEP = deepseek_marker("tool sep")

def _harmony(funcs: Funcs) -> str:
    """gpt-oss: the generation prompt ends in ``<|start|>assistant``; the call goes to the
    commentary channel. ``<|call|>`` is one of its end-of-generation tokens: the grammar
    may end before it (the model's end token, whichever, then stops it) or write it."""
    return ('start: "<|channel|>commentary to=functions." call "<|call|>"?\n'
            + _alternatives(funcs, lambda i, f: [
                f"f{i}: {_lit(f['name'] + ' <|constrain|>json<|message|>')} "
                f"{_json(_params(f))}"]))


BUILDERS: dict[str, Callable[[Funcs], str]] = {
    "hermes": _hermes,
    "glm": _glm,
    "qwen3_coder": _qwen3_coder,
    "minimax_m2": _minimax_m2,
    "deepseek_v32": _dsml("function_calls"),
    "deepseek_v4": _dsml("tool_calls"),
    "kimi_k3": _kimi_k3,
    "kimi_k2": _json_calls("<|tool_calls_section_begin|><|tool_call_begin|>",
                           "<|tool_calls_section_end|>",
                           lambda f: f"functions.{f['name']}:0<|tool_call_argument_begin|>",
                           "<|tool_call_end|>"),
    "deepseek_v3": _json_calls(_DS_OPEN, _DS_CLOSE,
                               lambda f: f"function{_DS_SEP}{f['name']}\n```json\n", "\n```"),
    "deepseek_v31": _json_calls(_DS_OPEN, _DS_CLOSE, lambda f: f"{f['name']}{_DS_SEP}", ""),
    # Llama 3.x: the call is the whole answer, as its template writes it.
    "llama3_json": _json_calls("", "", lambda f: f'{{"name": {_lit(f["name"])}, '
                                                 '"parameters": ', "}"),
    "mistral": _json_calls("[TOOL_CALLS]", "", lambda f: f"{f['name']}[ARGS]", ""),
    "mistral_json": _json_calls("[TOOL_CALLS][", "]", lambda f: f'{{"name": {_lit(f["name"])}, '
                                                              '"arguments": ', "}"),
    "harmony": _harmony,
}


def forced_grammar_text(fmt: str, funcs: Funcs) -> str:
    """The Lark text admitting one call in format `fmt` to one of `funcs`."""
    return BUILDERS[fmt](funcs)
