"""DeepSeek's DSML tool calls (colibri.server.tool_formats_xml): DeepSeek-V3.2's
``<|DSML|function_calls>`` and DeepSeek-V4's ``<|DSML|tool_calls>`` around ``<|DSML|invoke
name=...><|DSML|parameter name=... string="true|false">`` (full-width bars), checked against
the real templates (llama.cpp's copies, support.tokenizer_vectors.templates_dir): the
calls a template renders parse back to the same calls, whole and streamed a character at a
time (their arguments sent as each parameter ends); values read as their ``string``
attribute says; malformed calls stay text; a forced call's grammar admits what the
template writes and nothing else; streaming takes linear time."""

from __future__ import annotations

import time
from typing import Any

import pytest
from test_tool_stream import _stream, _whole

from colibri.chat.template import ChatTemplate
from colibri.server.tool_formats import template_format
from colibri.server.tool_formats_xml import DSML
from colibri.server.tool_stream import CallArgs, CallStart, ToolStream
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
ASSISTANT, EOS = "<\uff5cAssistant\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>"
TEMPLATES = {"deepseek-ai-DeepSeek-V3.2.jinja": "deepseek_v32",
             "deepseek-ai-DeepSeek-V4.jinja": "deepseek_v4",
             "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": "deepseek_v4"}
WRAPPER = {"deepseek_v32": "function_calls", "deepseek_v4": "tool_calls"}


def _source(name: str) -> str:
    return (templates_dir() / name).read_text(encoding="utf-8")


def _turn(name: str, content: str, calls: list[dict[str, Any]] = CALLS) -> str:
    """What the model wrote for `calls` after `content` (past the empty reasoning)."""
    tpl = ChatTemplate(_source(name), bos_token="", eos_token="")
    tc = [{"type": "function", "id": f"call_{i}", "function": c} for i, c in enumerate(calls)]
    text = tpl.render([*ASK, {"role": "assistant", "content": content, "tool_calls": tc}],
                      tools=TOOLS, add_generation_prompt=False)
    turn = text.rsplit(ASSISTANT, 1)[1].split(EOS)[0]
    return turn.split("</think>", 1)[1] if "</think>" in turn else turn


