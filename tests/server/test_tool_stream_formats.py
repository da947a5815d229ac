"""Tool calls streamed as written, for the formats whose readers are in
colibri.server.tool_stream_xml (qwen3_coder, minimax_m2, deepseek_v32, deepseek_v4,
kimi_k3: a parameter at a time) and
colibri.server.tool_stream_json (llama3_json, mistral, mistral_json, harmony: the JSON
arguments echoed as ``json.dumps`` writes them). As test_tool_stream.py does for the
others: each format's calls as its real template renders them (llama.cpp's copies), fed a
character at a time and in other pieces, open and send arguments before the answer ends
and settle to exactly the non-streamed parse; malformed and unterminated calls stay text
as they do whole; seeded damage never gives other calls than the whole parse but for
calls that opened and then broke; the readers take linear time on hostile text."""

from __future__ import annotations

import json
import random
import time

import pytest
import test_tool_formats_dsml as dsml
import test_tool_formats_harmony as harmony
import test_tool_formats_json as bare
import test_tool_formats_kimi_k3 as k3
import test_tool_formats_xml as xml
from test_tool_stream import _stream, _whole

from colibri.server.tool_formats_xml import DSML
from colibri.server.tool_stream import CallArgs, CallStart, ToolStream

TOOLS = xml.TOOLS  # the same get_weather / get_time as the JSON and harmony tests', wider
HARMONY_SECOND = harmony.START + harmony.MODEL_ORDER  # gpt-oss's second call, as it writes


def _turns() -> list[tuple[str, str, str, int]]:
    """(template, format, the assistant's output, how many calls) for every template."""
    out = []
    for name, (fmt, *_rest) in sorted(xml.TEMPLATES.items()):
        for content in ("", "Let me look."):
            out.append((name, fmt, xml._turn(name, content), 2))
    for name, (fmt, _, _, _, several) in sorted(bare.TEMPLATES.items()):
        calls = bare.CALLS if several else bare.CALLS[:1]
        for content in ("", "Let me look."):
            out.append((name, fmt, bare._turn(name, content, calls), len(calls)))
    for content in ("", "Let me check."):
        out.append((harmony.NAME, "harmony", harmony._output(content) + HARMONY_SECOND, 2))
    for name, fmt in sorted(dsml.TEMPLATES.items()):
        out += [(name, fmt, dsml._turn(name, content), 2) for content in ("", "Let me look.")]
    out += [(k3.NAME, "kimi_k3", k3._answer(content), 2) for content in ("", "Let me look.")]
    return out


TURNS = _turns()


@pytest.mark.parametrize(("name", "fmt", "turn", "n"), TURNS,
                         ids=[f"{t[0]}-{i}" for i, t in enumerate(TURNS)])
def test_rendered_calls_stream_as_the_whole_parse(name: str, fmt: str, turn: str,
                                                  n: int) -> None:
    want = _whole(fmt, turn, tools=TOOLS)
    assert len(want[1]) == n, turn
    for step in (1, 2, 5, 64, len(turn)):
        got, calls, events, live = _stream(fmt, turn, step, tools=TOOLS)
        assert calls == want[1], (step, turn)
        assert got.lstrip() == want[0].lstrip() and got.strip() == want[0].strip()
        if step < 64:  # every call opened, and arguments sent, before the answer ended
            opened = [e for e in events[:live] if isinstance(e, CallStart)]
            assert [e.index for e in opened] == list(range(n))
            first = next(e for e in events[:live] if isinstance(e, CallArgs))
            assert first.text != want[1][0][1]  # a fragment, not the whole


@pytest.mark.parametrize(("fmt", "text"), [
    ("qwen3_coder", "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n"
                    "</parameter>\n<parameter=zip>\n69001\n</parameter>\n<parameter=days>\n3\n"
                    "</parameter>\n</function>\n</tool_call>"),
    ("minimax_m2", 'Sure.\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter '
                   'name="city">Lyon</parameter>\n<parameter name="zip">69001</parameter>\n'
                   '<parameter name="days">3</parameter>\n</invoke>\n</minimax:tool_call>'),
])
def test_parameters_stream_as_json_as_each_ends(fmt: str, text: str) -> None:
    _, calls, events, live = _stream(fmt, text, tools=TOOLS)
    assert [e.text for e in events[:live] if isinstance(e, CallArgs)] == [
        '{"city": "Lyon"', ', "zip": "69001"', ', "days": 3', "}"]  # zip: a string
    assert calls == _whole(fmt, text, tools=TOOLS)[1]


