"""The bare-JSON tool-call formats (colibri.server.tool_formats_json): Llama 3.1/3.2/3.3's
``{"name": ..., "parameters": ...}`` (and ``<|python_tag|>``), Mistral's ``[TOOL_CALLS]``
in its two spellings, checked against the real templates (llama.cpp's copies,
support.tokenizer_vectors.templates_dir): the calls a template renders parse back, whole
and streamed a character at a time; malformed calls stay text; a forced call's grammar
admits what the template writes and nothing else."""

from __future__ import annotations

from typing import Any

import pytest
from test_tool_stream import _stream, _whole

from colibri.chat.template import ChatTemplate
from colibri.server.tool_formats import template_format
from colibri.server.tools import forced_call_grammar, parse_calls
from support.grammar_bytes import accepts
from support.tokenizer_vectors import templates_dir

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "options": {"type": "object"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
CALLS = [{"name": "get_weather",
          "arguments": {"city": "Zürich \"centre\" [TOOL_CALLS] {\"name\": 1}", "days": 3,
                        "options": {"metric": True, "hours": [6, 12]}}},
         {"name": "get_time", "arguments": {"city": "Lyon"}}]
ASK = [{"role": "user", "content": "Weather and time in Zürich and Lyon?"}]
LLAMA = ("meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
         "meta-llama-Llama-3.3-70B-Instruct.jinja")
# template -> (format, the assistant turn's opening, its end, whether it writes the content
# beside the calls, whether it takes several calls)
TEMPLATES = {
    **{name: ("llama3_json", "<|start_header_id|>assistant<|end_header_id|>\n\n",
              "<|eot_id|>", False, False) for name in LLAMA},
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("mistral", "[/INST]", "</s>", False, True),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("mistral", "[/INST]", "</s>", True, True),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("mistral", "[/INST]", "</s>", True, True),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral_json", "[/INST]", "</s>", False,
                                                   True),
}


