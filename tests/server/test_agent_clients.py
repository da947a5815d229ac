"""Real agent clients driving ``colibri serve`` (issue 34, item 4): the OpenAI Agents SDK's
tool loop over chat completions, and the ``anthropic`` client's multi-turn loop the way
Claude Code runs it (tool_use -> tool_result -> final answer, the assistant's thinking
block sent back with its tool call). SmolLM2 with Qwen3's real chat template (tools and
``<think>`` blocks, Hermes-style calls); the first turn's call is forced by tool choice,
so every loop completes the same way each run (temperature 0)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import agents
import anthropic
import pytest
from openai import AsyncOpenAI

from support.realmodel import smollm2_gguf
from support.server_helpers import ServerProcess
from support.tokenizer_vectors import templates_dir

NAME = "smollm2-agent"
CITIES: list[str] = []  # what the tools were called with, in order


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    s = ServerProcess(smollm2_gguf(), "-c", "2048", "--served-model-name", NAME, "-q",
                      "--chat-template", str(templates_dir() / "Qwen-Qwen3-0.6B.jinja"))
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture
def calls() -> Iterator[list[str]]:
    CITIES.clear()
    yield CITIES
    CITIES.clear()


def test_openai_agents_sdk_tool_loop(server: ServerProcess, calls: list[str]) -> None:
    agents.set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        CITIES.append(city)
        return f"It is sunny and 21 C in {city}."

    client = AsyncOpenAI(base_url=server.base, api_key="unused", max_retries=0, timeout=300)
    agent = agents.Agent(
        name="weather", instructions="Answer with the weather tool.",
        model=agents.OpenAIChatCompletionsModel(model=NAME, openai_client=client),
        tools=[get_weather],
        # "required" forces the first turn's call; the SDK then resets tool choice to
        # auto (reset_tool_choice), so the model answers after reading the result.
        model_settings=agents.ModelSettings(tool_choice="required", temperature=0,
                                            max_tokens=48),
    )
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=6)
    assert calls and all(isinstance(c, str) and c for c in calls)
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"]
    assert isinstance(result.final_output, str)
    assert kinds[-1] == "MessageOutputItem"  # the loop ended on the model's answer


# This anthropic client has no temperature argument (Anthropic's newest models take none);
# colibri's messages route still reads it, so it goes in the body.
GREEDY = {"temperature": 0}
TOOL = {"name": "get_weather", "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string",
                                                                   "maxLength": 20}},
                         "required": ["city"], "additionalProperties": False}}


def test_anthropic_multi_turn_tool_loop_with_thinking(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                                 timeout=300)
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.messages.create(model=NAME, max_tokens=64, extra_body=GREEDY, tools=[TOOL],
                                   tool_choice={"type": "any"}, messages=[question],
                                   thinking={"type": "enabled", "budget_tokens": 32})
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input["city"], str)
    # Claude Code sends the assistant's turn back whole, its thinking block first.
    assistant: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": "The user wants the weather; call the tool.",
         "signature": ""},
        *[b.model_dump(exclude_none=True) for b in first.content if b.type != "thinking"],
    ]
    result = {"type": "tool_result", "tool_use_id": use.id,
              "content": json.dumps({"city": use.input["city"], "sky": "sunny", "c": 21})}
    messages = [question, {"role": "assistant", "content": assistant},
                {"role": "user", "content": [result]}]
    n_with = client.messages.count_tokens(model=NAME, messages=messages, tools=[TOOL],
                                          thinking={"type": "enabled", "budget_tokens": 32})
    second = client.messages.create(model=NAME, max_tokens=64, extra_body=GREEDY, tools=[TOOL],
                                    messages=messages,
                                    thinking={"type": "enabled", "budget_tokens": 32})
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert second.usage.input_tokens == n_with.input_tokens
    assert any(b.type in ("text", "tool_use", "thinking") for b in second.content)
    # The thinking sent back reached the template (Qwen3's keeps the last turn's reasoning).
    without = [question, {"role": "assistant", "content": assistant[1:]},
               {"role": "user", "content": [result]}]
    n_without = client.messages.count_tokens(model=NAME, messages=without, tools=[TOOL])
    assert n_with.input_tokens > n_without.input_tokens