def test_a_mistral_list_opens_each_call_and_gives_ids_the_template_takes() -> None:
    turn = bare._turn("mistralai-Mistral-Nemo-Instruct-2407.jinja", "", bare.CALLS)
    ts = ToolStream("mistral_json", TOOLS)
    events = [e for ch in turn for e in ts.feed(ch)]
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [s.name for s in starts] == ["get_weather", "get_time"]
    assert all(len(s.id) == 9 and s.id.isalnum() for s in starts)
    assert ts.finish() == []


MALFORMED = [
    ("qwen3_coder", "<tool_call>\n<function=>\n</function>\n</tool_call>"),  # no name
    ("qwen3_coder", "<tool_call>\n<function=get_time\n<parameter=city>\nLyon"),
    ("qwen3_coder", "<tool_call>\n<function=get_time>\nLyon\n</function>\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=get_time>\n<parameter=city>\nLyon\n</function>"
                    "\n</tool_call> and more"),  # a value never closed
    ("qwen3_coder", "<tool_call>\n<function=get_time>\n<parameter=city>\nLy"),  # unterminated
    ("minimax_m2", '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="city">'
                   "Lyon</invoke>\n</minimax:tool_call> more"),
    ("minimax_m2", '<minimax:tool_call>\n<invoke name=get_time>\n</invoke>'),
    ("llama3_json", '{"name": "get_time", "parameters": [1]}'),
    ("llama3_json", '{"name": "get_time", "parameters": {city: Lyon}}'),
    ("llama3_json", '{"name": "get_time", "parameters": {"city": '),  # unterminated
    ("mistral", '[TOOL_CALLS]get_time{"city": "Lyon"}'),
    ("mistral", '[TOOL_CALLS][ARGS]{"city": "Lyon"}'),
    ("mistral", '[TOOL_CALLS]get_time[ARGS][1, 2]'),
    ("mistral", "[TOOL_CALLS]get_time[ARGS]"),
    ("mistral_json", '[TOOL_CALLS]{"name": "get_time", "arguments": {}}'),
    ("mistral_json", '[TOOL_CALLS][{"name": "get_time", "arguments": [1]}]'),
    ("harmony", "<|channel|>commentary to=functions. json<|message|>{}<|call|>"),
    ("harmony", "<|channel|>commentary to=functions.get_time json {}<|call|>"),
    ("harmony", '<|channel|>commentary to=functions.get_time<|message|>[1]<|call|>'),
]


@pytest.mark.parametrize(("fmt", "text"), MALFORMED)
def test_malformed_and_unterminated_calls_stay_text_as_whole(fmt: str, text: str) -> None:
    for cut in (False, True):
        for raw in (False, True):
            whole = _whole(fmt, "Sure. " + text, cut=cut, raw=raw, tools=TOOLS)
            assert whole[1] == []
            for step in (1, 4, 1000):
                content, calls, events, _ = _stream(fmt, "Sure. " + text, step, cut=cut,
                                                    raw=raw, tools=TOOLS)
                assert (content, calls) == whole
                assert not any(isinstance(e, CallStart) for e in events)


def test_a_bad_call_beside_good_ones() -> None:
    good = ("<tool_call>\n<function=get_time>\n<parameter=city>\nLyon\n</parameter>\n"
            "</function>\n</tool_call>")
    bad = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis</tool_call>"
    text = f"{good}\n{bad}\n{good}"
    assert _stream("qwen3_coder", text, tools=TOOLS)[:2] == _whole("qwen3_coder", text,
                                                                   tools=TOOLS)


PIECES = {"qwen3_coder": ["<tool_call>", "</tool_call>", "<function=", "</parameter>",
                          "<parameter=", ">", "\n"],
          "minimax_m2": ["<minimax:tool_call>", '<invoke name="', "</invoke>", "</parameter>",
                         '<parameter name="', '">'],
          "llama3_json": ["{", "}", '"', '{"name": ', "<|python_tag|>", ","],
          "mistral": ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "{", "}", '"'],
          "mistral_json": ["[TOOL_CALLS]", "[", "]", "{", "}", '"', ","],
          "harmony": ["<|call|>", "to=functions.", "<|message|>", "<|start|>assistant", "{",
                      "}"],
          **{fmt: [f"<{DSML}{w}>", f"</{DSML}{w}>", f'<{DSML}invoke name="', f"</{DSML}invoke>",
                   f"</{DSML}parameter>", f'<{DSML}parameter name="', ' string="false">', '">']
             for fmt, w in dsml.WRAPPER.items()},
          "kimi_k3": ["<|open|>tools<|sep|>", "<|close|>tools<|sep|>", '<|open|>call tool="',
                      "<|close|>call<|sep|>", "<|close|>argument<|sep|>", "<|sep|>",
                      '<|open|>argument key="', ' type="number"', '"']}


