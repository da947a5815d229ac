"""Kimi-K3's tool calls (``kimi_k3``, colibri.server.tool_formats_xml): its XTML tags,
``<|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|><|open|>argument key="K"
type="string"<|sep|>V<|close|>argument<|sep|>...``, checked against its real template
(llama.cpp's copy, support.tokenizer_vectors.templates_dir): the calls the template renders
parse back to the same calls, whole and streamed a character at a time (a parameter at a
time); values read as their ``type`` attribute says; attribute escapes undone; malformed
calls stay text; the forced grammar admits what the template writes and nothing else."""

from __future__ import annotations

from typing import Any

import pytest
from test_tool_formats_dsml import CALLS, FORCED, STRICT, TIME, TOOLS
from test_tool_stream import _stream, _whole

from colibri.chat.template import ChatTemplate
from colibri.server.tool_formats import template_format
from colibri.server.tool_stream import CallArgs, CallStart
from colibri.server.tools import forced_call_grammar, parse_calls
from support.grammar_bytes import accepts
from support.tokenizer_vectors import templates_dir

NAME = "Kimi-K3.jinja"
RESPONSE, RESPONSE_END = "<|open|>response<|sep|>", "<|close|>response<|sep|>"


def _source() -> str:
    return (templates_dir() / NAME).read_text(encoding="utf-8")


def _answer(content: str, calls: list[dict[str, Any]] = CALLS) -> str:
    """What the model wrote after its reasoning: its response channel, then the calls."""
    tpl = ChatTemplate(_source(), bos_token="", eos_token="")
    tc = [{"type": "function", "id": f"call_{i}", "function": c} for i, c in enumerate(calls)]
    text = tpl.render([{"role": "user", "content": "Weather and time?"},
                       {"role": "assistant", "content": content, "tool_calls": tc}],
                      tools=TOOLS, add_generation_prompt=False)
    return text.rsplit(RESPONSE, 1)[1].split("<|close|>message<|sep|>")[0]


def _pairs(calls: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in calls]


def test_the_template_names_its_format() -> None:
    assert template_format(_source()) == "kimi_k3"


@pytest.mark.parametrize("content", ["", "Let me look."])
def test_calls_the_template_writes_parse_back_whole_and_streamed(content: str) -> None:
    turn = _answer(content)
    assert '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>' in turn
    text, calls = parse_calls(turn, "call_", "kimi_k3", TOOLS)
    # (The response channel's closing tag is left: K3's channels are not split yet.)
    assert text == content + RESPONSE_END
    assert _pairs(calls) == [(c["name"], c["arguments"]) for c in CALLS]
    want = _whole("kimi_k3", turn, tools=TOOLS)
    for step in (1, 3, len(turn)):
        got, streamed, events, live = _stream("kimi_k3", turn, step, tools=TOOLS)
        assert streamed == want[1] and got.strip() == want[0]
        if step < 64:
            assert [e.index for e in events[:live] if isinstance(e, CallStart)] == [0, 1]
            assert [e.text for e in events[:live] if isinstance(e, CallArgs)][:2] == [
                '{"city": "Zürich \\"centre\\""', ', "zip": "8001"']


def _call(args: str, name: str = "get_weather") -> str:
    return (f'<|open|>tools<|sep|><|open|>call tool="{name}" index="1"<|sep|>{args}'
            "<|close|>call<|sep|><|close|>tools<|sep|>")


def _arg(key: str, value: str, kind: str = "string") -> str:
    return f'<|open|>argument key="{key}" type="{kind}"<|sep|>{value}<|close|>argument<|sep|>'


def test_types_and_escapes() -> None:
    text = _call(_arg("city", "3") + _arg("days", "3", "number")
                 + _arg("a&amp;b &quot;q&quot;", "x")
                 + '<|open|>argument key="zip"<|sep|>8001<|close|>argument<|sep|>')
    _, (call,) = parse_calls(text, "call_", "kimi_k3", TOOLS)
    assert call.arguments == {"city": "3", "days": 3, 'a&b "q"': "x", "zip": "8001"}
    weird = _call(_arg("city", "Lyon"), name="get&amp;time")
    assert _pairs(parse_calls(weird, "call_", "kimi_k3", TOOLS)[1]) == [
        ("get&time", {"city": "Lyon"})]


MALFORMED = [
    _call(_arg("city", "Lyon")).replace('tool="get_weather"', 'tool=""'),  # no name
    _call('<|open|>argument key="city" type="string"<|sep|>Lyon'),  # never closed
    _call(_arg("city", "Lyon")).replace('key="city"', 'key="city" bogus="1"'),
    _call("Lyon"),
    '<|open|>tools<|sep|><|open|>json type="object"<|sep|>{"city": "Lyon"}<|close|>json<|sep|>'
    "<|close|>tools<|sep|>",  # the JSON-block form is not read
]


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_call_stays_text(text: str) -> None:
    assert parse_calls("Sure. " + text, "call_", "kimi_k3", TOOLS) == ("Sure. " + text, [])
    for step in (1, 5):
        content, calls, events, _ = _stream("kimi_k3", "Sure. " + text, step, tools=TOOLS)
        assert (content, calls) == _whole("kimi_k3", "Sure. " + text, tools=TOOLS)
        assert not any(isinstance(e, CallStart) for e in events)


def test_the_forced_grammar_admits_the_templates_call() -> None:
    turn = _answer("", FORCED).removeprefix(RESPONSE_END)
    grammar = forced_call_grammar([STRICT, TIME], None, "kimi_k3")
    # (The template writes the value's own type, "number" for 3; the grammar the schema's.)
    assert accepts(grammar, turn), turn
    assert _pairs(parse_calls(turn, "call_", "kimi_k3", [STRICT])[1]) == [
        (c["name"], c["arguments"]) for c in FORCED]
    assert not accepts(forced_call_grammar([STRICT, TIME], "get_time", "kimi_k3"), turn)
    for garbage in ("Sure.", turn.replace("get_weather", "get_wether"),
                    turn.replace(">C<", ">K<"), turn.replace("3", "9"), turn[:-5],
                    turn.replace('type="number"', 'type="string"')):
        assert not accepts(grammar, garbage), garbage
