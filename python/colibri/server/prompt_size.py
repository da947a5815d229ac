"""Checks of a request's prompt made *before* it is rendered or tokenized, from sizes alone.

Tokenizing costs time linear in the text (about a second per megabyte on one core), and a
chat template's render grows with the message count, so both are bounded up front:

- at most ``max_messages`` messages;
- at most ``context_length x longest token`` characters of caller text. No token stands for
  more bytes than the vocabulary's longest token, and a character is at least one byte, so
  a text longer than that cannot fit in the context whatever the tokenizer does with it:
  the 400 it gets here is the one tokenizing would have given, only sooner. (A normalizer
  that deletes characters would break the argument; none of the supported families' does.)
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import ApiError

if TYPE_CHECKING:
    from ..model import Model
    from ..tokenizers import Tokenizer

DEFAULT_MAX_MESSAGES = 10_000
"""Messages per request (a long agent session has hundreds; each renders to tokens)."""


@dataclass(frozen=True)
class PromptLimits:
    """Limits checked before a prompt is rendered or tokenized (docs/serving.md, Limits)."""

    max_messages: int = DEFAULT_MAX_MESSAGES

    def __post_init__(self) -> None:
        if isinstance(self.max_messages, bool) or not isinstance(self.max_messages, int) \
                or self.max_messages < 1:
            raise ValueError(f"max_messages must be an integer >= 1 (got {self.max_messages!r})")


_LONGEST: weakref.WeakKeyDictionary[Tokenizer, int] = weakref.WeakKeyDictionary()


def longest_token_bytes(tokenizer: Tokenizer) -> int:
    """The most bytes any one token of `tokenizer` stands for (computed once, ~10 ms for a
    150k vocabulary)."""
    n = _LONGEST.get(tokenizer)
    if n is None:
        n = max((len(tokenizer.token_bytes(i)) for i in range(tokenizer.vocab_size)),
                default=1)
        _LONGEST[tokenizer] = n = max(n, 1)
    return n


def text_chars(values: Iterable[Any]) -> int:
    """Characters in every string inside `values` (dicts' keys and values, lists), walked
    without recursion; the server has bounded the nesting already (wire_checks)."""
    total = 0
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            for k, item in v.items():
                if isinstance(k, str):
                    total += len(k)
                stack.append(item)
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return total


def check_chars(model: Model, chars: int, param: str) -> None:
    """400 when `chars` characters of caller text cannot fit in the context."""
    ceiling = model.context_length * longest_token_bytes(model.tokenizer)
    if chars > ceiling:
        raise ApiError(400, f"the prompt has {chars:,} characters, more than the "
                            f"{model.context_length:,}-token context can hold even at the "
                            f"vocabulary's longest token ({ceiling:,} characters); shorten "
                            "it, or start the server with a larger --context-length",
                       param=param, code="context_length_exceeded")


def check_conversation(model: Model, limits: PromptLimits, messages: list[dict[str, Any]],
                       tools: list[dict[str, Any]] | None) -> None:
    """The message count and the caller text's length, before the template runs."""
    if len(messages) > limits.max_messages:
        raise ApiError(400, f"the request has {len(messages):,} messages; at most "
                            f"{limits.max_messages:,} are accepted (colibri serve "
                            "--max-messages)", param="messages")
    check_chars(model, text_chars([messages, tools or []]), "messages")


__all__ = ["DEFAULT_MAX_MESSAGES", "PromptLimits", "check_chars", "check_conversation",
           "longest_token_bytes", "text_chars"]
