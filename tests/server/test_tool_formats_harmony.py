"""gpt-oss's tool calls (harmony commentary-channel messages to ``functions.NAME``;
colibri.server.tool_formats_harmony), checked against its real template (llama.cpp's copy,
support.tokenizer_vectors.templates_dir): the call the template writes back parses to the
same call, whole and streamed a character at a time; the model's own order (recipient
after the channel, ``<|constrain|>json``) and several calls parse; malformed calls stay
text; the forced grammar admits a call and nothing else. After the reasoning splitter
(colibri.sampling.harmony) the answer holds the final text and the call messages: the
calls come out, the final text is the content."""

from __future__ import annotations

from typing import Any

import pytest
from test_tool_stream import _stream, _whole

from colibri.chat.template import ChatTemplate
from colibri.sampling.reasoning_split import split_text
from colibri.server.tool_formats import template_format
from colibri.server.tools import forced_call_grammar, parse_calls
from support.grammar_bytes import accepts
from support.tokenizer_vectors import templates_dir

NAME = "openai-gpt-oss-120b.jinja"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40}, "days": {"type": "integer"}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
CALL = {"name": "get_weather", "arguments": {"city": "Zürich \"centre\" <|call|>", "days": 3}}
START = "<|start|>assistant"


def _source() -> str:
    return (templates_dir() / NAME).read_text(encoding="utf-8")


def test_the_template_names_its_format() -> None:
    assert template_format(_source()) == "harmony"


def _output(content: str) -> str:
    """What the model wrote after the generation prompt (``<|start|>assistant``) for a turn
    with `content` (the template puts it on the analysis channel) and CALL."""
    tpl = ChatTemplate(_source(), bos_token="", eos_token="")
    tc = [{"type": "function", "id": "call_0", "function": CALL}]
    msgs = [{"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": content, "tool_calls": tc},
            {"role": "tool", "content": "18 C"}]
    text = tpl.render(msgs, tools=TOOLS, add_generation_prompt=True)
    turn = text.split("<|start|>user<|message|>Weather in Zürich?<|end|>" + START, 1)[1]
    return turn.split("<|start|>functions.")[0]


def _pairs(calls: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in calls]


def test_the_call_the_template_writes_parses_back() -> None:
    out = _output("Let me check.")
    assert out.endswith(START + " to=functions.get_weather<|channel|>commentary json"
                        '<|message|>{"city": "Zürich \\"centre\\" <|call|>", "days": 3}<|call|>')
    text, calls = parse_calls(out, "call_", "harmony", TOOLS)
    assert _pairs(calls) == [(CALL["name"], CALL["arguments"])]
    assert text == "<|channel|>analysis<|message|>Let me check.<|end|>"  # left as it is
    content, calls_streamed = _stream("harmony", out, tools=TOOLS)[:2]  # sends leading space
    assert (content.strip(), calls_streamed) == _whole("harmony", out, tools=TOOLS)


def test_after_the_reasoning_splitter() -> None:
    """The analysis channel is reasoning; the call message reaches the answer verbatim and
    parses; a final answer after a call is the content."""
    out = _output("Let me check.")
    reasoning, answer = split_text(out, "harmony")
    assert reasoning == "Let me check."
    text, calls = parse_calls(answer, "call_", "harmony", TOOLS)
    assert text == "" and _pairs(calls) == [(CALL["name"], CALL["arguments"])]
    out = ("<|channel|>analysis<|message|>Look it up.<|end|>" + START + MODEL_ORDER
           + START + "<|channel|>final<|message|>It is noon.<|return|>")
    reasoning, answer = split_text(out, "harmony")
    text, calls = parse_calls(answer, "call_", "harmony", TOOLS)
    assert (reasoning, text) == ("Look it up.", "It is noon.")
    assert _pairs(calls) == [("get_time", {"city": "Lyon"})]


MODEL_ORDER = ('<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>'
               '{"city": "Lyon"}<|call|>')


@pytest.mark.parametrize("end", ["<|call|>", ""])  # <|call|> ends generation: maybe not text
def test_the_models_order_and_several_calls(end: str) -> None:
    out = ("<|channel|>analysis<|message|>Two lookups.<|end|>" + START + MODEL_ORDER
           + START + MODEL_ORDER.removesuffix("<|call|>") + end)
    text, calls = parse_calls(out, "call_", "harmony", TOOLS)
    assert _pairs(calls) == [("get_time", {"city": "Lyon"})] * 2
    assert text == "<|channel|>analysis<|message|>Two lookups.<|end|>"
    content, calls_streamed = _stream("harmony", out, tools=TOOLS)[:2]  # sends leading space
    assert (content.strip(), calls_streamed) == _whole("harmony", out, tools=TOOLS)


MALFORMED = [
    '<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{"city": <|call|>',
    "<|channel|>commentary to=functions. json<|message|>{}<|call|>",  # no name
    "<|channel|>commentary to=functions.get_time json {}<|call|>",  # no <|message|>
    '<|channel|>commentary to=functions.get_time<|message|>[1]<|call|>',
]


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_call_stays_text(text: str) -> None:
    assert parse_calls("Sure. " + text, "call_", "harmony", TOOLS) == ("Sure. " + text, [])


def test_an_unclosed_call_does_not_swallow_the_next() -> None:
    bad = '<|channel|>commentary to=functions.get_weather json<|message|>{"city": '
    text, calls = parse_calls(bad + START + MODEL_ORDER, "call_", "harmony", TOOLS)
    assert _pairs(calls) == [("get_time", {"city": "Lyon"})] and text == bad.strip()


def test_the_forced_grammar() -> None:
    grammar = forced_call_grammar(TOOLS, None, "harmony")
    call = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
            '{"city": "Lyon", "days": 3}')
    for ok in (call, call + "<|call|>"):
        assert accepts(grammar, ok)
        assert _pairs(parse_calls(ok, "call_", "harmony", TOOLS)[1]) == [
            ("get_weather", {"city": "Lyon", "days": 3})]
    assert not accepts(forced_call_grammar(TOOLS, "get_time", "harmony"), call)
    for garbage in ("Sure.", call.replace("get_weather", "get_wether"), call[:-1],
                    call.replace("3", '"3"'), call + "<|call|><|call|>"):
        assert not accepts(grammar, garbage), garbage
