"""Reasoning separated from the answer, for the families that write it in a
``<think>...</think>`` block before their answer (DeepSeek-R1 and V3.1+, GLM-4.5+, Qwen3 /
3.5, MiniMax-M2, Kimi-K2-thinking) and for gpt-oss's harmony ``analysis`` channel.

Which chat templates reason, and how: :func:`reasoning_mode`. A ``<think>`` template (its
source writes both markers) with thinking on may open the block itself at the end of the
prompt (DeepSeek-R1 writes its assistant header then ``<think>\\n``): the output then starts
inside it (read off the rendered prompt's tail). A harmony template (its source writes
``<|channel|>`` and ``<|message|>``) ends its prompt with ``<|start|>assistant``. Kimi-K3's
template ends its prompt by opening its ``think`` (or ``response``) channel.

The splitters (colibri.sampling.think_block and .harmony, chosen by
colibri.sampling.reasoning_split) split the output into reasoning and answer as it is
generated; this module adds what depends on chat templates and on the Python API's results.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from ..sampling.harmony import prompt_opens_harmony
from ..sampling.reasoning_split import ReasoningMode, Splitter, make_splitter, split_text
from ..sampling.tagged_channels import k3_prompt_channel
from ..sampling.think_block import (
    PROMPT_TAIL_TOKENS,
    THINK_CLOSE,
    THINK_OPEN,
    ReasoningSplitter,
    prompt_opens_reasoning,
    split_reasoning,
)

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer
    from .template import ChatTemplate

__all__ = ["PROMPT_TAIL_TOKENS", "THINK_CLOSE", "THINK_OPEN", "ReasoningMode",
           "ReasoningSplitter", "asplit_chunks", "prompt_opens_reasoning", "reasoning_mode",
           "split_chunks", "split_reasoning", "split_result", "template_harmony",
           "template_reasons"]


def template_reasons(source: str) -> bool:
    """True when a chat template's source writes reasoning blocks (both markers)."""
    return THINK_OPEN in source and THINK_CLOSE in source


def template_harmony(source: str) -> bool:
    """True when a chat template's source writes harmony messages (gpt-oss)."""
    return "<|channel|>" in source and "<|message|>" in source


def reasoning_mode(template: ChatTemplate, tokenizer: Tokenizer,
                   ids: list[int]) -> ReasoningMode | None:
    """How the output of the prompt `ids` that `template` rendered is split: None when the
    template writes no reasoning (or, harmony, when the prompt does not end in its
    generation prompt); ``think_opened`` when the prompt opened the ``<think>`` block."""
    tail = tokenizer.decode(ids[-PROMPT_TAIL_TOKENS:])
    channel = k3_prompt_channel(tail)  # Kimi-K3's markers: specific enough on their own
    if channel is not None:
        return "k3_think" if channel == "think" else "k3_response"
    harmony, think = template_harmony(template.source), template_reasons(template.source)
    if not harmony and not think:
        return None
    if harmony:
        return "harmony" if prompt_opens_harmony(tail) else None
    return "think_opened" if prompt_opens_reasoning(tail) else "think"


# The Python API's results (colibri.generate's Chunk and Generation, which this floor does
# not import: any frozen dataclass with ``text``, ``reasoning`` and ``finish_reason``).
T = TypeVar("T")


def split_result(result: T, mode: ReasoningMode | None) -> T:
    """A whole generation with its text split into ``reasoning`` and ``text`` (the answer);
    as it is when `mode` is None (the template writes no reasoning)."""
    if mode is None:
        return result
    reasoning, answer = split_text(result.text, mode)  # type: ignore[attr-defined]
    return replace(result, text=answer, reasoning=reasoning)  # type: ignore[type-var]


def _split_chunk(s: Splitter, chunk: T) -> T:
    reasoning, answer = s.feed(chunk.text)  # type: ignore[attr-defined]
    if chunk.finish_reason is not None:  # type: ignore[attr-defined]
        held_reasoning, held = s.finish()
        reasoning, answer = reasoning + held_reasoning, answer + held
    return replace(chunk, text=answer, reasoning=reasoning)  # type: ignore[type-var]


def split_chunks(chunks: Iterator[T], mode: ReasoningMode | None) -> Iterator[T]:
    """A stream's chunks with each one's text split as :func:`split_result` splits the
    whole (held-back text comes out on the last chunk, the one with a finish reason)."""
    if mode is None:
        yield from chunks
        return
    s = make_splitter(mode)
    for chunk in chunks:
        yield _split_chunk(s, chunk)


async def asplit_chunks(chunks: AsyncIterator[T],
                        mode: ReasoningMode | None) -> AsyncIterator[T]:
    """:func:`split_chunks` of an asyncio stream."""
    s = make_splitter(mode) if mode is not None else None
    async for chunk in chunks:
        yield chunk if s is None else _split_chunk(s, chunk)
