"""Generation.reasoning and Chunk.reasoning (issue 34, item 1) through the Python API on the
real SmolLM2, its output forced by a regex into ``<think>...</think>answer``: templated
generations with a template that writes <think> blocks are split; raw prompts and templates
without <think> are not."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

import colibri as co
from support.realmodel import smollm2_gguf

THINKING = ("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n"
            "{%- if not (enable_thinking is defined and enable_thinking is false) -%}"
            "<think>\n{%- endif -%}{%- endif -%}{#- closed with </think> -#}")
FORCED = co.Regex(r"<think>[a-z ]{1,20}</think>[A-Za-z ]{1,20}")
OPENED = co.Regex(r"[a-z]{2,8}( [a-z]{2,8}){1,2}</think>\n\n[A-Za-z ]{1,20}")
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def model() -> Iterator[co.Model]:
    m = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(
        threads=co.ThreadConfig(n=2), context_length=256))
    yield m
    m.close()


@pytest.fixture
def thinking(model: co.Model) -> Iterator[co.Model]:
    default = model.chat_template
    model.chat_template = THINKING
    yield model
    model.chat_template = default


def test_prompt_opened_block_is_split(thinking: co.Model) -> None:
    g = thinking.generate(messages=HI, max_tokens=40, response_format=OPENED)
    assert g.reasoning and g.text and "</think>" not in g.reasoning + g.text
    assert g.text == g.text.lstrip()
    c = thinking.chat("Hi", max_tokens=40, response_format=OPENED)
    assert (c.reasoning, c.text) == (g.reasoning, g.text)
    assert [(x.reasoning, x.text) for x in thinking.generate_n(
        messages=HI, n=2, max_tokens=40, response_format=OPENED)] == [(g.reasoning, g.text)] * 2


def test_stream_equals_generate(thinking: co.Model) -> None:
    g = thinking.generate(messages=HI, max_tokens=40, response_format=OPENED)
    for chunks in (list(thinking.stream(messages=HI, max_tokens=40, response_format=OPENED)),
                   list(thinking.stream_chat("Hi", max_tokens=40, response_format=OPENED))):
        assert "".join(c.reasoning for c in chunks) == g.reasoning
        assert "".join(c.text for c in chunks) == g.text

    async def run() -> tuple[co.Generation, list[co.Chunk]]:
        a = await thinking.agenerate(messages=HI, max_tokens=40, response_format=OPENED)
        return a, [c async for c in thinking.astream(messages=HI, max_tokens=40,
                                                     response_format=OPENED)]
    a, chunks = asyncio.run(run())
    assert (a.reasoning, a.text) == (g.reasoning, g.text)
    assert "".join(c.reasoning for c in chunks) == g.reasoning


def test_thinking_off_and_raw_prompts_are_not_split(thinking: co.Model) -> None:
    ids = thinking.apply_chat_template(HI, tokenize=True, enable_thinking=False)
    g = thinking.generate(ids, max_tokens=40, response_format=FORCED)
    assert g.reasoning == "" and g.text.startswith("<think>")  # raw ids: nothing split
    raw = thinking.generate("Hi", max_tokens=40, response_format=FORCED)
    assert raw.reasoning == "" and raw.text.startswith("<think>")


def test_template_without_think_is_not_split(model: co.Model) -> None:
    g = model.generate(messages=HI, max_tokens=40, response_format=FORCED)
    assert g.reasoning == "" and g.text.startswith("<think>")
    assert all(c.reasoning == "" for c in model.stream(messages=HI, max_tokens=40,
                                                       response_format=FORCED))
