"""Reasoning separated from the answer, for the families that write it in a
``<think>...</think>`` block before their answer (DeepSeek-R1 and V3.1+, GLM-4.5+, Qwen3 /
3.5, MiniMax-M2, Kimi-K2-thinking).

Which chat templates reason: :func:`template_reasons` (their source writes both markers). A
template with thinking on may open the block itself at the end of the prompt (DeepSeek-R1
writes its assistant header then ``<think>\\n``): the output then starts inside it
(:func:`prompt_opens_reasoning`, read off the rendered prompt's tail).

:class:`ReasoningSplitter` (colibri.sampling.think_block, re-exported here) splits the output
into reasoning and answer as it is generated; this module adds what depends on chat
templates and on the Python API's results.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

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

__all__ = ["PROMPT_TAIL_TOKENS", "THINK_CLOSE", "THINK_OPEN", "ReasoningSplitter",
           "asplit_chunks", "prompt_opens_reasoning", "reasoning_mode", "split_chunks",
           "split_reasoning", "split_result", "template_reasons"]


def template_reasons(source: str) -> bool:
    """True when a chat template's source writes reasoning blocks (both markers)."""
    return THINK_OPEN in source and THINK_CLOSE in source


def reasoning_mode(template: ChatTemplate, tokenizer: Tokenizer, ids: list[int]) -> bool | None:
    """None when `template` writes no reasoning blocks (the output is not split); else
    whether the prompt `ids` it rendered opened the block (the output starts inside it)."""
    if not template_reasons(template.source):
        return None
    return prompt_opens_reasoning(tokenizer.decode(ids[-PROMPT_TAIL_TOKENS:]))


# The Python API's results (colibri.generate's Chunk and Generation, which this floor does
# not import: any frozen dataclass with ``text``, ``reasoning`` and ``finish_reason``).
T = TypeVar("T")


def split_result(result: T, opened: bool | None) -> T:
    """A whole generation with its text split into ``reasoning`` and ``text`` (the answer);
    as it is when `opened` is None (the template writes no reasoning blocks)."""
    if opened is None:
        return result
    reasoning, answer = split_reasoning(result.text, opened)  # type: ignore[attr-defined]
    return replace(result, text=answer, reasoning=reasoning)  # type: ignore[type-var]


def _split_chunk(s: ReasoningSplitter, chunk: T) -> T:
    reasoning, answer = s.feed(chunk.text)  # type: ignore[attr-defined]
    if chunk.finish_reason is not None:  # type: ignore[attr-defined]
        held_reasoning, held = s.finish()
        reasoning, answer = reasoning + held_reasoning, answer + held
    return replace(chunk, text=answer, reasoning=reasoning)  # type: ignore[type-var]


def split_chunks(chunks: Iterator[T], opened: bool | None) -> Iterator[T]:
    """A stream's chunks with each one's text split as :func:`split_result` splits the
    whole (held-back text comes out on the last chunk, the one with a finish reason)."""
    if opened is None:
        yield from chunks
        return
    s = ReasoningSplitter(opened)
    for chunk in chunks:
        yield _split_chunk(s, chunk)


async def asplit_chunks(chunks: AsyncIterator[T], opened: bool | None) -> AsyncIterator[T]:
    """:func:`split_chunks` of an asyncio stream."""
    s = ReasoningSplitter(opened) if opened is not None else None
    async for chunk in chunks:
        yield chunk if s is None else _split_chunk(s, chunk)
