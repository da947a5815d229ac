"""Reasoning separated from the answer, for the families that write it in a
``<think>...</think>`` block before their answer (DeepSeek-R1 and V3.1+, GLM-4.5+, Qwen3 /
3.5, MiniMax-M2, Kimi-K2-thinking).

Which chat templates reason: :func:`template_reasons` (their source writes both markers). A
template with thinking on may open the block itself at the end of the prompt (DeepSeek-R1
writes its assistant header then ``<think>\\n``): the output then starts inside it
(:func:`prompt_opens_reasoning`, read off the rendered prompt's tail).

:class:`ReasoningSplitter` splits the model's output, fed in pieces as they are generated, into
(reasoning, answer) deltas, in time linear in the output: only one block, at the start of the
output (after whitespace), is reasoning; markers later in the answer stay answer text, as in
the families' own parsers. It holds back at most a possible marker prefix (under 8 characters)
and whitespace at the start of the output. Whitespace at the start of the reasoning and right
after ``</think>`` is dropped (the templates write ``<think>\\n`` and ``</think>\\n\\n``). A
block the output never closes (max_tokens cut it) is all reasoning: nothing is lost. Only the
output is split: markers the user wrote are prompt text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer
    from .template import ChatTemplate

__all__ = ["THINK_CLOSE", "THINK_OPEN", "ReasoningSplitter", "asplit_chunks",
           "prompt_opens_reasoning", "reasoning_mode", "split_chunks", "split_reasoning",
           "split_result", "template_reasons"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_BEFORE, _INSIDE, _AFTER = 0, 1, 2


def template_reasons(source: str) -> bool:
    """True when a chat template's source writes reasoning blocks (both markers)."""
    return THINK_OPEN in source and THINK_CLOSE in source


def prompt_opens_reasoning(prompt_tail: str) -> bool:
    """True when the rendered prompt (its last few tokens' text are enough) ends in an
    open ``<think>``: the model's output starts inside the block."""
    return prompt_tail.rstrip().endswith(THINK_OPEN)


PROMPT_TAIL_TOKENS = 8
"""The prompt's last tokens read to see whether it ends in an open ``<think>``."""


def reasoning_mode(template: ChatTemplate, tokenizer: Tokenizer, ids: list[int]) -> bool | None:
    """None when `template` writes no reasoning blocks (the output is not split); else
    whether the prompt `ids` it rendered opened the block (the output starts inside it)."""
    if not template_reasons(template.source):
        return None
    return prompt_opens_reasoning(tokenizer.decode(ids[-PROMPT_TAIL_TOKENS:]))


def _held_prefix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a start of `marker` (shorter than
    the marker: a whole one is found by str.find first)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class ReasoningSplitter:
    """Splits an output fed piece by piece: :meth:`feed` returns each piece's
    ``(reasoning, answer)`` deltas, :meth:`finish` what is held back at the end. ``opened``:
    the prompt opened the block (:func:`prompt_opens_reasoning`)."""

    def __init__(self, opened: bool = False) -> None:
        self._state = _INSIDE if opened else _BEFORE
        self._skip_ws = opened  # drop whitespace at the start of the reasoning / the answer
        self._held = ""  # a possible marker prefix (bounded by the marker's length)
        self._lead: list[str] = []  # whitespace before anything else of the output

    def feed(self, piece: str) -> tuple[str, str]:
        reasoning: list[str] = []
        answer: list[str] = []
        text = piece
        if self._state == _BEFORE:
            if not self._held:
                stripped = text.lstrip()
                self._lead.append(text[:len(text) - len(stripped)])
                text = stripped
                if not text:
                    return "", ""
            text = self._held + text
            self._held = ""
            if text.startswith(THINK_OPEN):
                self._state, self._skip_ws, self._lead = _INSIDE, True, []
                text = text[len(THINK_OPEN):]
            elif THINK_OPEN.startswith(text):
                self._held = text
                return "", ""
            else:
                self._state = _AFTER
                text = "".join(self._lead) + text
                self._lead = []
        if self._state == _INSIDE:
            text = self._held + text
            self._held = ""
            if self._skip_ws:
                text = text.lstrip()
                if not text:
                    return "", ""
                self._skip_ws = False
            at = text.find(THINK_CLOSE)
            if at < 0:
                k = _held_prefix(text, THINK_CLOSE)
                self._held = text[len(text) - k:]
                return text[:len(text) - k], ""
            reasoning.append(text[:at])
            text = text[at + len(THINK_CLOSE):]
            self._state, self._skip_ws = _AFTER, True
        if self._skip_ws:
            text = text.lstrip()
            if text:
                self._skip_ws = False
        answer.append(text)
        return "".join(reasoning), "".join(answer)

    def finish(self) -> tuple[str, str]:
        """What was held back: a block never closed is reasoning; an output that was only
        whitespace or the start of ``<think>`` is answer."""
        held, self._held = self._held, ""
        if self._state == _INSIDE:
            return held, ""
        if self._state == _BEFORE:
            lead, self._lead = "".join(self._lead), []
            return "", lead + held
        return "", held


def split_reasoning(text: str, opened: bool = False) -> tuple[str, str]:
    """A whole output's ``(reasoning, answer)`` (the same split as fed in pieces)."""
    s = ReasoningSplitter(opened)
    r1, a1 = s.feed(text)
    r2, a2 = s.finish()
    return r1 + r2, a1 + a2


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
