"""The XML-like tool-call formats (colibri.server.tool_formats_xml): Qwen3-Coder's and
Qwen3.5's ``<function=NAME><parameter=K>`` (also Nemotron-3-Nano's and Step-3.5-Flash's) and
MiniMax-M2's ``<invoke name=...><parameter name=...>``, checked against the real templates
(llama.cpp's copies, support.tokenizer_vectors.templates_dir): the calls a template renders
parse back to the same calls, whole and streamed a character at a time, each value typed by
the tool's schema; malformed calls stay text; a forced call's grammar admits what the
template writes and nothing else."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_tool_stream import _stream, _whole

from colibri.chat.template import ChatTemplate
from colibri.server.tool_formats import template_format
from colibri.server.tool_formats_xml import typed_value
from colibri.server.tools import forced_call_grammar, parse_calls
from support.grammar_bytes import accepts
from support.tokenizer_vectors import templates_dir

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "zip": {"type": "string"}, "days": {"type": "integer"},
        "metric": {"type": "boolean"}, "options": {"type": "object"},
        "note": {"type": ["string", "null"]}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
CALLS = [{"name": "get_weather",
          "arguments": {"city": "Zürich \"centre\"", "zip": "8001", "days": 3, "metric": True,
                        "options": {"metric": True, "hours": [6, 12]},
                        "note": "  indented\nand </parameter> inside\n"}},
         {"name": "get_time", "arguments": {"city": "Lyon"}}]
ASK = [{"role": "user", "content": "Weather and time in Zürich and Lyon?"}]

# template -> (format, the assistant turn's opening, its end)
TEMPLATES = {
    "Qwen3-Coder.jinja": ("qwen3_coder", "<|im_start|>assistant", "<|im_end|>"),
    "Qwen3.5-4B.jinja": ("qwen3_coder", "</think>", "<|im_end|>"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": ("qwen3_coder", "<think></think>",
                                                  "<|im_end|>"),
    "StepFun3.5-Flash.jinja": ("qwen3_coder", "</think>", "<|im_end|>"),
    "MiniMax-M2.jinja": ("minimax_m2", "]~b]ai", "[e~["),
}


def _source(name: str) -> str:
    return (templates_dir() / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_template_names_its_format(name: str) -> None:
    assert template_format(_source(name)) == TEMPLATES[name][0]


def test_other_function_tag_templates_are_not_taken() -> None:
    """Seed-OSS writes ``<function=`` inside ``<seed:tool_call>``: not this format."""
    assert template_format(_source("ByteDance-Seed-OSS.jinja")) is None


def _turn(name: str, content: str, calls: list[dict[str, Any]] = CALLS) -> str:
    """The assistant's turn the template renders for `calls` after `content`."""
    _, opening, end = TEMPLATES[name]
    tpl = ChatTemplate(_source(name), bos_token="", eos_token="")
    tc = [{"type": "function", "id": f"call_{i}", "function": c} for i, c in enumerate(calls)]
    text = tpl.render([*ASK, {"role": "assistant", "content": content, "tool_calls": tc}],
                      tools=TOOLS, add_generation_prompt=False)
    return text.rsplit(opening, 1)[1].split(end)[0]


