"""The tool-call parsers (colibri.server.tool_formats) on hostile text: the model's output
is untrusted, and the parsers run in the server. Each format's parse takes time linear in
the text (GLM's parser was an exponentially backtracking regex: 16 argument pairs and one
trailing character took 7.6 s, 18 took 44.7 s), a seeded fuzz of each format's markers and
junk never raises and never takes long, and JSON nested past the depth bound is text,
never a RecursionError."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from colibri.server.tool_formats import FORMATS, MAX_JSON_DEPTH, ToolCall, deepseek_marker
from colibri.server.tool_formats_xml import DSML
from colibri.server.tool_stream import ToolStream
from colibri.server.tools import parse_calls

PAIR = "<arg_key>a</arg_key><arg_value>b</arg_value>"
DS = {w: deepseek_marker(w) for w in ("tool calls begin", "tool calls end", "tool call begin",
                                      "tool call end", "tool sep")}
KIMI = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_call_end|>")
JUNK = ("x", " ", "\n", "\t", "f", "functions.", "get.weather-2", ":", "0", "{", "}", "[", "]",
        '"', "\\", ",", '{"a": 1}', '"name": "f"', '"arguments": {}', "json", "`", "```", "<",
        ">", "/", "</", "\u00e9", "\u2581", "\uff5c", "<|", "|>")
MARKERS: dict[str, tuple[str, ...]] = {
    "glm": ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
            "</arg_value>"),
    "hermes": ("<tool_call>", "</tool_call>", '{"name": "f", "arguments": {"a": [1]}}'),
    "kimi_k2": KIMI,
    "deepseek_v3": (*DS.values(), "function", "```json\n", "\n```"),
    "deepseek_v31": tuple(DS.values()),
    "qwen3_coder": ("<tool_call>", "</tool_call>", "<function=f>", "<function=", "</function>",
                    "<parameter=a>", "<parameter=b>", "</parameter>", "\n", "true", "12"),
    "minimax_m2": ("<minimax:tool_call>", "</minimax:tool_call>", '<invoke name="f">',
                   '<invoke name="', "</invoke>", '<parameter name="a">', '<parameter name="b">',
                   "</parameter>", "12"),
    **{fmt: (f"<{DSML}{wrapper}>", f"</{DSML}{wrapper}>", f'<{DSML}invoke name="f">',
             f'<{DSML}invoke name="', f"</{DSML}invoke>", f'<{DSML}parameter name="a"',
             f'<{DSML}parameter name="b"', ' string="true">', ' string="false">', ">",
             f"</{DSML}parameter>", "12")
       for fmt, wrapper in (("deepseek_v32", "function_calls"), ("deepseek_v4", "tool_calls"))},
    "kimi_k3": ("<|open|>tools<|sep|>", "<|close|>tools<|sep|>", '<|open|>call tool="f"',
                '<|open|>call tool="', ' index="1"', "<|sep|>", "<|close|>call<|sep|>",
                '<|open|>argument key="a"', '<|open|>argument key="b"', ' type="string"',
                ' type="number"', "<|close|>argument<|sep|>", "12", "&quot;"),
    "llama3_json": ('{"name": "f", "parameters": ', '{"name": "f", "arguments": {"a": 1}}',
                    '"type": "function", ', "<|python_tag|>", "f.call(", 'a="x"', ")", "}",
                    '{"name"', '{ "type"'),
    "mistral": ("[TOOL_CALLS]", "f", "[ARGS]", "[CALL_ID]", "abc123xyz", '{"a": 1}',
                '[{"name": "f", "arguments": {}}]'),
    "mistral_json": ("[TOOL_CALLS][", '{"name": "f", "arguments": {"a": 1}, "id": "x"}', "]",
                     ", ", "[TOOL_CALLS]", "f[ARGS]"),
    "harmony": ("<|start|>assistant", "<|channel|>commentary ", "to=functions.f", " json",
                "<|constrain|>json", "<|message|>", '{"a": 1}', "<|call|>", "<|end|>"),
}


def _seconds(f: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


@pytest.mark.parametrize("pairs", [16, 18, 24, 32, 40])
def test_glm_pairs_then_text_is_fast(pairs: int) -> None:
    text = "<tool_call>f\n" + PAIR * pairs + "x"
    took = _seconds(lambda: parse_calls(text, "call_", "glm"))
    assert took < 0.1, f"{pairs} pairs: {took:.3f} s"
    assert parse_calls(text, "call_", "glm") == (text, [])  # not a call: it stays text


def test_glm_time_grows_linearly() -> None:
    def run(n: int) -> float:
        text = "<tool_call>f\n" + PAIR * n + "x"
        return _seconds(lambda: parse_calls(text, "call_", "glm"))
    small, big = run(2_000), run(8_000)
    assert big < 10 * small + 0.05, f"2,000 pairs {small:.4f} s, 8,000 pairs {big:.4f} s"
    assert big < 1.0


# Texts that made a backtracking or rescanning parser slow: long whitespace runs before a
# missing end, many starts that fail late, many fences none of which closes.
HOSTILE: dict[str, list[str]] = {
    "glm": ["<tool_call>f <arg_key>" * 20_000 + "</arg_key>",
            "<tool_call>f\n<arg_key>a</arg_key><arg_value><tool_call>g\n" * 20_000 + "x",
            "<tool_call>f\n" + "<arg_key>a</arg_key>" * 20_000 + "x"],
    "hermes": ["<tool_call>" + " " * 200_000 + "x", "<tool_call>" * 50_000],
    "kimi_k2": [KIMI[2] + "f" + KIMI[3] + " " * 200_000 + "x", (KIMI[2] + "f:1 ") * 30_000],
    "deepseek_v3": [(DS["tool call begin"] + DS["tool sep"] + "f```json {} ```x") * 20_000,
                    DS["tool call begin"] + DS["tool sep"] + "f```" + "``` x" * 50_000],
    "deepseek_v31": [DS["tool call begin"] + "f" + DS["tool sep"] + " " * 200_000 + "x",
                     (DS["tool call begin"] + "f ") * 30_000],
    "qwen3_coder": ["<tool_call><function=f>" + "<parameter=a>x</parameter>" * 20_000 + "x",
                    "<function=f>\n<parameter=" * 20_000 + "</parameter>",
                    "<function=f><parameter=a>" + "</parameter> x" * 50_000,
                    "<tool_call>" + " " * 200_000 + "<function=f></function>",
                    "<parameter=a>x</parameter>" * 20_000 + "<function=f>" * 20_000,
                    "<function=" + "f" * 200_000],
    "minimax_m2": ['<invoke name="f">' + '<parameter name="a">x</parameter>' * 20_000 + "x",
                   '<invoke name="f"><parameter name="' * 20_000 + "</parameter>",
                   '<invoke name="f"><parameter name="a">' + "</parameter> x" * 50_000],
    **{fmt: [f'<{DSML}invoke name="f">' + f'<{DSML}parameter name="a" string="true">x'
             f"</{DSML}parameter>" * 20_000 + "x",
             f'<{DSML}invoke name="f"><{DSML}parameter name="' * 20_000 + f"</{DSML}parameter>",
             f'<{DSML}invoke name="f"><{DSML}parameter name="a">' + f"</{DSML}parameter> x"
             * 50_000] for fmt in ("deepseek_v32", "deepseek_v4")},
    "kimi_k3": ['<|open|>call tool="f"<|sep|>' + '<|open|>argument key="a"<|sep|>x'
                '<|close|>argument<|sep|>' * 20_000 + "x",
                '<|open|>call tool="f"<|sep|><|open|>argument key="' * 20_000 + "<|sep|>",
                '<|open|>call tool="f" index="1"<|sep|><|open|>argument key="a" type="string"'
                '<|sep|>' + "<|close|>argument<|sep|> x" * 50_000,
                '<|open|>call tool="' + '"' * 200_000],
    "llama3_json": ['{"name": "f", "parameters": {"a": "' * 20_000,
                    '{"name": "f", "parameters": [' * 20_000,
                    '{"name": "' * 50_000, "<|python_tag|>{" * 50_000,
                    '<|python_tag|>f.call(a="x", ' * 20_000, "{" * 200_000 + '"name": "'],
    "mistral": ['[TOOL_CALLS]f[ARGS]{"a": [' * 20_000, "[TOOL_CALLS]f[CALL_ID]" * 30_000,
                "[TOOL_CALLS][" * 50_000, '[TOOL_CALLS]f[ARGS]{"a": "' + "[TOOL_CALLS]" * 50_000],
    "mistral_json": ['[TOOL_CALLS][{"name": "f", "arguments": {' * 20_000,
                     "[TOOL_CALLS][" + "[" * 200_000],
    "harmony": ['to=functions.f<|message|>{"a": "' * 20_000,
                'to=functions.f<|message|>{"a": [' * 20_000,
                "to=functions.f json<|message|>{" + " " * 200_000 + "<|call|>" * 10_000,
                "<|channel|>commentary to=functions." * 30_000],
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_hostile_texts_parse_quickly(fmt: str) -> None:
    for text in HOSTILE[fmt]:
        took = _seconds(lambda t=text: parse_calls(t, "call_", fmt), repeat=1)  # type: ignore[misc]
        assert took < 1.0, f"{fmt}: {len(text)} characters took {took:.2f} s"


def _check(rest: object, calls: object) -> None:
    assert isinstance(rest, str) and isinstance(calls, list)
    assert all(isinstance(c, ToolCall) and isinstance(c.arguments, dict) for c in calls)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_fuzzed_markers_and_junk(fmt: str) -> None:
    """Seeded mixes of the format's markers and junk: every parse returns (text, calls),
    whole and streamed, each within a time bound."""
    rng = random.Random(f"tool-fuzz-{fmt}")
    pieces = MARKERS[fmt] + JUNK
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}}}]
    worst = 0.0
    for case in range(3_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        if case % 50 == 0:  # now and then a long one
            text *= rng.randint(50, 400)
        t = time.perf_counter()
        _check(*parse_calls(text, "call_", fmt, tools if case % 2 else None))
        stream = ToolStream(fmt, tools)
        for i in range(0, len(text), 7):
            stream.feed(text[i:i + 7])
        stream.finish(cut=bool(case % 3))
        _check("", stream.calls)
        worst = max(worst, time.perf_counter() - t)
    assert worst < 0.5, f"{fmt}: the slowest case took {worst:.3f} s"


DEEP = "[" * 100_000


@pytest.mark.parametrize(("fmt", "text"), [
    ("hermes", "<tool_call>" + DEEP),
    ("hermes", '<tool_call>{"name": "f", "arguments": ' + DEEP + "]" * 100_000 + "}</tool_call>"),
    ("hermes", '<tool_call>{"name": "f", "arguments": "' + DEEP + '"}</tool_call>'),
    ("glm", "<tool_call>f\n<arg_key>b</arg_key><arg_value>" + DEEP + "</arg_value></tool_call>"),
    ("kimi_k2", KIMI[2] + "functions.f:0" + KIMI[3] + '{"a": ' + DEEP + KIMI[4]),
    ("deepseek_v3", DS["tool call begin"] + "function" + DS["tool sep"] + "f\n```json\n"
     + '{"a": ' + DEEP + "\n```" + DS["tool call end"]),
    ("deepseek_v31", DS["tool call begin"] + "f" + DS["tool sep"] + '{"a": ' + DEEP
     + DS["tool call end"]),
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=b>\n" + DEEP + "\n</parameter>\n"
     "</function>\n</tool_call>"),
    ("minimax_m2", '<invoke name="f"><parameter name="b">' + DEEP + "</parameter></invoke>"),
    ("deepseek_v32", f'<{DSML}invoke name="f"><{DSML}parameter name="b" string="false">' + DEEP
     + f"</{DSML}parameter></{DSML}invoke>"),
    ("llama3_json", '{"name": "f", "parameters": {"a": ' + DEEP + "]" * 100_000 + "}}"),
    ("mistral", '[TOOL_CALLS]f[ARGS]{"a": ' + DEEP + "]" * 100_000 + "}"),
    ("mistral_json", '[TOOL_CALLS][{"name": "f", "arguments": ' + DEEP + "]" * 100_000 + "}]"),
    ("harmony", '<|channel|>commentary to=functions.f json<|message|>{"a": ' + DEEP
     + "]" * 100_000 + "}<|call|>"),
])
def test_deeply_nested_json_is_text(fmt: str, text: str) -> None:
    rest, calls = parse_calls(text, "call_", fmt)
    if fmt in ("glm", "qwen3_coder", "minimax_m2", "deepseek_v32"):  # a value not JSON: text
        assert calls[0].arguments == {"b": DEEP}
    else:
        assert calls == [] and rest == text.strip()


def test_json_at_the_depth_bound_still_parses() -> None:
    args = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    text = '<tool_call>{"name": "f", "arguments": {"a": ' + args[2:-2] + "}}</tool_call>"
    _, calls = parse_calls(text, "call_", "hermes")
    assert len(calls) == 1
    # Brackets inside a string do not count.
    text = '<tool_call>{"name": "f", "arguments": {"a": "' + DEEP + '"}}</tool_call>'
    _, calls = parse_calls(text, "call_", "hermes")
    assert calls[0].arguments == {"a": DEEP}
