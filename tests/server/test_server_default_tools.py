"""Tools with the default model, out of the box: ``colibri serve smollm2`` (the named model,
no --chat-template) takes tools through colibri's ChatML tool template
(colibri.chat.tool_templates), runs docs/serving.md's tool example as written, answers as
the Python API does on the same prompt, and never returns a call that max_tokens cut as
content (OpenAI's API whole and streamed, Anthropic's)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest
from test_tool_stream import _stream

import colibri as co
from colibri.chat.template import ChatTemplate
from colibri.chat.tool_templates import template_for_tools
from colibri.server.errors import ApiError
from colibri.server.options import pick_template
from colibri.server.tools import split_answer
from support.realmodel import smollm2_gguf
from support.server_helpers import ServerProcess
from support.tokenizer_vectors import templates_dir

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
KEY = "sk-local"  # the docs' key
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    smollm2_gguf()  # skips without the weights (the named model is that package's file)
    s = ServerProcess("smollm2", "--api-key", KEY, "-c", "2048", "-q")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key=KEY, max_retries=0, timeout=300)


def tool_example() -> str:
    """docs/serving.md's tool example: the python block of its "Tool calls" section."""
    section = DOC.read_text().split("## Tool calls", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```python\n(.*?)^```", section, re.M | re.S)
    return block


def test_the_docs_tool_example_runs_as_written(server: ServerProcess) -> None:
    code = tool_example()
    assert 'base_url="http://127.0.0.1:8000/v1"' in code and 'model="smollm2"' in code
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code.replace("http://127.0.0.1:8000/v1", server.base), {})
    first, *answer = out.getvalue().splitlines()
    finish, name, arguments = first.split(" ", 2)
    assert (finish, name) == ("tool_calls", "get_weather")
    args = json.loads(arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert set(args) == {"city"}
    assert "".join(answer).strip()  # the answer to the tool's result
    # What the docs' comment shows is what it prints.
    assert f"# {first}" in code


@pytest.fixture(scope="module")
def model(smollm2_oracle: co.Model) -> co.Model:
    return smollm2_oracle


def test_answers_equal_the_python_api(client: openai.OpenAI, model: co.Model) -> None:
    """auto: the server's prompt is Model.chat's with the same tools (the shipped
    template), and its greedy answer the same text."""
    r = client.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER],
                                       temperature=0, max_tokens=24)
    g = model.chat(ASK, tools=[WEATHER], max_tokens=24)
    assert r.usage.prompt_tokens == len(g.prompt_ids)
    assert "<tools>" in model.tokenizer.decode(g.prompt_ids)
    content, calls, dropped = split_answer(g.text, "hermes", [WEATHER],
                                           cut=g.finish_reason == "length")
    msg = r.choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments))
            for c in msg.tool_calls or []] == [(c.name, c.arguments) for c in calls]
    # An answer without a call is the text as generated (the parser's content is stripped).
    assert (msg.content or "") == (content if calls or dropped else g.text)


def _forced(n: int) -> dict[str, Any]:
    return dict(model="smollm2", messages=ASK, tools=[WEATHER], tool_choice="required",
                temperature=0, max_tokens=n)


@pytest.mark.parametrize("max_tokens", [6, 20])
def test_a_call_cut_by_max_tokens_is_not_content(client: openai.OpenAI, server: ServerProcess,
                                                 max_tokens: int) -> None:
    """A forced call takes about 30 of SmolLM2's tokens: cut before its end, nothing of it
    comes back, and the finish reason says why."""
    r = client.chat.completions.create(**_forced(max_tokens))
    (choice,) = r.choices
    assert r.usage.completion_tokens == max_tokens
    assert choice.finish_reason == "length"
    assert choice.message.content is None and not choice.message.tool_calls
    text, deltas, finish = "", [], None
    for chunk in client.chat.completions.create(**_forced(max_tokens), stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            deltas += chunk.choices[0].delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
    assert (text, deltas, finish) == ("", [], "length")
    a = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    msg = a.messages.create(
        model="smollm2", max_tokens=max_tokens, messages=ASK, extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
        tool_choice={"type": "any"})
    assert msg.stop_reason == "max_tokens"
    assert all(b.type == "text" and "<tool_call>" not in b.text for b in msg.content)
    # With room, the same request is a call.
    r = client.chat.completions.create(**_forced(60))
    assert r.choices[0].finish_reason == "tool_calls"
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_what_a_cut_keeps() -> None:
    """The text before the unfinished call stays; a complete call before it is returned;
    without a cut (EOS, a stop string) an unreadable call stays text, as before."""
    partial = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"ci'
    assert split_answer(partial, "hermes", None, cut=True) == ("Let me check.", [], True)
    assert split_answer(partial, "hermes", None, cut=False) == (partial, [], False)
    done = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    text, calls, dropped = split_answer(done + "\n" + partial, "hermes", None, cut=True)
    assert (text, [c.arguments for c in calls], dropped) == ("Let me check.", [{"city": "Paris"}],
                                                             True)
    assert _stream("hermes", partial, cut=True, raw=False, tools=None)[:2] == ("Let me check.", [])
    assert _stream("hermes", partial, tools=None)[:2] == (partial, [])


def test_no_tool_template_is_a_400_naming_the_option() -> None:
    """A template that renders no tools and is not ChatML (Gemma 2's): tools are refused,
    naming --chat-template; a conversation without tools is rendered with it as before."""
    gemma = ChatTemplate((templates_dir() / "google-gemma-2-2b-it.jinja").read_text())
    assert template_for_tools(gemma) is None
    with pytest.raises(ApiError) as e:
        pick_template(gemma, None, list(ASK), [WEATHER])
    assert e.value.status == 400 and "--chat-template FILE" in str(e.value)
    assert pick_template(gemma, None, list(ASK), None) is gemma
    tool_turns = [*ASK, {"role": "tool", "content": "18 C"}]
    assert pick_template(gemma, None, tool_turns, None) is gemma
