"""Fitting a prompt into the context when the caller allows truncation (``truncate=True``,
``colibri run --truncate``); docs/api.md, "Prompts longer than the context".

A raw prompt keeps its end. A conversation keeps its shape instead, since cutting the
start of its rendered text would drop the system message and the template's opening:

1. its leading system (or developer) messages and its last user message (with whatever
   follows it) always stay; whole turns before that (a user message and the answers, tool
   calls and results up to the next user message) are dropped, oldest first, as few as
   make it fit;
2. if system and last turn still do not fit, the last user message loses its middle: its
   first and last halves of what fits stay, joined by :data:`CUT_MARK`, so an instruction
   at either end survives (the rest of the template is untouched);
3. if even that cannot fit (the system message and the template's own text take the whole
   room), the rendered prompt keeps its end, as a raw prompt does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..tokenizers import Tokenizer

__all__ = ["CUT_MARK", "FittedPrompt", "fit_conversation", "fit_tokens"]

CUT_MARK = "\n[...]\n"
"""What stands for the middle cut out of a user message."""

_SYSTEM_ROLES = ("system", "developer")
_CUT_TRIES = 8  # re-renders when a cut's edges tokenize differently (each cuts more)


@dataclass(frozen=True)
class FittedPrompt:
    """A prompt's token ids as prefilled, and what was cut to fit them: ``dropped_messages``
    whole messages (oldest turns of a conversation), ``cut_tokens`` tokens from the middle
    of the last user message (``cut_from="middle"``) or from the start of the prompt
    (``"start"``: a raw prompt, or a conversation whose fixed part alone is too long)."""

    ids: list[int]
    dropped_messages: int = 0
    cut_tokens: int = 0
    cut_from: Literal["middle", "start"] | None = None

    @property
    def truncated(self) -> bool:
        return bool(self.dropped_messages or self.cut_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {"dropped_messages": self.dropped_messages, "cut_tokens": self.cut_tokens,
                "cut_from": self.cut_from}


def fit_tokens(ids: list[int], room: int) -> FittedPrompt:
    """A raw prompt's ids: their last `room` when they are longer."""
    if len(ids) <= room:
        return FittedPrompt(ids)
    return FittedPrompt(ids[len(ids) - room:], cut_tokens=len(ids) - room, cut_from="start")


def fit_conversation(messages: Sequence[Mapping[str, Any]],
                     render: Callable[[list[dict[str, Any]]], list[int]],
                     tokenizer: Tokenizer, room: int, *,
                     special_tokens_in_content: bool = False) -> FittedPrompt:
    """`messages` rendered to ids (`render`: through the chat template, generation prompt
    included) in at most `room` tokens, by the rules in the module docstring.
    `special_tokens_in_content`: whether `render` matches control tokens in message text
    (colibri.chat.plain_content); the cut counts the message's tokens the same way."""
    msgs = [dict(m) for m in messages]
    full = render(msgs)
    if len(full) <= room:
        return FittedPrompt(full)
    first = 0
    while first < len(msgs) and msgs[first].get("role") in _SYSTEM_ROLES:
        first += 1
    users = [i for i in range(first, len(msgs)) if msgs[i].get("role") == "user"]
    if not users:  # no turn to keep whole: only the raw rule applies
        end = fit_tokens(full, room)
        return FittedPrompt(end.ids, cut_tokens=end.cut_tokens, cut_from="start")
    last = users[-1]
    # The turns before the last user message start at `first` and at each user message.
    starts = sorted({first, *users[:-1]}) if last > first else []

    def without(k: int) -> list[dict[str, Any]]:  # the k oldest turns dropped
        cut = starts[k] if k < len(starts) else last
        return msgs[:first] + msgs[cut:]

    lo, hi = 1, len(starts)  # the fewest turns to drop: the smallest k that fits
    fits_at: list[int] | None = None
    while lo <= hi:
        k = (lo + hi) // 2
        ids = render(without(k))
        if len(ids) <= room:
            fits_at, hi = ids, k - 1
        else:
            lo = k + 1
    if fits_at is not None:
        return FittedPrompt(fits_at, dropped_messages=len(msgs) - len(without(lo)))
    kept = without(len(starts))  # the system messages, then the last user message on
    cut = _cut_middle(kept, first, render, tokenizer, room, special_tokens_in_content)
    if cut is not None:
        ids, n_cut = cut
        return FittedPrompt(ids, len(msgs) - len(kept), n_cut, "middle")
    end = fit_tokens(full, room)
    return FittedPrompt(end.ids, cut_tokens=end.cut_tokens, cut_from="start")


def _cut_middle(msgs: list[dict[str, Any]], index: int,
                render: Callable[[list[dict[str, Any]]], list[int]], tokenizer: Tokenizer,
                room: int, special: bool) -> tuple[list[int], int] | None:
    """`msgs` rendered in `room` tokens with the middle of message `index` (the last user
    message) cut out, and how many of its tokens went; None when its text is not a plain
    string or no cut of it fits."""
    if not isinstance(msgs[index].get("content"), str):
        return None
    content = tokenizer.encode(msgs[index]["content"], add_special_tokens=False, special=special)
    over = len(render(msgs)) - room
    keep = len(content) - over - len(tokenizer.encode(CUT_MARK, add_special_tokens=False))
    for _ in range(_CUT_TRIES):
        if keep <= 0:
            return None
        head = keep - keep // 2
        first = _word_end(tokenizer.decode(content[:head]))
        rest = _word_start(tokenizer.decode(content[len(content) - (keep - head):]))
        text = first + CUT_MARK + rest
        ids = render([*msgs[:index], {**msgs[index], "content": text}, *msgs[index + 1:]])
        if len(ids) <= room:
            kept = (len(tokenizer.encode(first, add_special_tokens=False, special=special))
                    + len(tokenizer.encode(rest, add_special_tokens=False, special=special)))
            return ids, len(content) - kept
        keep -= len(ids) - room
    return None


# The cut's edges move to the nearest whitespace (within a word's length) so that no word
# is left in pieces; a slice that starts or ends inside a character's bytes loses that part.
_PARTIAL_END = re.compile(r"(?<=\s)\S{0,24}\Z")
_PARTIAL_START = re.compile(r"\A\S{0,24}(?=\s)")


def _word_end(head: str) -> str:
    head = head.rstrip("\ufffd")
    m = _PARTIAL_END.search(head)
    return (head[:m.start()] if m else head).rstrip()


def _word_start(tail: str) -> str:
    tail = tail.lstrip("\ufffd")
    m = _PARTIAL_START.match(tail)
    return (tail[m.end():] if m else tail).lstrip()