def _pairs(calls: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_calls_the_template_writes_parse_back(name: str) -> None:
    fmt = TEMPLATES[name][0]
    turn = _turn(name, "Let me look.")
    text, calls = parse_calls(turn, "call_", fmt, TOOLS)
    assert text == "Let me look."
    assert _pairs(calls) == [(c["name"], c["arguments"]) for c in CALLS]
    assert all(c.id.startswith("call_") for c in calls)
    content, calls_streamed = _stream(fmt, turn, tools=TOOLS)[:2]  # sends leading space
    assert (content.strip(), calls_streamed) == _whole(fmt, turn, tools=TOOLS)


@pytest.mark.parametrize("name", ["Qwen3-Coder.jinja", "MiniMax-M2.jinja"])
def test_one_call_and_no_content(name: str) -> None:
    turn = _turn(name, "", CALLS[1:])
    assert parse_calls(turn, "call_", TEMPLATES[name][0], TOOLS)[0] == ""


def test_values_follow_the_schema() -> None:
    """Qwen's template writes numbers and booleans with jinja's ``string`` (``True``): a
    string parameter keeps its text, others are read as their type when they are one."""
    turn = _turn("Qwen3-Coder.jinja", "")
    assert "<parameter=metric>\nTrue\n</parameter>" in turn
    _, (call, _) = parse_calls(turn, "call_", "qwen3_coder", None)  # no schema: JSON or text
    assert call.arguments["zip"] == 8001 and call.arguments["metric"] == "True"
    assert typed_value("3", "integer") == 3 and typed_value("3.5", "integer") == "3.5"
    assert typed_value("3", "number") == 3 and typed_value("false", "boolean") is False
    assert typed_value("null", ["string", "null"]) is None
    assert typed_value("[1]", "object") == "[1]" and typed_value("None", "string") == "None"


QWEN_GOOD = "<tool_call>\n<function=get_time>\n<parameter=city>\nLyon\n</parameter>\n"
MINIMAX_GOOD = '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="city">Lyon'

MALFORMED = [
    ("qwen3_coder", "<tool_call>\n<function=>\n</function>\n</tool_call>"),  # no name
    ("qwen3_coder", "<tool_call>\n<function=get_time\n<parameter=city>\nLyon"),
    ("qwen3_coder", "<tool_call>\n<function=get_time>\n<parameter=city>\nLyon\n</function>"
                    "\n</tool_call> and more"),  # a value never closed
    ("qwen3_coder", "<tool_call>\n<function=get_time>\n<parameter=city\nLyon\n</parameter>"),
    ("qwen3_coder", "<tool_call>\n<function=get_time>\nLyon\n</function>\n</tool_call>"),
    ("minimax_m2", '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="city">'
                   "Lyon</invoke>\n</minimax:tool_call> more"),
    ("minimax_m2", '<minimax:tool_call>\n<invoke name=get_time>\n</invoke>'),
]


@pytest.mark.parametrize(("fmt", "text"), MALFORMED)
def test_a_malformed_call_stays_text(fmt: str, text: str) -> None:
    assert parse_calls("Sure. " + text, "call_", fmt, TOOLS) == ("Sure. " + text, [])
    # A call that opened and then broke stays opened in a stream; its text is content.
    assert _stream(fmt, "Sure. " + text, tools=TOOLS)[0] == "Sure. " + text


@pytest.mark.parametrize(("fmt", "text"), [
    ("qwen3_coder", QWEN_GOOD), ("qwen3_coder", QWEN_GOOD + "</function>"),
    ("qwen3_coder", QWEN_GOOD + "</tool_call>"),  # the model left </function> out
    ("qwen3_coder", QWEN_GOOD.removeprefix("<tool_call>\n") + "</function>"),  # no wrapper
    ("minimax_m2", MINIMAX_GOOD + "</parameter>"),
    ("minimax_m2", MINIMAX_GOOD + "</parameter>\n</minimax:tool_call>"),
])
def test_an_unterminated_or_loosely_wrapped_call_parses(fmt: str, text: str) -> None:
    rest, calls = parse_calls(text, "call_", fmt, TOOLS)
    assert rest == "" and _pairs(calls) == [("get_time", {"city": "Lyon"})]


def test_a_bad_call_beside_a_good_one() -> None:
    bad = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis</tool_call>"
    good = "<tool_call>\n<function=get_time>\n<parameter=city>\nLyon\n</parameter>\n" \
           "</function>\n</tool_call>"
    text, calls = parse_calls(f"{good}\n{bad}\n{good}", "call_", "qwen3_coder", TOOLS)
    assert _pairs(calls) == [("get_time", {"city": "Lyon"})] * 2 and text == bad


# --- forced calls: the grammar admits what the template writes ---------------------------

STRICT = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["C", "F"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "options": {"type": "object", "properties": {"hours": {"type": "array"}}}},
        "required": ["city", "unit"]}}}
FORCED = [{"name": "get_weather", "arguments": {"city": "Zürich \"centre\"", "unit": "C",
                                                "days": 3, "options": {"hours": [6, 12]}}}]


@pytest.mark.parametrize("name", ["Qwen3-Coder.jinja", "Qwen3.5-4B.jinja", "MiniMax-M2.jinja"])
def test_the_forced_grammar_admits_the_templates_call(name: str) -> None:
    fmt = TEMPLATES[name][0]
    turn = _turn(name, "", FORCED).strip()
    grammar = forced_call_grammar([STRICT, TIME], None, fmt)
    assert accepts(grammar, turn), turn
    assert _pairs(parse_calls(turn, "call_", fmt, [STRICT])[1]) == [
        (c["name"], c["arguments"]) for c in FORCED]
    named = forced_call_grammar([STRICT, TIME], "get_time", fmt)
    assert not accepts(named, turn)  # another function
    for garbage in ("Sure.", turn.replace("get_weather", "get_wether"),
                    turn.replace(">C<", ">K<").replace("\nC\n", "\nK\n"),  # not in the enum
                    turn.replace("3", "9"), turn[:-5]):
        assert not accepts(grammar, garbage), garbage


ENUM_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"level": {"enum": ["1", "2"]}, "n": {"type": "integer"},
                                     "mixed": {"enum": ["1", 2]}}}}}]


@pytest.mark.parametrize(("fmt", "text"), [
    ("glm", "<tool_call>f\n<arg_key>level</arg_key>\n<arg_value>2</arg_value>\n<arg_key>n"
            "</arg_key>\n<arg_value>3</arg_value>\n<arg_key>mixed</arg_key>\n<arg_value>2"
            "</arg_value>\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=level>\n2\n</parameter>\n"
                    "<parameter=n>\n3\n</parameter>\n<parameter=mixed>\n2\n</parameter>\n"
                    "</function>\n</tool_call>"),
    ("minimax_m2", '<minimax:tool_call>\n<invoke name="f">\n<parameter name="level">2</parameter>'
                   '\n<parameter name="n">3</parameter>\n<parameter name="mixed">2</parameter>\n'
                   "</invoke>\n</minimax:tool_call>"),
])
def test_an_untyped_enum_of_strings_stays_text(fmt: str, text: str) -> None:
    """``{"enum": ["1", "2"]}`` without a ``type``: the value "2" is the string the enum
    allows, not the number 2 (an enum that also holds numbers is read as JSON); the
    stream agrees."""
    _, (call,) = parse_calls(text, "call_", fmt, ENUM_TOOLS)
    assert call.arguments == {"level": "2", "n": 3, "mixed": 2}
    assert _stream(fmt, text, tools=ENUM_TOOLS)[1] == [("f", json.dumps(call.arguments))]
