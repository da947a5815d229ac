"""colibri's shipped tool templates (colibri.chat.tool_templates) and which template a
conversation with tools gets: the model's own when it renders tools, colibri's ChatML one
for a ChatML template that does not (SmolLM2's, the default model's), else an error naming
``model.chat_template``. Through the Python API on SmolLM2: plain chats are unchanged, a
chat with tools is the shipped template's prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import colibri as co
from colibri.chat.template import CHATML_TEMPLATE, ChatTemplate
from colibri.chat.tool_templates import (
    CHATML_TOOLS,
    TOOL_TEMPLATES,
    has_tool_turns,
    template_for_tools,
)
from colibri.errors import InvalidRequestError
from colibri.server.tools import parse_calls, template_format
from support.realmodel import smollm2_gguf
from support.tokenizer_vectors import templates_dir

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time"}}
ASK = [{"role": "user", "content": "Weather in Paris and Lyon?"}]
CALLS = [{"name": "get_weather", "arguments": {"city": "Paris"}},
         {"name": "get_weather", "arguments": {"city": "Zürich \"centre\""}}]


@pytest.mark.parametrize("shipped", TOOL_TEMPLATES, ids=[t.name for t in TOOL_TEMPLATES])
def test_a_shipped_template_writes_the_format_it_names(shipped: object) -> None:
    assert template_format(shipped.source) == shipped.call_format  # type: ignore[attr-defined]


def test_tools_calls_and_results_are_rendered() -> None:
    tpl = ChatTemplate(CHATML_TOOLS.source)
    wire = [{"type": "function", "id": f"call_{i}", "function": c} for i, c in enumerate(CALLS)]
    wire[1]["function"] = {**CALLS[1], "arguments": json.dumps(CALLS[1]["arguments"])}
    msgs = [{"role": "system", "content": "Be terse."}, *ASK,
            {"role": "assistant", "content": "Let me look.", "tool_calls": wire},
            {"role": "tool", "content": "18 C"}, {"role": "tool", "content": "20 C"}]
    text = tpl.render(msgs, tools=[WEATHER, TIME])
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe terse.\n\n")
    listed = system.split("<tools>\n", 1)[1].split("</tools>")[0].splitlines()
    assert [json.loads(line) for line in listed] == [WEATHER["function"], TIME["function"]]
    # The assistant's turn is what the model is asked to write: it parses back to the calls
    # (the arguments given as JSON text too), in the format the template names.
    turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    content, calls = parse_calls(turn, "call_", CHATML_TOOLS.call_format)
    assert content == "Let me look."
    assert [(c.name, c.arguments) for c in calls] == [(c["name"], c["arguments"]) for c in CALLS]
    assert text.endswith("<|im_start|>user\n<tool_response>\n18 C\n</tool_response>\n"
                         "<tool_response>\n20 C\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n")
    # Without a system message: a short one of its own; without tools: plain ChatML.
    assert tpl.render(ASK, tools=[WEATHER]).startswith(
        "<|im_start|>system\nYou are a helpful assistant.\n\n")
    assert tpl.render(ASK) == ChatTemplate(CHATML_TEMPLATE).render(ASK)


def _source(name: str) -> str:
    return (templates_dir() / name).read_text(encoding="utf-8")


def test_which_template_gets_the_tools() -> None:
    qwen = ChatTemplate(_source("Qwen-Qwen2.5-7B-Instruct.jinja"))
    assert template_for_tools(qwen) is qwen  # it renders tools itself
    for plain in (ChatTemplate(CHATML_TEMPLATE, bos_token="<s>", eos_token="</s>"),
                  ChatTemplate(_source("HuggingFaceTB-SmolLM3-3B.jinja"))):  # ChatML, no tools
        chosen = template_for_tools(plain)
        assert chosen is not None and chosen.source == CHATML_TOOLS.source
        assert (chosen.bos_token, chosen.eos_token) == (plain.bos_token, plain.eos_token)
        assert chosen.name == "colibri's chatml-tools template"
    assert template_for_tools(ChatTemplate(_source("google-gemma-2-2b-it.jinja"))) is None
    assert has_tool_turns([*ASK, {"role": "tool", "content": "x"}])
    assert has_tool_turns([{"role": "assistant", "content": "", "tool_calls": [CALLS[0]]}])
    assert not has_tool_turns(ASK) and not has_tool_turns("Hi")


@pytest.fixture(scope="module")
def model() -> Iterator[co.Model]:
    with co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=1024)) as m:
        yield m


def test_the_default_model_takes_tools(model: co.Model) -> None:
    """SmolLM2's own template renders no tools: a conversation with tools gets colibri's
    ChatML tool template; one without keeps SmolLM2's (its default system prompt)."""
    assert "tools" not in model.chat_template.source
    tok = model.tokenizer
    shipped = ChatTemplate(CHATML_TOOLS.source, bos_token=tok.bos_token,
                           eos_token=tok.eos_token)
    text = model.apply_chat_template(ASK, tools=[WEATHER])
    assert text == shipped.render(ASK, tools=[WEATHER])
    assert model.count_tokens(messages=ASK, tools=[WEATHER]) == len(
        tok.encode(text, add_special_tokens=False, special=True))
    assert "named SmolLM" in model.apply_chat_template(ASK)
    assert model.apply_chat_template(ASK) == model.chat_template.render(ASK)
    # A conversation carrying calls and results needs the tool template even without tools.
    turns = [*ASK, {"role": "assistant", "content": "", "tool_calls": [CALLS[0]]},
             {"role": "tool", "content": "18 C"}]
    assert model.apply_chat_template(turns) == shipped.render(turns)
    g = model.chat(ASK, tools=[WEATHER], max_tokens=4)
    assert g.prompt_ids == tok.encode(text, add_special_tokens=False, special=True)


def test_a_template_of_ones_own(model: co.Model) -> None:
    """model.chat_template takes Jinja source: used as it is when it renders tools; the
    error for one that neither renders them nor is ChatML names that option."""
    qwen = _source("Qwen-Qwen2.5-7B-Instruct.jinja")
    try:
        model.chat_template = qwen
        assert model.chat_template.source == qwen
        assert model.apply_chat_template(ASK, tools=[WEATHER]) == ChatTemplate(qwen).render(
            ASK, tools=[WEATHER])
        model.chat_template = ChatTemplate(_source("google-gemma-2-2b-it.jinja"))
        with pytest.raises(InvalidRequestError, match=r"set model\.chat_template"):
            model.chat(ASK, tools=[WEATHER], max_tokens=1)
        assert model.chat(ASK, max_tokens=1).prompt_ids  # without tools it is used as given
        with pytest.raises(InvalidRequestError, match="chat_template must be"):
            model.chat_template = 3  # type: ignore[assignment]
    finally:
        model.chat_template = None
    assert "named SmolLM" in model.apply_chat_template(ASK)
