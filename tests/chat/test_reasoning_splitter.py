"""The reasoning splitter (colibri.chat.reasoning) against hand-written outputs, whole and
fed in every split; and the real Qwen3 / DeepSeek-R1 templates' prompts, which open the
block themselves with thinking on."""

from __future__ import annotations

from pathlib import Path

import pytest

from colibri.chat.reasoning import (
    ReasoningSplitter,
    prompt_opens_reasoning,
    split_reasoning,
    template_reasons,
)
from colibri.chat.template import ChatTemplate

TEMPLATES = Path(__file__).resolve().parents[2] / "build" / "test-data" / "templates"

CASES = [
    # (output, prompt opened the block, reasoning, answer)
    ("<think>plan it</think>\n\nThe answer.", False, "plan it", "The answer."),
    ("\n<think>\nplan it\n</think>\n\nThe answer.", False, "plan it\n", "The answer."),
    ("plan it</think>The answer.", True, "plan it", "The answer."),
    ("\nplan it\n</think>\n\nThe answer.", True, "plan it\n", "The answer."),
    ("<think>never closed", False, "never closed", ""),
    ("never closed </thi", True, "never closed </thi", ""),
    ("no markers at all", False, "", "no markers at all"),
    ("  leading space kept", False, "", "  leading space kept"),
    ("<thin", False, "", "<thin"),
    ("   ", False, "", "   "),
    ("", False, "", ""),
    ("", True, "", ""),
    ("answer <think>not reasoning</think> more", False, "",
     "answer <think>not reasoning</think> more"),
    ("<think></think>answer", False, "", "answer"),
    ("<think>a</think>b</think>c", False, "a", "b</think>c"),
    ("<think>a < b <t </th </think>x", False, "a < b <t </th ", "x"),
    ("<thinking>x</thinking>", False, "", "<thinking>x</thinking>"),
]


def _fed(pieces: list[str], opened: bool) -> tuple[str, str]:
    s = ReasoningSplitter(opened)
    reasoning, answer = [], []
    for p in pieces:
        r, a = s.feed(p)
        reasoning.append(r)
        answer.append(a)
    r, a = s.finish()
    return "".join(reasoning) + r, "".join(answer) + a


@pytest.mark.parametrize(("text", "opened", "reasoning", "answer"), CASES)
def test_whole_output(text: str, opened: bool, reasoning: str, answer: str) -> None:
    assert split_reasoning(text, opened) == (reasoning, answer)


@pytest.mark.parametrize(("text", "opened", "reasoning", "answer"), CASES)
def test_every_split_and_char_by_char_equal_whole(text: str, opened: bool, reasoning: str,
                                                  answer: str) -> None:
    for cut in range(len(text) + 1):
        assert _fed([text[:cut], text[cut:]], opened) == (reasoning, answer), cut
    for a in range(len(text) + 1):  # two cuts: a marker split over three pieces
        for b in range(a, min(len(text), a + 9) + 1):
            assert _fed([text[:a], text[a:b], text[b:]], opened) == (reasoning, answer)
    assert _fed(list(text), opened) == (reasoning, answer)


def test_streamed_reasoning_is_not_held_back() -> None:
    s = ReasoningSplitter()
    assert s.feed("<think>") == ("", "")
    assert s.feed("step one, ") == ("step one, ", "")
    assert s.feed("two</") == ("two", "")  # only the possible marker start is held
    assert s.feed("think>\n\n") == ("", "")
    assert s.feed("done") == ("", "done")
    assert s.finish() == ("", "")


def test_long_output_is_linear() -> None:
    # Many pieces that each end in a marker prefix: each feed does bounded work.
    text = "<think>" + "</thin x " * 20000 + "</think>" + "<think " * 20000
    r, a = _fed([text[i:i + 7] for i in range(0, len(text), 7)], False)
    assert r == "</thin x " * 20000 and a == "<think " * 20000


def _template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text())


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B.jinja", "llama-cpp-deepseek-r1.jinja",
                                  "deepseek-ai-DeepSeek-V3.1.jinja", "GLM-4.6.jinja",
                                  "MiniMax-M2.jinja", "Kimi-K2-Thinking.jinja",
                                  "Qwen3.5-4B.jinja"])
def test_reasoning_families_templates_are_detected(name: str) -> None:
    assert template_reasons(_template(name).source)


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct.jinja", "Kimi-K2-Instruct.jinja",
                                  "Mistral-Small-3.2-24B-Instruct-2506.jinja"])
def test_templates_without_think_get_no_splitting(name: str) -> None:
    assert not template_reasons(_template(name).source)


MESSAGES = [{"role": "user", "content": "Why is <think> in my text?</think>"}]


def test_deepseek_r1_prompt_opens_the_block() -> None:
    prompt = _template("llama-cpp-deepseek-r1.jinja").render(MESSAGES)
    assert prompt_opens_reasoning(prompt[-40:])


def test_qwen3_prompt_opens_only_when_thinking_is_off() -> None:
    t = _template("Qwen-Qwen3-0.6B.jinja")
    on = t.render(MESSAGES)
    off = t.render(MESSAGES, enable_thinking=False)
    assert not prompt_opens_reasoning(on[-40:])  # the model writes <think> itself
    assert off.endswith("<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning(off[-40:])  # closed: the output is all answer
    # the user's markers are in the prompt, never in the split output
    assert split_reasoning("Because you typed it.") == ("", "Because you typed it.")
