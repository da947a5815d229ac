"""The tool-call formats of GLM-4.5/4.6, DeepSeek-V3/R1, DeepSeek-V3.1 and Kimi-K2
(colibri.server.tool_formats), checked against the real chat templates (llama.cpp's
copies): what a template renders for an assistant's tool calls is the text the model was
trained to write, so it must parse back to those calls (names, arguments as JSON, the
content outside them), whole and streamed a character at a time. Malformed calls stay in
the text. The table picks each family's format from its template's source. Forced calls
(each format's grammar) parse back and match the schema; SmolLM2 served with GLM-4.6's,
Kimi-K2's and Qwen3-Coder's templates answers the openai client with tool_calls."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from test_tool_stream import _stream, _whole

import colibri as co
from colibri.chat.template import ChatTemplate
from colibri.server.tool_formats import FORMATS, deepseek_marker, template_format
from colibri.server.tool_stream import ToolStream
from colibri.server.tools import forced_call_grammar, parse_calls
from support.realmodel import smollm2_gguf
from support.server_helpers import ServerProcess
from support.tokenizer_vectors import templates_dir

DS_CALLS, DS_CALLS_END = deepseek_marker("tool calls begin"), deepseek_marker("tool calls end")
DS_CALL, DS_CALL_END = deepseek_marker("tool call begin"), deepseek_marker("tool call end")
DS_SEP, DS_ASSISTANT = deepseek_marker("tool sep"), deepseek_marker("Assistant")
DS_EOS = deepseek_marker("end of sentence")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "zip": {"type": "string"}, "days": {"type": "integer"},
        "options": {"type": "object"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
CALLS = [{"name": "get_weather",
          "arguments": {"city": "Zürich \"centre\"", "zip": "8001", "days": 3,
                        "options": {"metric": True, "hours": [6, 12]}}},
         {"name": "get_time", "arguments": {"city": "Lyon"}}]
ASK = [{"role": "user", "content": "Weather and time in Zürich and Lyon?"}]

# template file -> the format it asks for (None: tools rendered, calls not parsed)
DETECTED = {
    "GLM-4.6.jinja": "glm", "GLM-4.7-Flash.jinja": "glm",
    "moonshotai-Kimi-K2.jinja": "kimi_k2", "Kimi-K2-Instruct.jinja": "kimi_k2",
    "Kimi-K2-Thinking.jinja": "kimi_k2",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek_v31",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek_v3",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "deepseek_v3",
    "llama-cpp-deepseek-r1.jinja": "deepseek_v3",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes", "Qwen-Qwen3-0.6B.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3_coder", "Qwen3.5-4B.jinja": "qwen3_coder",
    "MiniMax-M2.jinja": "minimax_m2",  # (both: tests/server/test_tool_formats_xml.py)
    "MiniMax-M3.jinja": None,  # (its tags carry a prefix: not hermes's <tool_call>)
    "deepseek-ai-DeepSeek-V3.2.jinja": "deepseek_v32",
    "deepseek-ai-DeepSeek-V4.jinja": "deepseek_v4",  # (DSML: test_tool_formats_dsml.py)
    "Kimi-K3.jinja": "kimi_k3",  # (test_tool_formats_kimi_k3.py)
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3_json",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral_json",
    # (these three: tests/server/test_tool_formats_json.py)
    "openai-gpt-oss-120b.jinja": "harmony",  # (tests/server/test_tool_formats_harmony.py)
}


def _source(name: str) -> str:
    return (templates_dir() / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(DETECTED))
def test_the_template_names_its_format(name: str) -> None:
    assert template_format(_source(name)) == DETECTED[name]


def _turn(name: str, content: str) -> str:
    """The assistant turn a template renders for CALLS after `content` (the text the
    model would have written), cut at the template's end-of-turn marker."""
    tpl = ChatTemplate(_source(name), bos_token="", eos_token="")
    tc: list[dict[str, Any]] = [{"type": "function", "id": f"call_{i}", "function": c}
                                for i, c in enumerate(CALLS)]
    msgs = [*ASK, {"role": "assistant", "content": content, "tool_calls": tc}]
    # (No tools: the turn does not depend on them, and llama.cpp's R1 template lists them
    # with `map | tojson`, which transformers' renderer, and so colibri's, refuses.)
    text = tpl.render(msgs, add_generation_prompt=False)
    fmt = DETECTED[name]
    if fmt == "glm":
        turn = text.rsplit("<|assistant|>", 1)[1]
        return turn.split("</think>", 1)[1]  # the model's (empty) reasoning, then the text
    if fmt == "kimi_k2":
        return text.rsplit("<|im_assistant|>assistant<|im_middle|>", 1)[1].split("<|im_end|>")[0]
    # The first assistant turn (R1's templates render an empty one after the calls).
    turn = text.split(DS_ASSISTANT, 1)[1].split(DS_EOS)[0]
    return turn.removeprefix("<think></think>")