def _pairs(calls: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_template_names_its_format(name: str) -> None:
    assert template_format(_source(name)) == TEMPLATES[name]


@pytest.mark.parametrize("content", ["", "Let me look."])
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_calls_the_template_writes_parse_back_whole_and_streamed(name: str, content: str
                                                                 ) -> None:
    fmt = TEMPLATES[name]
    turn = _turn(name, content)
    assert f"<{DSML}{WRAPPER[fmt]}>" in turn
    text, calls = parse_calls(turn, "call_", fmt, TOOLS)
    assert text == content
    assert _pairs(calls) == [(c["name"], c["arguments"]) for c in CALLS]
    want = _whole(fmt, turn, tools=TOOLS)
    for step in (1, 3, len(turn)):
        got, streamed, events, live = _stream(fmt, turn, step, tools=TOOLS)
        assert streamed == want[1] and got.strip() == want[0]
        if step < 64:  # both calls opened, a parameter at a time, before the answer ended
            assert [e.index for e in events[:live] if isinstance(e, CallStart)] == [0, 1]
            assert [e.text for e in events[:live] if isinstance(e, CallArgs)][:2] == [
                '{"city": "Zürich \\"centre\\""', ', "zip": "8001"']


def _call(params: str, fmt: str = "deepseek_v32") -> str:
    w = WRAPPER[fmt]
    return (f'<{DSML}{w}>\n<{DSML}invoke name="get_weather">\n{params}</{DSML}invoke>\n'
            f"</{DSML}{w}>")


def _param(key: str, value: str, attr: str = ' string="true"') -> str:
    return f'<{DSML}parameter name="{key}"{attr}>{value}</{DSML}parameter>\n'


def test_the_string_attribute_says_how_to_read_a_value() -> None:
    text = _call(_param("city", "3") + _param("days", "3", ' string="false"')
                 + _param("zip", "8001", "") + _param("options", "not json", ' string="false"'))
    _, (call,) = parse_calls(text, "call_", "deepseek_v32", TOOLS)
    # "true": text whatever the schema; "false": JSON; none: the schema's type; "false" but
    # not JSON: the schema's reading (here an object's: the text).
    assert call.arguments == {"city": "3", "days": 3, "zip": "8001", "options": "not json"}
    _, (call,) = parse_calls(_call(_param("days", "3", "")), "call_", "deepseek_v32", TOOLS)
    assert call.arguments == {"days": 3}


MALFORMED = [
    _call(_param("city", "Lyon", ' string="maybe"')),  # not an attribute DSML has
    _call(f'<{DSML}parameter name="city" string="true">Lyon'),  # a value never closed
    _call(_param("city", "Lyon")).replace('invoke name="get_weather"', 'invoke name=""'),
    _call(_param("city", "Lyon")).replace(f"<{DSML}parameter", "<parameter"),
    _call("Lyon\n"),  # a value outside any parameter
    _call(_param("city", "Lyon"), "deepseek_v4").replace(f"</{DSML}invoke>", "</invoke>")
    + " more",
]


@pytest.mark.parametrize("fmt", sorted(WRAPPER))
@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_call_stays_text(fmt: str, text: str) -> None:
    text = text.replace(WRAPPER["deepseek_v32"], WRAPPER[fmt])
    assert parse_calls("Sure. " + text, "call_", fmt, TOOLS) == ("Sure. " + text, [])
    for step in (1, 5):
        content, calls, events, _ = _stream(fmt, "Sure. " + text, step, tools=TOOLS)
        assert (content, calls) == _whole(fmt, "Sure. " + text, tools=TOOLS)
        assert not any(isinstance(e, CallStart) for e in events)


STRICT = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["C", "F"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "options": {"type": "object", "properties": {"hours": {"type": "array"}}}},
        "required": ["city", "unit"]}}}
FORCED = [{"name": "get_weather", "arguments": {"city": "Zürich \"centre\"", "unit": "C",
                                                "days": 3, "options": {"hours": [6, 12]}}}]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_forced_grammar_admits_the_templates_call(name: str) -> None:
    fmt = TEMPLATES[name]
    turn = _turn(name, "", FORCED).strip()
    grammar = forced_call_grammar([STRICT, TIME], None, fmt)
    assert accepts(grammar, turn), turn
    assert _pairs(parse_calls(turn, "call_", fmt, [STRICT])[1]) == [
        (c["name"], c["arguments"]) for c in FORCED]
    assert not accepts(forced_call_grammar([STRICT, TIME], "get_time", fmt), turn)
    for garbage in ("Sure.", turn.replace("get_weather", "get_wether"),
                    turn.replace(">C<", ">K<"), turn.replace("3", "9"), turn[:-5],
                    turn.replace('string="false"', 'string="true"', 1)):
        assert not accepts(grammar, garbage), garbage


def _seconds(text: str) -> float:
    t = time.perf_counter()
    ts = ToolStream("deepseek_v32", TOOLS)
    for i in range(0, len(text), 4):
        ts.feed(text[i:i + 4])
    ts.finish()
    return time.perf_counter() - t


def test_streaming_time_grows_linearly() -> None:
    def hostile(n: int) -> str:
        return (f'<{DSML}invoke name="f"><{DSML}parameter name="a" string="true">'
                + f"</{DSML}parameter> <" * n)
    small = min(_seconds(hostile(5_000)) for _ in range(3))
    big = min(_seconds(hostile(40_000)) for _ in range(2))
    assert big < 20 * small + 0.05, f"{small:.4f} s, 8x: {big:.4f} s"
