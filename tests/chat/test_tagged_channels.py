"""Kimi-K3's tagged channels split into reasoning and answer (issue 34, item 1): outputs
rendered by the real Kimi-K3 template (llama.cpp's copy), with thinking on and off, whole
and a character at a time; the tool section after the response reaches the tool-call parser
whole; malformed outputs lose nothing."""

from __future__ import annotations

from typing import Any

import pytest

from colibri.chat.reasoning import reasoning_mode
from colibri.chat.template import ChatTemplate
from colibri.sampling.reasoning_split import closing_text, make_splitter, split_text
from colibri.sampling.tagged_channels import K3_RESPONSE, TaggedSplitter
from colibri.server.tools import split_answer
from support.tokenizer_vectors import templates_dir

USER = {"role": "user", "content": "What is the weather in Paris?"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate((templates_dir() / "Kimi-K3.jinja").read_text())


def _output(t: ChatTemplate, turn: dict[str, Any], **variables: Any) -> tuple[str, str]:
    """(the prompt, what the model writes for `turn`)."""
    prompt = t.render([USER], add_generation_prompt=True, tools=TOOLS, **variables)
    whole = t.render([USER, turn], add_generation_prompt=False, tools=TOOLS, **variables)
    head = prompt[:prompt.rindex("<|open|>message")]
    assert whole.startswith(head)
    opened = prompt[len(head):]
    rest = whole[len(head):]
    assert rest.startswith(opened)
    return prompt, rest[len(opened):]


class _Tail:
    def __init__(self, text: str) -> None:
        self.text = text

    def decode(self, ids: list[int]) -> str:
        return self.text


def _fed(mode: Any, text: str) -> tuple[str, str]:
    s = make_splitter(mode)
    parts = [s.feed(ch) for ch in text] + [s.finish()]
    return "".join(r for r, _ in parts), "".join(a for _, a in parts)


def test_thinking_then_response_then_a_tool_call(template: ChatTemplate) -> None:
    prompt, out = _output(template, {"role": "assistant", "content": "Let me look.",
                                     "reasoning_content": "Need the tool.",
                                     "tool_calls": [CALL]})
    mode = reasoning_mode(template, _Tail(prompt[-60:]), [0])  # type: ignore[arg-type]
    assert mode == "k3_think"
    reasoning, answer = split_text(out, mode)
    assert reasoning == "Need the tool." and answer.startswith("Let me look.<|open|>tools")
    assert _fed(mode, out) == (reasoning, answer)
    assert "<|close|>message<|sep|>" not in answer  # the template's end of the message
    # <|end_of_msg|> ends generation (an EOS: not in the output's text).
    content, calls, _ = split_answer(answer.removesuffix("<|end_of_msg|>"), "kimi_k3", TOOLS)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert content == "Let me look."


def test_thinking_off_starts_in_the_response(template: ChatTemplate) -> None:
    prompt, out = _output(template, {"role": "assistant", "content": "Sunny."}, thinking=False)
    mode = reasoning_mode(template, _Tail(prompt[-60:]), [0])  # type: ignore[arg-type]
    assert mode == "k3_response"
    assert split_text(out, mode)[0] == "" and split_text(out, mode)[1].startswith("Sunny.")


@pytest.mark.parametrize(("text", "thinking", "reasoning", "answer"), [
    ("cut in the reasoning <|clo", True, "cut in the reasoning <|clo", ""),
    ("r<|close|>think<|sep|>no response marker", True, "r", "no response marker"),
    ("r<|close|>think<|sep|><|open|>resp", True, "r", "<|open|>resp"),
    ("answer only", False, "", "answer only"),
    ("a<|close|>response<|sep|>after", False, "", "aafter"),
    ("a<|close|>response<|sep|>x<|close|>message<|sep|>", False, "", "ax"),
    ("a<|close|>response<|sep|>x<|close|>mess", False, "", "ax<|close|>mess"),
])
def test_malformed_outputs_lose_nothing(text: str, thinking: bool, reasoning: str,
                                        answer: str) -> None:
    mode = "k3_think" if thinking else "k3_response"
    assert split_text(text, mode) == (reasoning, answer)
    assert _fed(mode, text) == (reasoning, answer)


def test_budget_closing_text_opens_the_response() -> None:
    s = TaggedSplitter(True)
    s.feed("thinking" + closing_text("k3_think"))
    assert not s.inside and closing_text("k3_think").endswith(K3_RESPONSE)