RENDERED = [("GLM-4.6.jinja", "Let me look."), ("GLM-4.7-Flash.jinja", "Let me look."),
            ("moonshotai-Kimi-K2.jinja", "Let me look."),  # (Kimi-K2-Instruct's calls
            # list.append, which colibri's template sandbox refuses)
            ("deepseek-ai-DeepSeek-V3.1.jinja", "Let me look."),
            ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ""),
            # (R1-Distill-Llama-8B's renders calls only for a None content, with the
            # arguments as JSON text: the same format, not rendered here)
            ("llama-cpp-deepseek-r1.jinja", "")]


@pytest.mark.parametrize(("name", "content"), RENDERED)
def test_calls_the_template_writes_parse_back(name: str, content: str) -> None:
    fmt = DETECTED[name]
    assert fmt is not None
    turn = _turn(name, content)
    text, calls = parse_calls(turn, "call_", fmt, TOOLS)
    assert text == content
    assert [(c.name, c.arguments) for c in calls] == [(c["name"], c["arguments"])
                                                      for c in CALLS]
    for c in calls:  # arguments go out as OpenAI's JSON text
        assert json.loads(c.openai()["function"]["arguments"]) == c.arguments
    if fmt == "kimi_k2":  # the ids Kimi's template writes back into the conversation
        assert [c.id for c in calls] == ["functions.get_weather:0", "functions.get_time:1"]
    else:
        assert all(c.id.startswith("call_") for c in calls)
    # Streamed a character at a time: the same content first, the same calls at the end.
    content, calls_streamed = _stream(fmt, turn, tools=TOOLS)[:2]  # sends leading space
    assert (content.strip(), calls_streamed) == _whole(fmt, turn, tools=TOOLS)


def test_glm_values_follow_the_schema() -> None:
    """GLM writes strings bare and everything else as JSON: a string parameter stays a
    string even when it looks like a number; without the tools, JSON wins."""
    turn = _turn("GLM-4.6.jinja", "")
    assert "<arg_value>8001</arg_value>" in turn and "<arg_value>3</arg_value>" in turn
    _, (call, _) = parse_calls(turn, "call_", "glm", TOOLS)
    assert call.arguments["zip"] == "8001" and call.arguments["days"] == 3
    _, (call, _) = parse_calls(turn, "call_", "glm", None)
    assert call.arguments["zip"] == 8001 and call.arguments["city"] == "Zürich \"centre\""


def _kimi(body: str) -> str:
    return ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
            f"<|tool_call_argument_begin|>{body}<|tool_call_end|><|tool_calls_section_end|>")


MALFORMED = [
    ("glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n</tool_call>"),  # no value
    ("glm", "<tool_call>\n<arg_key>city</arg_key>\n<arg_value>x</arg_value>\n</tool_call>"),
    ("kimi_k2", _kimi('{"city": ')),
    ("kimi_k2", _kimi("[1, 2]")),  # not an object
    ("deepseek_v3", f"{DS_CALLS}{DS_CALL}function{DS_SEP}get_time\n```json\n{{city: Lyon}}\n"
                    f"```{DS_CALL_END}{DS_CALLS_END}"),
    ("deepseek_v31", f"{DS_CALLS}{DS_CALL}get_time{DS_SEP}{{\"city\"}}{DS_CALL_END}"
                     f"{DS_CALLS_END}"),
    ("deepseek_v31", f"{DS_CALLS}{DS_CALL}{DS_SEP}{{\"city\": \"Lyon\"}}{DS_CALL_END}"),
]


@pytest.mark.parametrize(("fmt", "text"), MALFORMED)
def test_a_malformed_call_stays_text(fmt: str, text: str) -> None:
    assert parse_calls("Sure. " + text, "call_", fmt, TOOLS) == ("Sure. " + text, [])
    # A call that opened and then broke stays opened in a stream; its text is content.
    assert _stream(fmt, "Sure. " + text, tools=TOOLS)[0] == "Sure. " + text


def test_one_bad_call_beside_a_good_one() -> None:
    good = f'{DS_CALL}get_time{DS_SEP}{{"city": "Lyon"}}{DS_CALL_END}'
    bad = f"{DS_CALL}get_weather{DS_SEP}{{oops{DS_CALL_END}"
    text, calls = parse_calls(f"{DS_CALLS}{bad}{good}{DS_CALLS_END}", "call_", "deepseek_v31")
    assert [(c.name, c.arguments) for c in calls] == [("get_time", {"city": "Lyon"})]
    assert text == bad  # the section's wrapper goes, the bad call stays


@pytest.mark.parametrize(("fmt", "text"), [
    ("deepseek_v31", f'{DS_CALLS}{DS_CALL}get_time{DS_SEP}{{"city": "Lyon"}}'),
    ("deepseek_v3", f'{DS_CALLS}{DS_CALL}function{DS_SEP}get_time\n```json\n{{"city": "Lyon"}}'
                    "\n```"),
    ("kimi_k2", '<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0'
                '<|tool_call_argument_begin|>{"city": "Lyon"}'),
    ("glm", "<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>Lyon</arg_value>\n"),
])
def test_an_unterminated_last_call_with_complete_arguments_parses(fmt: str, text: str) -> None:
    """The model stopped (EOS, max_tokens) before the closing markers."""
    rest, calls = parse_calls(text, "call_", fmt, TOOLS)
    assert rest == "" and [(c.name, c.arguments) for c in calls] == [("get_time",
                                                                      {"city": "Lyon"})]


