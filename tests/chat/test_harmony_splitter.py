"""gpt-oss's harmony output split into reasoning (the analysis channel) and answer
(issue 34, item 1): outputs rendered by the real gpt-oss template (llama.cpp's copy in
build/test-data/templates) and hand-written malformed ones, whole and fed one character at
a time; the template is recognised and its prompt read as harmony."""

from __future__ import annotations

import time
from typing import Any

import pytest

from colibri.chat.reasoning import reasoning_mode, template_harmony
from colibri.chat.template import ChatTemplate
from colibri.sampling.harmony import MAX_HEADER, HarmonySplitter
from colibri.sampling.reasoning_split import split_text
from support.tokenizer_vectors import templates_dir

USER = {"role": "user", "content": "What is 2+2?"}
CALL = {"id": "c1", "type": "function",
        "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Adds.", "parameters": {
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"]}}}]


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate((templates_dir() / "openai-gpt-oss-120b.jinja").read_text())


def _output(t: ChatTemplate, turn: dict[str, Any], tools: Any = None) -> str:
    """What the model writes for `turn`: the template's render of the conversation with it,
    less the prompt (which ends in the generation prompt ``<|start|>assistant``)."""
    prompt = t.render([USER], add_generation_prompt=True, tools=tools)
    whole = t.render([USER, turn], add_generation_prompt=False, tools=tools)
    assert prompt.endswith("<|start|>assistant") and whole.startswith(prompt)
    return whole[len(prompt):]


def _fed(text: str) -> tuple[str, str]:
    s = HarmonySplitter()
    parts = [s.feed(ch) for ch in text] + [s.finish()]
    return "".join(r for r, _ in parts), "".join(a for _, a in parts)


def test_reasoning_and_final_answer(template: ChatTemplate) -> None:
    out = _output(template, {"role": "assistant", "thinking": "Two and two make four.",
                             "content": "4"})
    assert out.startswith("<|channel|>analysis<|message|>")
    assert split_text(out, "harmony") == ("Two and two make four.", "4")
    assert _fed(out) == ("Two and two make four.", "4")


def test_a_tool_call_goes_to_the_answer_verbatim(template: ChatTemplate) -> None:
    out = _output(template, {"role": "assistant", "thinking": "Use the tool.", "content": "",
                             "tool_calls": [CALL]}, TOOLS)
    reasoning, answer = split_text(out, "harmony")
    assert reasoning == "Use the tool."
    assert "to=functions.add" in answer and answer.endswith('{"a": 2, "b": 2}<|call|>')
    assert answer.startswith("<|start|>assistant")
    assert _fed(out) == (reasoning, answer)


@pytest.mark.parametrize(("text", "reasoning", "answer"), [
    ("<|channel|>analysis<|message|>cut off", "cut off", ""),
    ("<|channel|>final<|message|>only an answer", "", "only an answer"),
    ("<|channel|>commentary<|message|>preamble<|end|>", "", "preamble"),
    ("plain text, no harmony at all", "", "plain text, no harmony at all"),
    ("<|channel|>analysis<|mess", "", "<|channel|>analysis<|mess"),  # header never ends
    ("<|channel|>analysis<|message|>a<|end|>stray<|start|>assistant<|channel|>final"
     "<|message|>b", "a", "strayb"),
    ("<|channel|>analysis<|message|>x <|en", "x <|en", ""),
    ("<|channel|>analysis<|message|>a<|end|><|start|>", "a", "<|start|>"),
])
def test_malformed_outputs_lose_nothing(text: str, reasoning: str, answer: str) -> None:
    assert split_text(text, "harmony") == (reasoning, answer)
    assert _fed(text) == (reasoning, answer)


def test_a_header_that_never_ends_is_released_as_text() -> None:
    s = HarmonySplitter()
    r, a = s.feed("x" * (MAX_HEADER + 1))
    assert (r, a) == ("", "x" * (MAX_HEADER + 1))  # streamed once it cannot be a header


def test_linear_time_on_marker_fragments() -> None:
    text = "<|channel|>analysis<|message|>" + "<|en<|st<|ca" * 50_000
    t = time.perf_counter()
    r, a = _fed(text[:200_000])
    assert time.perf_counter() - t < 5.0  # one pass; a rescan per character would be 10^10
    assert r + a == text[len("<|channel|>analysis<|message|>"):200_000]


class _Tail:
    """A tokenizer whose decode of the prompt's last ids gives `text` (what is read)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def decode(self, ids: list[int]) -> str:
        return self.text


def test_the_template_and_its_prompt_are_read_as_harmony(template: ChatTemplate) -> None:
    assert template_harmony(template.source)
    prompt = template.render([USER], add_generation_prompt=True)
    assert reasoning_mode(template, _Tail(prompt[-40:]), [0]) == "harmony"  # type: ignore[arg-type]
    # A prompt that does not end in the generation prompt is not split.
    assert reasoning_mode(template, _Tail(prompt[-40:] + "Sure"), [0]) is None  # type: ignore[arg-type]
    chatml = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}")
    assert not template_harmony(chatml.source)
    assert reasoning_mode(chatml, _Tail(prompt), [0]) is None  # type: ignore[arg-type]


def test_past_reasoning_reaches_the_gpt_oss_template(template: ChatTemplate) -> None:
    """The server passes an assistant's reasoning back as ``reasoning_content``; gpt-oss's
    template reads ``thinking``, so it is renamed for it (and only for such templates)."""
    from colibri.server.options import _reasoning_named_for

    turn = {"role": "assistant", "content": "", "reasoning_content": "Use the tool.",
            "tool_calls": [CALL]}
    msgs = _reasoning_named_for(template, [USER, turn])
    text = template.render(msgs, add_generation_prompt=True, tools=TOOLS)
    assert "<|channel|>analysis<|message|>Use the tool.<|end|>" in text
    chatml = ChatTemplate("{% for m in messages %}{{ m.reasoning_content }}{% endfor %}")
    assert _reasoning_named_for(chatml, [USER, turn])[1] is turn