def _source(name: str) -> str:
    return (templates_dir() / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_template_names_its_format(name: str) -> None:
    assert template_format(_source(name)) == TEMPLATES[name][0]


def _turn(name: str, content: str, calls: list[dict[str, Any]], **variables: Any) -> str:
    _, opening, end, _, _ = TEMPLATES[name]
    tpl = ChatTemplate(_source(name), bos_token="<s>", eos_token="</s>")
    # Mistral's templates take ids of 9 letters and digits only.
    tc = [{"type": "function", "id": f"abcdefgh{i}", "function": c} for i, c in enumerate(calls)]
    text = tpl.render([*ASK, {"role": "assistant", "content": content, "tool_calls": tc}],
                      tools=TOOLS, add_generation_prompt=False, **variables)
    return text.rsplit(opening, 1)[1].split(end)[0]


def _pairs(calls: list[Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_calls_the_template_writes_parse_back(name: str) -> None:
    fmt, _, _, has_content, several = TEMPLATES[name]
    calls = CALLS if several else CALLS[:1]  # (Llama's templates take one call a turn)
    turn = _turn(name, "Let me look.", calls)
    content = "Let me look." if has_content else ""
    text, got = parse_calls(turn, "call_", fmt, TOOLS)
    assert text == content
    assert _pairs(got) == [(c["name"], c["arguments"]) for c in calls]
    if fmt == "mistral_json" or "Small-3.2" in name:  # the ids the template wrote
        assert [c.id for c in got] == [f"abcdefgh{i}" for i in range(len(calls))]
    elif fmt.startswith("mistral"):  # ids the template takes back: 9 letters and digits
        assert all(len(c.id) == 9 and c.id.isalnum() for c in got)
    content, calls_streamed = _stream(fmt, turn, tools=TOOLS)[:2]  # sends leading space
    assert (content.strip(), calls_streamed) == _whole(fmt, turn, tools=TOOLS)


def test_llama_builtin_tools_and_python_tag() -> None:
    """Llama 3.1's template writes a built-in tool's call as ``<|python_tag|>NAME.call(
    K="V")``; models also put ``<|python_tag|>`` before a JSON call."""
    name = LLAMA[0]
    call = {"name": "brave_search", "arguments": {"query": "weather in Lyon"}}
    turn = _turn(name, "", [call], builtin_tools=["brave_search", "wolfram_alpha"])
    assert turn.startswith('<|python_tag|>brave_search.call(query="weather in Lyon")')
    assert _pairs(parse_calls(turn, "call_", "llama3_json")[1]) == [
        ("brave_search", {"query": "weather in Lyon"})]
    two = '<|python_tag|>wolfram_alpha.call(query="2+2", mode="short")'
    assert _pairs(parse_calls(two, "call_", "llama3_json")[1]) == [
        ("wolfram_alpha", {"query": "2+2", "mode": "short"})]
    tagged = '<|python_tag|>{"name": "get_time", "parameters": {"city": "Lyon"}}'
    assert parse_calls(tagged, "call_", "llama3_json")[0] == ""
    typed = '{"type": "function", "name": "get_time", "arguments": {"city": "Lyon"}}'
    assert _pairs(parse_calls(typed, "call_", "llama3_json")[1]) == [
        ("get_time", {"city": "Lyon"})]


def test_llama_two_calls_and_text_around() -> None:
    one = '{"name": "get_time", "parameters": {"city": "Lyon"}}'
    text, calls = parse_calls(f"Sure.\n{one}\n{one}", "call_", "llama3_json")
    assert text == "Sure." and len(calls) == 2


MALFORMED = [
    ("llama3_json", '{"name": "get_time", "parameters": {"city": "Lyon"}'),  # never closed
    ("llama3_json", '{"name": "get_time", "parameters": [1]}'),
    ("llama3_json", '{"name": "get_time", "parameters": {"city": "Lyon"}, "extra": 1}'),
    ("llama3_json", '{"name": "get_time", "parameters": {city: Lyon}}'),
    ("llama3_json", '<|python_tag|>brave_search.call(query="x"'),
    ("mistral", '[TOOL_CALLS]get_time[ARGS]{"city": "Lyon"'),
    ("mistral", '[TOOL_CALLS]get_time{"city": "Lyon"}'),
    ("mistral", '[TOOL_CALLS][ARGS]{"city": "Lyon"}'),
    ("mistral", '[TOOL_CALLS]get_time[ARGS][1, 2]'),
    ("mistral_json", '[TOOL_CALLS][{"name": "get_time", "arguments": {"city": "Lyon"}}'),
    ("mistral_json", '[TOOL_CALLS][{"name": "get_time", "arguments": {}}, {"arguments": {}}]'),
    ("mistral_json", '[TOOL_CALLS]{"name": "get_time", "arguments": {}}'),
]


@pytest.mark.parametrize(("fmt", "text"), MALFORMED)
def test_a_malformed_call_stays_text(fmt: str, text: str) -> None:
    assert parse_calls("Sure. " + text, "call_", fmt, TOOLS) == ("Sure. " + text, [])
    # A call that opened and then broke stays opened in a stream; its text is content.
    assert _stream(fmt, "Sure. " + text, tools=TOOLS)[0] == "Sure. " + text


def test_mistral_reads_both_spellings_and_a_bad_call_beside_a_good_one() -> None:
    new = '[TOOL_CALLS]get_time[ARGS]{"city": "Lyon"}'
    old = '[TOOL_CALLS][{"name": "get_time", "arguments": "{\\"city\\": \\"Lyon\\"}"}]'
    for fmt in ("mistral", "mistral_json"):
        assert _pairs(parse_calls(new + old, "call_", fmt)[1]) == [
            ("get_time", {"city": "Lyon"})] * 2
    bad = "[TOOL_CALLS]get_weather[ARGS]{oops}"
    text, calls = parse_calls(new + bad + new, "call_", "mistral")
    assert len(calls) == 2 and text == bad


# --- forced calls: the grammar admits what the template writes ---------------------------

STRICT = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["C", "F"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit"]}}}
FORCED = {"name": "get_weather", "arguments": {"city": "Zürich \"centre\"", "unit": "C",
                                               "days": 3}}


@pytest.mark.parametrize("name", [LLAMA[0], "unsloth-mistral-Devstral-Small-2507.jinja",
                                  "mistralai-Mistral-Nemo-Instruct-2407.jinja"])
def test_the_forced_grammar_admits_the_templates_call(name: str) -> None:
    fmt = TEMPLATES[name][0]
    turn = _turn(name, "", [FORCED]).strip()
    if fmt == "mistral_json":  # the grammar leaves the id to the server
        turn = turn.replace(', "id": "abcdefgh0"', "")
    grammar = forced_call_grammar([STRICT, TIME], None, fmt)
    assert accepts(grammar, turn), turn
    assert _pairs(parse_calls(turn, "call_", fmt)[1]) == [(FORCED["name"], FORCED["arguments"])]
    assert not accepts(forced_call_grammar([STRICT, TIME], "get_time", fmt), turn)
    for garbage in ("Sure.", turn.replace("get_weather", "get_wether"),
                    turn.replace('"C"', '"K"'), turn.replace("3", "9"), turn[:-1]):
        assert not accepts(grammar, garbage), garbage