def test_text_that_only_starts_like_a_marker_streams() -> None:
    ts = ToolStream("kimi_k2")
    assert ts.feed("a <|tool_c") == ["a"] and ts.feed("ontinue|> b") == [" <|tool_continue|> b"]
    ts = ToolStream("deepseek_v31")
    assert ts.feed("x " + DS_CALLS[:3]) == ["x"] and ts.feed("!") == [" " + DS_CALLS[:3] + "!"]



def test_every_format_has_a_template() -> None:
    assert set(FORMATS) == {f for f in DETECTED.values() if f is not None}


def test_templates_dir_holds_them() -> None:
    assert all(Path(templates_dir() / n).is_file() for n in DETECTED)


# --- forced calls (tool_choice "required" / named), and through the server -------------

@pytest.fixture(scope="module")
def smollm2() -> Iterator[co.Model]:
    with co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=1024)) as m:
        yield m


STRICT = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "unit", "days"], "additionalProperties": False}}}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_forced_call_parses_and_matches_the_schema(smollm2: co.Model, fmt: str) -> None:
    """Greedy SmolLM2 under each format's grammar writes one call that the format's parser
    reads back, its arguments valid against the function's schema."""
    # The wording is SmolLM2's near-tie to win: with session 27's AVX-512 Q4_1 / Q8_0
    # arithmetic, "Weather in Paris?" under hermes wrote the call, then whitespace to the
    # token limit; this prompt ends every format's call (before and after that change).
    ids = smollm2.encode_prompt(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    g = smollm2.generate(ids, max_tokens=192,
                         response_format=forced_call_grammar([STRICT, TIME], "get_weather", fmt))
    assert g.finish_reason == "stop", g.text
    text, calls = parse_calls(g.text, "call_", fmt, [STRICT, TIME])
    assert text == "" and len(calls) == 1, g.text
    assert calls[0].name == "get_weather"
    jsonschema.validate(calls[0].arguments, STRICT["function"]["parameters"])


@pytest.fixture(scope="module", params=["GLM-4.6.jinja", "moonshotai-Kimi-K2.jinja",
                                        "Qwen3-Coder.jinja"])
def tool_server(request: pytest.FixtureRequest) -> Iterator[tuple[ServerProcess, str]]:
    name = request.param
    s = ServerProcess(smollm2_gguf(), "-c", "1024", "--chat-template",
                      str(templates_dir() / name), "--served-model-name", "smollm2-tools",
                      "-q")
    yield s, name
    assert s.stop() == 0, s.log()


def test_the_server_answers_calls_in_the_template_format(
        tool_server: tuple[ServerProcess, str], smollm2: co.Model) -> None:
    """SmolLM2 served with GLM-4.6's, Kimi-K2's or Qwen3-Coder's template: a forced call
    comes back as `tool_calls` (whole and streamed); an auto answer is the parse of what
    the Python API generates on the same prompt."""
    server, name = tool_server
    fmt = DETECTED[name]
    assert fmt is not None
    client = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=300)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw: dict[str, Any] = dict(model="smollm2-tools", messages=ask, tools=[STRICT, TIME],
                              temperature=0, max_tokens=96)
    r = client.chat.completions.create(
        **kw, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather"
    jsonschema.validate(args, STRICT["function"]["parameters"])
    if fmt == "kimi_k2":
        assert call.id == "functions.get_weather:0"
    deltas, finish = [], None
    for chunk in client.chat.completions.create(
            **kw, stream=True, tool_choice={"type": "function",
                                            "function": {"name": "get_weather"}}):
        assert not chunk.choices[0].delta.content  # the call's text is held back
        deltas.extend(chunk.choices[0].delta.tool_calls or [])
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and {d.index for d in deltas} == {0}  # one call, streamed
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == args
    # auto: the server's answer is the parse of the Python API's text on the same prompt.
    tpl = ChatTemplate(_source(name), bos_token=smollm2.tokenizer.bos_token,
                       eos_token=smollm2.tokenizer.eos_token)
    ids = smollm2.tokenizer.encode(tpl.render(ask, add_generation_prompt=True,
                                              tools=[STRICT, TIME]),
                                   add_special_tokens=False, special=True)
    r = client.chat.completions.create(**{**kw, "max_tokens": 24})
    g = smollm2.generate(ids, max_tokens=24)
    assert r.usage.prompt_tokens == len(ids)
    content, calls = parse_calls(g.text, "call_", fmt, [STRICT, TIME])
    msg = r.choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []] \
        == [(c.name, c.arguments) for c in calls]
    assert msg.content == ((content or None) if calls else g.text)
