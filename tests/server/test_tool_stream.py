"""Tool calls streamed as written (colibri.server.tool_stream), without a model: each
format's calls as its real template renders them (llama.cpp's copies), fed a character at
a time (and in other pieces), stream their arguments before the answer ends and settle to
exactly the non-streamed parse (the same calls, the same ``arguments`` strings, the same
content); malformed and unterminated calls stay text as they do whole; the arguments'
JSON is written as ``json.dumps`` writes it whatever the model's spacing; a format
without an incremental reader sends its calls whole at the end; the readers take linear
time on hostile text."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from colibri.chat.template import ChatTemplate
from colibri.server import tool_stream_readers
from colibri.server.tool_formats import FORMATS, deepseek_marker
from colibri.server.tool_json_echo import JsonEcho
from colibri.server.tool_stream import CallArgs, CallStart, StreamEvent, ToolStream
from colibri.server.tools import split_answer
from support.tokenizer_vectors import templates_dir

DS_CALLS, DS_CALLS_END = deepseek_marker("tool calls begin"), deepseek_marker("tool calls end")
DS_CALL, DS_CALL_END = deepseek_marker("tool call begin"), deepseek_marker("tool call end")
DS_SEP, DS_ASSISTANT = deepseek_marker("tool sep"), deepseek_marker("Assistant")
DS_EOS = deepseek_marker("end of sentence")
KIMI = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
        "<|tool_call_end|>", "<|tool_calls_section_end|>")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"},
                                     "days": {"type": "integer"}, "options": {"type": "object"}}}}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}}}}}]
CALLS = [{"name": "get_weather",
          "arguments": {"city": "Zürich \"centre\"\n", "zip": "8001", "days": 3,
                        "options": {"metric": True, "hours": [6, 12], "note": "a\\b/é"}}},
         {"name": "get_time", "arguments": {"city": "Lyon"}}]

# template -> (format, the assistant turn's start, its end)
TEMPLATES = {
    "GLM-4.6.jinja": ("glm", "<|assistant|>", None),
    "GLM-4.7-Flash.jinja": ("glm", "<|assistant|>", None),
    "moonshotai-Kimi-K2.jinja": ("kimi_k2", "<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek_v31", DS_ASSISTANT, DS_EOS),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("deepseek_v3", DS_ASSISTANT, DS_EOS),
    "llama-cpp-deepseek-r1.jinja": ("deepseek_v3", DS_ASSISTANT, DS_EOS),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("hermes", "<|im_start|>assistant\n", "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": ("hermes", "<|im_start|>assistant\n", "<|im_end|>"),
}


def _turn(name: str, content: str) -> str:
    """What the template renders for CALLS after `content`: the text the model writes."""
    fmt, start, end = TEMPLATES[name]
    tpl = ChatTemplate((templates_dir() / name).read_text(encoding="utf-8"),
                       bos_token="", eos_token="")
    msgs = [{"role": "user", "content": "Weather and time?"},
            {"role": "assistant", "content": content,
             "tool_calls": [{"type": "function", "id": f"call_{i}", "function": c}
                            for i, c in enumerate(CALLS)]}]
    text = tpl.render(msgs, add_generation_prompt=False)
    turn = text.split(start, 2)[1 if fmt.startswith("deepseek") else -1]
    if end is not None:
        turn = turn.split(end)[0]
    if "</think>" in turn:  # the (empty) reasoning the template writes first
        turn = turn.split("</think>", 1)[1]
    return turn


def _stream(fmt: str, text: str, step: int = 1, *, cut: bool = False, raw: bool = True,
            tools: Any = TOOLS) -> tuple[str, list[tuple[str, str]], list[StreamEvent], int]:
    """(the streamed content, the calls as (name, concatenated arguments), the events, how
    many came before finish)."""
    ts = ToolStream(fmt, tools)
    events: list[StreamEvent] = []
    for i in range(0, len(text), step):
        events += ts.feed(text[i:i + step])
    live = len(events)
    events += ts.finish(cut=cut, raw_without_calls=raw)
    calls: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, CallStart):
            assert e.index == len(calls) and e.id
            calls[e.index] = [e.name, ""]
        elif isinstance(e, CallArgs):
            calls[e.index][1] += e.text
    content = "".join(e for e in events if isinstance(e, str))
    return content, [(n, a) for n, a in calls.values()], events, live


def _whole(fmt: str, text: str, *, cut: bool = False, raw: bool = True,
           tools: Any = TOOLS) -> tuple[str, list[tuple[str, str]]]:
    """The non-streamed answer: (content, calls as (name, arguments string))."""
    content, calls, dropped = split_answer(text, fmt, tools, cut=cut)
    final = text if raw and not (calls or dropped) else content
    return final, [(c.name, c.openai()["function"]["arguments"]) for c in calls]


# (DeepSeek-R1's templates write calls only after an empty content.)
RENDERED = [(n, c) for n in sorted(TEMPLATES) for c in ("", "Let me look.")
            if c == "" or TEMPLATES[n][0] != "deepseek_v3"]


@pytest.mark.parametrize(("name", "content"), RENDERED)
def test_rendered_calls_stream_as_the_whole_parse(name: str, content: str) -> None:
    fmt = TEMPLATES[name][0]
    turn = _turn(name, content)
    want = _whole(fmt, turn)
    assert [n for n, _ in want[1]] == ["get_weather", "get_time"], turn  # two calls
    for step in (1, 2, 5, 64, len(turn)):
        got, calls, events, live = _stream(fmt, turn, step)
        assert calls == want[1], (step, turn)
        assert got.lstrip() == want[0] and got.strip() == want[0]
        if step < 64:  # both calls opened, and arguments sent, before the answer ended
            opened = [e for e in events[:live] if isinstance(e, CallStart)]
            assert [e.index for e in opened] == [0, 1]
            first = next(e for e in events[:live] if isinstance(e, CallArgs))
            assert first.text != want[1][0][1]  # a fragment, not the whole


def test_arguments_stream_fragment_by_fragment() -> None:
    """A long argument: many fragments, each a prefix of the final string; the call's first
    event (name, id) comes before any of its arguments."""
    long = "word " * 400
    text = ('Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"city": '
            + json.dumps(long) + ', "n": [1, 2.50, 1e3]}}\n</tool_call>')
    ts = ToolStream("hermes", TOOLS)
    events: list[StreamEvent] = []
    sent = ""
    for i in range(0, len(text), 3):
        for e in ts.feed(text[i:i + 3]):
            events.append(e)
            if isinstance(e, CallArgs):
                sent += e.text
                assert json.dumps({"city": long, "n": [1, 2.5, 1000.0]},
                                  ensure_ascii=False).startswith(sent)
    texts = [e for e in events if isinstance(e, str)]
    assert "".join(texts) == "Sure." and isinstance(events[len(texts)], CallStart)
    assert sum(isinstance(e, CallArgs) for e in events) > 100
    assert ts.finish() == [] and len(ts.calls) == 1
    assert sent == ts.calls[0].openai()["function"]["arguments"]


SPACINGS = ['{"city":"Lyon","days":3}', '{ "city" : "Lyon" ,\n\t"days" : 3 }',
            '{"city": "L\\u0079on", "days": 3, "x": [ ], "y": { }, "z": -0.0, "w": 1E2}',
            '{"s": "\\ud83d\\ude00 \\u0001 \\/ \\" \\\\"}', '{}']


@pytest.mark.parametrize("args", SPACINGS)
@pytest.mark.parametrize("fmt", ["hermes", "kimi_k2", "deepseek_v3", "deepseek_v31"])
def test_the_arguments_string_is_json_dumps_whatever_the_spacing(fmt: str, args: str) -> None:
    text = {"hermes": f'<tool_call>\n{{"name": "get_time", "arguments": {args}}}\n</tool_call>',
            "kimi_k2": f"{KIMI[0]}{KIMI[1]}functions.get_time:0{KIMI[2]}{args}{KIMI[3]}{KIMI[4]}",
            "deepseek_v3": f"{DS_CALLS}{DS_CALL}function{DS_SEP}get_time\n```json\n{args}\n```"
                           f"{DS_CALL_END}{DS_CALLS_END}",
            "deepseek_v31": f"{DS_CALLS}{DS_CALL}get_time{DS_SEP}{args}{DS_CALL_END}"
                            f"{DS_CALLS_END}"}[fmt]
    want = _whole(fmt, text)
    assert want[1] == [("get_time", json.dumps(json.loads(args), ensure_ascii=False))]
    assert _stream(fmt, text)[:2] == want


def test_glm_pairs_stream_as_json_as_each_ends() -> None:
    text = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Lyon</arg_value>\n"
            "<arg_key>zip</arg_key>\n<arg_value>69001</arg_value>\n<arg_key>days</arg_key>\n"
            "<arg_value>2</arg_value>\n</tool_call>")
    _, calls, events, _ = _stream("glm", text)
    assert [e.text for e in events if isinstance(e, CallArgs)] == [
        '{"city": "Lyon"', ', "zip": "69001"', ', "days": 2', "}"]  # zip: a string in the schema
    assert calls == _whole("glm", text)[1]


MALFORMED = [
    ("glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call>"),  # no value
    ("glm", "<tool_call>\n<arg_key>city</arg_key>\n<arg_value>x</arg_value>\n</tool_call>"),
    ("kimi_k2", f'{KIMI[0]}{KIMI[1]}functions.get_time:0{KIMI[2]}{{"city": {KIMI[3]}{KIMI[4]}'),
    ("kimi_k2", f"{KIMI[0]}{KIMI[1]}functions.get_time:0{KIMI[2]}[1, 2]{KIMI[3]}{KIMI[4]}"),
    ("deepseek_v3", f"{DS_CALLS}{DS_CALL}function{DS_SEP}get_time\n```json\n{{city: Lyon}}\n"
                    f"```{DS_CALL_END}{DS_CALLS_END}"),
    ("deepseek_v31", f'{DS_CALLS}{DS_CALL}get_time{DS_SEP}{{"city"}}{DS_CALL_END}{DS_CALLS_END}'),
    ("deepseek_v31", f'{DS_CALLS}{DS_CALL}{DS_SEP}{{"city": "Lyon"}}{DS_CALL_END}'),
    ("hermes", '<tool_call>{"x": 1}</tool_call>'),  # no name
    ("hermes", '<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>'),
    ("hermes", '<tool_call>{"name": "get_time", "arguments": {"city"}}</tool_call>'),
    # Unterminated before the first argument's value: the model stopped there.
    ("hermes", '<tool_call>{"name": "get_time", "arguments": {"city": '),
    ("glm", "<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>Lyo"),
    ("deepseek_v31", f"{DS_CALLS}{DS_CALL}get_time{DS_SEP}"),
]


@pytest.mark.parametrize(("fmt", "text"), MALFORMED)
def test_malformed_and_unterminated_calls_stay_text_as_whole(fmt: str, text: str) -> None:
    for cut in (False, True):
        for raw in (False, True):
            whole = _whole(fmt, "Sure. " + text, cut=cut, raw=raw)
            assert whole[1] == []
            for step in (1, 4, 1000):
                content, calls, events, _ = _stream(fmt, "Sure. " + text, step, cut=cut, raw=raw)
                assert (content, calls) == whole
                assert not any(isinstance(e, CallStart) for e in events)


def test_a_call_that_breaks_after_it_opened() -> None:
    """The one case the stream cannot take back: its arguments began, then went bad (or
    the output ended inside them). The opened call keeps the arguments sent (a JSON
    prefix); the content is the non-streamed content (the call's text included); the
    non-streamed answer has no call."""
    text = 'Sure. <tool_call>{"name": "get_time", "arguments": {"city": "Ly<oops>'
    for cut in (False, True):
        whole = _whole("hermes", text, cut=cut)
        content, calls, _, _ = _stream("hermes", text, cut=cut)
        assert whole[1] == [] and content == whole[0]
        assert calls == [("get_time", '{"city": "Ly<oops>')]


def test_a_format_without_a_reader_sends_calls_whole_at_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(tool_stream_readers.READERS, "deepseek_v31")
    turn = _turn("deepseek-ai-DeepSeek-V3.1.jinja", "Let me look.")
    content, calls, events, live = _stream("deepseek_v31", turn)
    assert (content, calls) == _whole("deepseek_v31", turn)
    assert all(isinstance(e, str) for e in events[:live])  # nothing of the calls live


def test_calls_after_text_and_text_after_calls() -> None:
    text = ('A <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call> middle '
            '<tool_call>{"name": "g", "arguments": {}}</tool_call>  ')
    assert _stream("hermes", text)[:2] == _whole("hermes", text) == (
        "A  middle", [("f", '{"a": 1}'), ("g", "{}")])


# (the other readers' formats: test_tool_stream_formats.py)
@pytest.mark.parametrize("fmt", ["deepseek_v3", "deepseek_v31", "glm", "hermes", "kimi_k2"])
def test_fuzzed_calls_agree_with_the_whole_parse(fmt: str) -> None:
    """Seeded good calls, some with a piece of a marker or JSON spliced in: the stream's
    content and calls are the whole parse's, but for calls that opened and then broke
    (test_a_call_that_breaks_after_it_opened); never an error."""
    rng = random.Random(f"tool-stream-{fmt}")
    pieces = {"hermes": ["<tool_call>", "</tool_call>", "}", '"', ","],
              "glm": ["<tool_call>", "</tool_call>", "<arg_key>", "</arg_value>", "x"],
              "kimi_k2": [*KIMI, "}", ":"],
              "deepseek_v3": [DS_CALLS, DS_CALL, DS_SEP, DS_CALL_END, "```", "}"],
              "deepseek_v31": [DS_CALLS, DS_CALL, DS_SEP, DS_CALL_END, "}"]}[fmt]
    name = {"hermes": "Qwen-Qwen2.5-7B-Instruct.jinja", "glm": "GLM-4.6.jinja",
            "kimi_k2": "moonshotai-Kimi-K2.jinja",
            "deepseek_v3": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
            "deepseek_v31": "deepseek-ai-DeepSeek-V3.1.jinja"}[fmt]
    turns = [_turn(name, c) for n, c in RENDERED if n == name]
    broke = 0
    for _ in range(300):
        text = rng.choice(turns) * rng.randint(1, 3)
        if rng.random() < 0.6:
            i = rng.randrange(len(text))
            text = text[:i] + rng.choice(pieces) + text[i + rng.randint(0, 4):]
        cut, raw = rng.random() < 0.3, rng.random() < 0.5
        content, calls = _stream(fmt, text, rng.choice([1, 3, 7]), cut=cut, raw=raw)[:2]
        want = _whole(fmt, text, cut=cut, raw=raw)
        assert content.lstrip() == want[0].lstrip() and content.strip() == want[0], text
        if calls != want[1]:
            assert len(calls) > len(want[1]), text  # only calls that opened, then broke
            broke += 1
    assert broke < 100


@pytest.mark.parametrize("text", ['{"a": [1, {"b": null}], "c": "\\u00e9"}', '{"a": 01}',
                                  '{"a": tru}', '{"a" 1}', '[1]', '{"a": "\\x"}', '{"a": 1,}',
                                  '{"a": NaN, "b": -Infinity}', '{"a": "\x01"}', '{"a": 1e400}'])
def test_json_echo_reads_what_json_loads_reads(text: str) -> None:
    echo = JsonEcho()
    out = []
    for ch in text:
        echo.feed(ch)
        out.append(echo.take())
        if echo.done or echo.failed:
            break
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        assert echo.done and "".join(out) == json.dumps(value, ensure_ascii=False)
    else:
        assert echo.failed


def _seconds(text: str, fmt: str) -> float:
    t = time.perf_counter()
    ts = ToolStream(fmt, TOOLS)
    for i in range(0, len(text), 4):
        ts.feed(text[i:i + 4])
    ts.finish()
    return time.perf_counter() - t


HOSTILE = {
    "hermes": lambda n: '<tool_call>{"name": "f", "arguments": {"a": "' + "x\\n" * n + '"}}',
    "glm": lambda n: "<tool_call>f<arg_key>a</arg_key><arg_value>" + "</arg_value>x" * n,
    "kimi_k2": lambda n: f"{KIMI[1]}f{KIMI[2]}" + '{"a": [' + "1, " * n + "2]}",
    "deepseek_v3": lambda n: (f"{DS_CALL}function{DS_SEP}f\n```json\n" + '{"a": ' + "[" * 100
                              + "]" * 100 + "}\n```" + " " * n + "x"),
    "deepseek_v31": lambda n: f"{DS_CALL}f" + " " * n + "x",
}


@pytest.mark.parametrize("fmt", sorted(HOSTILE))
def test_streaming_time_grows_linearly(fmt: str) -> None:
    """Fed 4 characters at a time: 8 times the text takes about 8 times as long (a
    reader that rescanned what it holds would take 64 times)."""
    small = min(_seconds(HOSTILE[fmt](5_000), fmt) for _ in range(3))
    big = min(_seconds(HOSTILE[fmt](40_000), fmt) for _ in range(2))
    assert big < 20 * small + 0.05, f"{fmt}: {small:.4f} s, 8x: {big:.4f} s"
    assert set(FORMATS) >= set(HOSTILE)


@pytest.mark.parametrize("args", ['{"city": "\\ud800"}', '{"city": "a\\udc00b"}',
                                  '{"city": "\\ud800\\u0041"}', '{"\\ud800": 1}'])
def test_lone_surrogates_are_not_returned(args: str) -> None:
    """json.loads keeps a lone surrogate escape, but no UTF-8 answer can hold one: the call
    is not read (the text, whose escape is plain ASCII, stays), streamed or not, and
    everything sent encodes (a 500 at serialization before)."""
    text = '<tool_call>{"name": "get_weather", "arguments": ' + args + "}</tool_call>"
    content, calls = _whole("hermes", text)
    assert calls == [] and content == text
    streamed, scalls, events, _ = _stream("hermes", text)
    streamed.encode("utf-8")
    for e in events:
        piece = e if isinstance(e, str) else getattr(e, "text", getattr(e, "name", ""))
        piece.encode("utf-8")
    assert all("\ud800" not in a and "\udc00" not in a for _, a in scalls)
    paired = text.replace(args, '{"city": "\\ud83d\\ude00"}')  # a real pair still reads
    assert _whole("hermes", paired)[1] == [("get_weather", '{"city": "\U0001f600"}')]
