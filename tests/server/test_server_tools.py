"""Tool calls through the server: SmolLM2 served with Qwen2.5's chat template (llama.cpp's
copy, a template that renders tools and asks for Hermes-style ``<tool_call>{json}
</tool_call>`` calls). The parser is checked against the template itself (what it renders
for an assistant's tool calls parses back to those calls); the server's answers against
the Python API given the same prompt and constraint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import jsonschema
import openai
import pytest
from test_tool_stream import _stream, _whole

import colibri as co
from colibri.chat.template import ChatTemplate
from colibri.server.tool_stream import ToolStream
from colibri.server.tools import forced_call_grammar, parse_calls, template_format
from support.realmodel import smollm2_gguf
from support.server_helpers import ServerProcess
from support.tokenizer_vectors import templates_dir

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def qwen_template() -> Path:
    return templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja"


@pytest.fixture(scope="module")
def server(qwen_template: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(smollm2_gguf(), "-c", "1024", "--chat-template", str(qwen_template),
                      "--served-model-name", "smollm2-tools", "--prompt-cache", "64MiB", "-q")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def oracle(smollm2_oracle: co.Model, qwen_template: Path) -> tuple[co.Model, ChatTemplate]:
    tok = smollm2_oracle.tokenizer
    return smollm2_oracle, ChatTemplate(qwen_template.read_text(), bos_token=tok.bos_token,
                                        eos_token=tok.eos_token)


def _ids(oracle: tuple[co.Model, ChatTemplate], msgs: list[dict], tools: list | None) -> list:
    model, tpl = oracle
    text = tpl.render(msgs, add_generation_prompt=True, tools=tools)
    return model.tokenizer.encode(text, add_special_tokens=False, special=True)


def test_parser_reads_back_what_the_template_writes(qwen_template: Path) -> None:
    tpl = ChatTemplate(qwen_template.read_text())
    assert template_format(tpl.source) == "hermes"
    calls = [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}},
             {"name": "get_time", "arguments": {"city": "Zürich \"centre\""}}]
    msgs = [*ASK, {"role": "assistant", "content": "Let me look.",
                   "tool_calls": [{"type": "function", "function": c} for c in calls]}]
    text = tpl.render(msgs, add_generation_prompt=False, tools=[WEATHER, TIME])
    turn = text.rsplit("<|im_start|>assistant\n", 1)[1].split("<|im_end|>")[0]
    content, parsed = parse_calls(turn)
    assert content == "Let me look."
    assert [(c.name, c.arguments) for c in parsed] == [(c["name"], c["arguments"])
                                                       for c in calls]
    # Streamed a character at a time: the same content before the calls, the same calls.
    content, calls_streamed = _stream("hermes", turn, tools=None)[:2]  # sends leading space
    assert (content.strip(), calls_streamed) == _whole("hermes", turn, tools=None)
    # Not a call: text that only looks like the start of a tag, or a block without a name.
    assert parse_calls("a <tool_call>{\"x\": 1}</tool_call> b") == (
        "a <tool_call>{\"x\": 1}</tool_call> b", [])
    ts = ToolStream("hermes")
    assert ts.feed("x <tool") == ["x"] and ts.feed("box>") == [" <toolbox>"]


def test_named_tool_choice_returns_a_valid_call(client: openai.OpenAI, oracle: tuple) -> None:
    r = client.chat.completions.create(
        model="smollm2-tools", messages=ASK, tools=[WEATHER, TIME], temperature=0,
        max_tokens=48, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    # The oracle: the Python API on the same prompt with the same constraint.
    model, _ = oracle
    g = model.generate(_ids(oracle, ASK, [WEATHER, TIME]), max_tokens=48,
                       response_format=forced_call_grammar([WEATHER, TIME], "get_weather"))
    _, want = parse_calls(g.text)
    assert [(c.name, c.arguments) for c in want] == [("get_weather", args)]
    assert r.usage.prompt_tokens == len(g.prompt_ids)

    # Streamed: the same call, as tool_calls deltas.
    stream = client.chat.completions.create(
        model="smollm2-tools", messages=ASK, tools=[WEATHER, TIME], temperature=0,
        max_tokens=48, tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True)
    deltas, finish = [], None
    for chunk in stream:
        d = chunk.choices[0].delta
        deltas.extend(d.tool_calls or [])
        finish = chunk.choices[0].finish_reason or finish
    # Streamed as written: the call's first delta (index, id, name), then its arguments'
    # fragments, which concatenate to the arguments.
    assert finish == "tool_calls" and {d.index for d in deltas} == {0}
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == args


def test_required_and_auto(client: openai.OpenAI, oracle: tuple) -> None:
    r = client.chat.completions.create(model="smollm2-tools", messages=ASK, tools=[WEATHER, TIME],
                                       temperature=0, max_tokens=48, tool_choice="required")
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "get_time")
    fn = WEATHER if call.function.name == "get_weather" else TIME
    jsonschema.validate(json.loads(call.function.arguments), fn["function"]["parameters"])
    # auto: whatever the model writes, the server's answer is the parse of the oracle's text.
    model, _ = oracle
    r = client.chat.completions.create(model="smollm2-tools", messages=ASK, tools=[WEATHER],
                                       temperature=0, max_tokens=24)
    g = model.generate(_ids(oracle, ASK, [WEATHER]), max_tokens=24)
    content, calls = parse_calls(g.text)
    msg = r.choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls or []] \
        == [(c.name, c.arguments) for c in calls]
    assert msg.content == ((content or None) if calls else g.text)


def test_tool_results_round_trip(client: openai.OpenAI, oracle: tuple) -> None:
    """A conversation carrying a call (arguments as OpenAI's JSON text) and its result is
    rendered as the template renders the same call with arguments as an object."""
    args = {"city": "Paris", "unit": "C"}
    wire = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    r = client.chat.completions.create(model="smollm2-tools", messages=wire, tools=[WEATHER],
                                       temperature=0, max_tokens=16, tool_choice="none")
    plain = [*ASK, {"role": "assistant", "content": "", "tool_calls": [{
        "type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "content": "18 degrees, sunny"}]
    ids = _ids(oracle, plain, None)  # tool_choice none: the tools are not shown
    model, _ = oracle
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].message.content == model.generate(ids, max_tokens=16).text


def test_anthropic_tool_use(server: ServerProcess) -> None:
    c = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    msg = c.messages.create(
        model="smollm2-tools", max_tokens=48, messages=ASK, extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "description": "The weather in a city",
                "input_schema": WEATHER["function"]["parameters"]}],
        tool_choice={"type": "tool", "name": "get_weather"})
    assert msg.stop_reason == "tool_use"
    (block,) = [b for b in msg.content if b.type == "tool_use"]
    assert block.name == "get_weather"
    jsonschema.validate(block.input, WEATHER["function"]["parameters"])
