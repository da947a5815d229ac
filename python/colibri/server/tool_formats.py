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
  "arguments": {JSON}}</tool_call>``;
- ``llama3_json`` (Llama 3.1-3.3), ``mistral`` and ``mistral_json`` (Mistral's
  ``[TOOL_CALLS]``): bare JSON calls (colibri.server.tool_formats_json);
- ``harmony`` (gpt-oss): ``<|channel|>commentary to=functions.NAME <|constrain|>json
  <|message|>{JSON}<|call|>`` (colibri.server.tool_formats_harmony);
- ``qwen3_coder`` (Qwen3-Coder, Qwen3.5, Nemotron-3-Nano, Step-3.5-Flash),
  ``minimax_m2`` (MiniMax-M2), ``deepseek_v32`` (DeepSeek-V3.2), ``deepseek_v4``
  (DeepSeek-V4) and ``kimi_k3`` (Kimi-K3): XML-like calls with one tag per parameter,
  its value raw text typed by the tool's schema or by its tag's attribute (DeepSeek's
  DSML ``string``, Kimi-K3's ``type``)
  (colibri.server.tool_formats_xml).

DeepSeek's markers are written above with ASCII bars and spaces; in its vocabulary (and
the model's text) the bars are U+FF5C (full-width) and the spaces U+2581.

The formats were read off the templates themselves (llama.cpp's copies, build/test-data/
templates: what each renders for an assistant's tool calls) and checked against llama.cpp's
parsers (common/chat*.cpp); tests/server/test_server_tool_formats.py and
test_tool_formats_{xml,json,harmony}.py render calls through each template and parse them
back. What every format is built from (ToolCall, CallFormat, bounded JSON, the scanning
helpers) is colibri.server.tool_format_base. A call that does not parse (bad JSON, no
name, a missing closing tag in the middle of the text, JSON nested deeper than
:data:`MAX_JSON_DEPTH`) stays in the text. The model's text is untrusted: each format's
scanner reads it in linear time (str.find and regexes without nested repetition;
tests/server/test_tool_parsers_linear.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .tool_format_base import (
    _DIGITS,
    _UNREAD,
    _WORD_RUN,
    MAX_JSON_DEPTH,
    CallFormat,
    Found,
    ToolCall,
    Tools,
    _body_to,
    _Good,
    _json,
    _name_at,
    _object,
    _param_types,
    _scan_starts,
    _skip_ws,
)
from .tool_formats_harmony import CALL, RECIPIENT, read_harmony, scan_harmony
from .tool_formats_json import (
    PYTHON_TAG,
    TOOL_CALLS,
    read_llama3,
    read_mistral,
    scan_llama3,
    scan_mistral,
)
from .tool_formats_xml import (
    DEEPSEEK_V4,
    DEEPSEEK_V32,
    DSML,
    KIMI_K3,
    MINIMAX_M2,
    QWEN3_CODER,
    xml_reader,
    xml_scanner,
)

__all__ = ["FORMATS", "MAX_JSON_DEPTH", "CallFormat", "ToolCall", "template_format"]


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


def _scan_hermes(text: str) -> Iterator[Found]:
    # <tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)
    def at(i: int) -> Found:
        body, end = _body_to(text, i + len("<tool_call>"), "</tool_call>")
        return i, end, (body,)
    return _scan_starts(text, "<tool_call>", at)


_KEY, _KEY_END, _VALUE, _VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
_GLM_CALL, _GLM_CALL_END = "<tool_call>", "</tool_call>"


def _scan_glm(text: str) -> Iterator[Found]:
    """``<tool_call>[ \\t]*NAME\\s*(<arg_key>K</arg_key>\\s*<arg_value>V</arg_value>\\s*)*``
    then ``</tool_call>`` or the end of the text. A key ends at the first ``</arg_key>``
    followed by ``<arg_value>``; a value at the first ``</arg_value>`` followed by a key,
    the call's end or the end of the text (what the lazy regex found first). A pair's
    outcome depends only on where it starts: remembered, so a pair is read once."""
    key_ends = _Good(text, _KEY_END, (_VALUE,), or_end=False)
    value_ends = _Good(text, _VALUE_END, (_KEY, _GLM_CALL_END), or_end=True)
    pairs: dict[int, tuple[str, str, int] | None] = {}  # pair start -> (k, v, next) or None
    ends: dict[int, int] = {}  # pair start -> where its call ends, -1: it does not

    def pair(p: int) -> tuple[str, str, int] | None:
        if p not in pairs:
            ke = key_ends.first(p + len(_KEY))
            ve = -1 if ke < 0 else value_ends.first(
                _skip_ws(text, ke + len(_KEY_END)) + len(_VALUE))
            if ve < 0:
                pairs[p] = None
            else:
                vs = _skip_ws(text, ke + len(_KEY_END)) + len(_VALUE)
                pairs[p] = (text[p + len(_KEY):ke], text[vs:ve],
                            _skip_ws(text, ve + len(_VALUE_END)))
        return pairs[p]

    def call_end(q: int) -> int:
        """Where the call whose pairs (or end) begin at `q` ends, or -1."""
        chain: list[int] = []
        while text.startswith(_KEY, q) and q not in ends:
            chain.append(q)
            got = pair(q)
            if got is None:
                q = -1
                break
            q = got[2]
        if q < 0:
            end = -1
        elif q in ends:
            end = ends[q]
        elif text.startswith(_GLM_CALL_END, q):
            end = q + len(_GLM_CALL_END)
        else:
            end = len(text) if q == len(text) else -1
        for p in chain:
            ends[p] = end
        return end

    def at(i: int) -> Found | None:
        j = i + len(_GLM_CALL)
        while j < len(text) and text[j] in " \t":
            j += 1
        named = _name_at(text, j)
        if named is None:
            return None
        name, q = named[0], _skip_ws(text, named[1])
        end = call_end(q)
        if end < 0:
            return None
        args: list[tuple[str, str]] = []
        while text.startswith(_KEY, q) and (got := pair(q)) is not None:
            args.append((got[0], got[1]))
            q = got[2]
        return i, end, (name, args)
    return _scan_starts(text, _GLM_CALL, at)


def _scan_kimi(text: str) -> Iterator[Found]:
    # CALL\s*(?:functions\.)?(NAME)(?::(\d+))?\s*ARGS\s*(.*?)\s*(?:END|\Z)
    def at(i: int) -> Found | None:
        named = _name_at(text, _skip_ws(text, i + len(_KIMI_CALL)))
        if named is None:
            return None
        name, j = named
        if name.startswith("functions.") and _name_at(name, len("functions.")):
            name = name[len("functions."):]  # else "functions." is (part of) the name
        index = None
        if text.startswith(":", j) and (d := _DIGITS.match(text, j + 1)):
            index, j = d.group(), d.end()
        j = _skip_ws(text, j)
        if not text.startswith(_KIMI_ARGS, j):
            return None
        body, end = _body_to(text, j + len(_KIMI_ARGS), _KIMI_CALL_END)
        return i, end, (name, index, body)
    return _scan_starts(text, _KIMI_CALL, at)


def _scan_deepseek_v3(text: str) -> Iterator[Found]:
    # CALL\s*(?:\w+\s*)?SEP\s*(NAME)\s*```(?:json)?\s*(.*?)\s*```\s*(?:END|\Z)
    fences = _Good(text, "```", (_DS_CALL_END,), or_end=True)

    def at(i: int) -> Found | None:
        j = _skip_ws(text, i + len(_DS_CALL))
        word = _WORD_RUN.match(text, j)
        j = _skip_ws(text, word.end()) if word else j
        if not text.startswith(_DS_SEP, j):
            return None
        named = _name_at(text, _skip_ws(text, j + len(_DS_SEP)))
        if named is None:
            return None
        j = _skip_ws(text, named[1])
        if not text.startswith("```", j):
            return None
        j += 3
        if text.startswith("json", j):
            j += 4
        a = _skip_ws(text, j)
        close = fences.first(a)
        if close < 0:
            return None
        end = _skip_ws(text, close + 3)
        end = min(len(text), end + len(_DS_CALL_END)) if end < len(text) else end
        return i, end, (named[0], text[a:close].rstrip())
    return _scan_starts(text, _DS_CALL, at)


def _scan_deepseek_v31(text: str) -> Iterator[Found]:
    # CALL\s*(NAME)\s*SEP\s*(.*?)\s*(?:END|\Z)
    def at(i: int) -> Found | None:
        named = _name_at(text, _skip_ws(text, i + len(_DS_CALL)))
        if named is None:
            return None
        j = _skip_ws(text, named[1])
        if not text.startswith(_DS_SEP, j):
            return None
        body, end = _body_to(text, j + len(_DS_SEP), _DS_CALL_END)
        return i, end, (named[0], body)
    return _scan_starts(text, _DS_CALL, at)


def _read_hermes(f: tuple[Any, ...], tools: Tools) -> tuple[str, dict[str, Any], None] | None:
    obj = _object(f[0])
    if obj is None or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args = _object(args)
    if not isinstance(args, dict):
        return None
    return obj["name"], args, None


def _read_name_args(f: tuple[Any, ...], tools: Tools) -> tuple[str, dict[str, Any], None] | None:
    args = _object(f[1])
    return None if args is None else (f[0], args, None)


def _read_kimi(f: tuple[Any, ...], tools: Tools) -> tuple[str, dict[str, Any], str] | None:
    args = _object(f[2])
    if args is None:
        return None
    name, index = f[0], f[1] or "0"
    return name, args, f"functions.{name}:{index}"  # the id Kimi's template writes back


def _read_glm(f: tuple[Any, ...], tools: Tools) -> tuple[str, dict[str, Any], None] | None:
    """GLM writes a string value as it is and any other value as JSON (its template:
    ``v | tojson if v is not string else v``): a value is JSON unless the function's
    schema says the parameter is a string, or it does not parse as JSON."""
    name, pairs = f
    types = _param_types(tools, name)
    args: dict[str, Any] = {}
    for key, value in pairs:
        key = key.strip()
        kind = types.get(key)
        if kind == "string" or (isinstance(kind, list) and kind == ["string"]):
            args[key] = value
            continue
        got = _json(value)
        args[key] = value if got is _UNREAD else got
    return name, args, None


FORMATS: dict[str, CallFormat] = {f.name: f for f in (
    CallFormat("glm", markers=("<tool_call>", "<arg_key>"), opens=("<tool_call>",),
               scan=_scan_glm, read=_read_glm),
    CallFormat("kimi_k2", markers=(_KIMI_CALLS, _KIMI_CALL), opens=(_KIMI_CALLS, _KIMI_CALL),
               scan=_scan_kimi, read=_read_kimi, section=(_KIMI_CALLS, _KIMI_CALLS_END)),
    # DSML's tags are built in the templates' source from the token "|DSML|".
    CallFormat("deepseek_v32", markers=(DSML, "function_calls>"),
               opens=(f"<{DSML}function_calls>", f'<{DSML}invoke name="'),
               scan=xml_scanner(DEEPSEEK_V32), read=xml_reader(DEEPSEEK_V32),
               section=(f"<{DSML}function_calls>", f"</{DSML}function_calls>")),
    CallFormat("deepseek_v4", markers=(DSML, "tool_calls>"),
               opens=(f"<{DSML}tool_calls>", f'<{DSML}invoke name="'),
               scan=xml_scanner(DEEPSEEK_V4), read=xml_reader(DEEPSEEK_V4),
               section=(f"<{DSML}tool_calls>", f"</{DSML}tool_calls>")),
    # Kimi-K3's tags are built in its template's source by open_tag / close_tag.
    CallFormat("kimi_k3", markers=("open_tag('call'", "open_tag('argument'", "<|open|>"),
               opens=("<|open|>tools<|sep|>", '<|open|>call tool="'),
               scan=xml_scanner(KIMI_K3), read=xml_reader(KIMI_K3),
               section=("<|open|>tools<|sep|>", "<|close|>tools<|sep|>")),
    CallFormat("deepseek_v3", markers=(_DS_SEP, "```json"), opens=(_DS_CALLS, _DS_CALL),
               scan=_scan_deepseek_v3, read=_read_name_args,
               section=(_DS_CALLS, _DS_CALLS_END)),
    CallFormat("deepseek_v31", markers=(_DS_SEP,), opens=(_DS_CALLS, _DS_CALL),
               scan=_scan_deepseek_v31, read=_read_name_args,
               section=(_DS_CALLS, _DS_CALLS_END)),
    CallFormat("qwen3_coder", markers=("<tool_call>", "<function=", "<parameter="),
               opens=("<tool_call>", "<function="), scan=xml_scanner(QWEN3_CODER),
               read=xml_reader(QWEN3_CODER)),
    CallFormat("minimax_m2", markers=("<minimax:tool_call>", '<invoke name="'),
               opens=("<minimax:tool_call>", '<invoke name="'), scan=xml_scanner(MINIMAX_M2),
               read=xml_reader(MINIMAX_M2),
               section=("<minimax:tool_call>", "</minimax:tool_call>")),
    # (MiniMax-M3 prefixes its own tags, <tool_call> among them, with "]<]minimax[>[":
    # not this format.)
    CallFormat("hermes", markers=("<tool_call>",), absent=("<function=", "]<]minimax[>["),
               opens=("<tool_call>",), scan=_scan_hermes, read=_read_hermes),
    CallFormat("llama3_json", markers=("<|start_header_id|>ipython", '"parameters": '),
               opens=('{"name"', '{"type"', '{ "name"', '{ "type"', PYTHON_TAG),
               scan=scan_llama3, read=read_llama3),
    CallFormat("mistral", markers=(TOOL_CALLS, "[ARGS]"), opens=(TOOL_CALLS,),
               scan=scan_mistral, read=read_mistral),
    CallFormat("mistral_json", markers=(TOOL_CALLS + "[",), opens=(TOOL_CALLS,),
               scan=scan_mistral, read=read_mistral),
    CallFormat("harmony", markers=(CALL, "<|channel|>commentary"),
               opens=("<|start|>assistant to=", "<|start|>assistant<|channel|>commentary to=",
                      "<|channel|>commentary to=", RECIPIENT),
               scan=scan_harmony, read=read_harmony),
)}


def template_format(source: str) -> str | None:
    """The name of the :data:`FORMATS` entry a chat template's source asks for (the
    first that matches, in the table's order), or None: tools may still be rendered,
    calls are not parsed."""
    return next((f.name for f in FORMATS.values() if f.matches(source)), None)