@pytest.mark.parametrize("fmt", sorted(PIECES))
def test_fuzzed_calls_agree_with_the_whole_parse(fmt: str) -> None:
    """As test_tool_stream.py's fuzz: seeded good turns, some with a piece of a marker or
    JSON spliced in; the stream's content and calls are the whole parse's but for calls
    that opened and then broke; never an error."""
    rng = random.Random(f"tool-stream-formats-{fmt}")
    turns = [t for _, f, t, _ in TURNS if f == fmt]
    broke = 0
    for _ in range(200):
        text = rng.choice(turns) * rng.randint(1, 3)
        if rng.random() < 0.6:
            i = rng.randrange(len(text))
            text = text[:i] + rng.choice(PIECES[fmt]) + text[i + rng.randint(0, 4):]
        cut, raw = rng.random() < 0.3, rng.random() < 0.5
        content, calls = _stream(fmt, text, rng.choice([1, 3, 7]), cut=cut, raw=raw,
                                 tools=TOOLS)[:2]
        want = _whole(fmt, text, cut=cut, raw=raw, tools=TOOLS)
        assert content.lstrip() == want[0].lstrip() and content.strip() == want[0].strip(), text
        if calls != want[1]:
            assert len(calls) > len(want[1]), text  # only calls that opened, then broke
            broke += 1
    assert broke < 70


def _seconds(text: str, fmt: str) -> float:
    t = time.perf_counter()
    ts = ToolStream(fmt, TOOLS)
    for i in range(0, len(text), 4):
        ts.feed(text[i:i + 4])
    ts.finish()
    return time.perf_counter() - t


HOSTILE = {
    "qwen3_coder": lambda n: "<function=f>\n<parameter=a>\n" + "</parameter>x" * n,
    "minimax_m2": lambda n: '<invoke name="f"><parameter name="a">' + "</parameter> <" * n,
    "llama3_json": lambda n: '{"name": "f", "parameters": {"a": [' + "1, " * n + "2]}}",
    "mistral": lambda n: "[TOOL_CALLS]f[ARGS]" + '{"a": "' + "\\n" * n + '"}',
    "mistral_json": lambda n: '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}' + ", " * n,
    "kimi_k3": lambda n: ('<|open|>call tool="f"<|sep|><|open|>argument key="a"<|sep|>'
                          + "<|close|>argument<|sep|> <" * n),
    "harmony": lambda n: "<|channel|>commentary to=functions.f<|message|>{\"a\": " + "[" * 100
                         + "]" * 100 + "}" + " " * n + "x",
}


@pytest.mark.parametrize("fmt", sorted(HOSTILE))
def test_streaming_time_grows_linearly(fmt: str) -> None:
    """Fed 4 characters at a time: 8 times the text takes about 8 times as long."""
    small = min(_seconds(HOSTILE[fmt](5_000), fmt) for _ in range(3))
    big = min(_seconds(HOSTILE[fmt](40_000), fmt) for _ in range(2))
    assert big < 20 * small + 0.05, f"{fmt}: {small:.4f} s, 8x: {big:.4f} s"


def test_harmony_calls_start_where_the_scanner_starts_them() -> None:
    """Both orders of gpt-oss's header, with and without ``<|start|>assistant``: the
    opened call is the parse's (not sent a second time at the end)."""
    for text in (harmony._output("x") + HARMONY_SECOND,
                 harmony.MODEL_ORDER + " " + harmony.START + " to=functions.get_time"
                 "<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>"):
        _, calls, events, live = _stream("harmony", text, tools=TOOLS)
        assert [json.loads(a)["city"] for _, a in calls][-1] in ("Lyon", "Paris")
        assert sum(isinstance(e, CallStart) for e in events) == 2
        assert all(not isinstance(e, CallStart) for e in events[live:])
