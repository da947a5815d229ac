"""A cap on a generation's reasoning: at most ``budget`` tokens of it, then colibri ends it
for the model.

The families that reason (a ``<think>...</think>`` block, or gpt-oss's harmony
``analysis`` channel) have no budget of their own; Qwen's model cards and vLLM's thinking
budget end the block by writing its closing marker into the output once the budget is
spent, and the model then answers. This stage does that: it reads the output as text (the
format's splitter, colibri.sampling.reasoning_split, fed by a stream decoder, so a marker
split over tokens, or written as one added token, is found the same way), counts the tokens
generated while the reasoning is open, and when the count reaches the budget forces the
tokens of the format's closing text (``"\\n</think>\\n\\n"``; harmony's ``<|end|>`` and the
final channel's header) one at a time (every other logit masked, so logprobs, penalties and
the sampler see a one-token choice). The forced tokens count against ``max_tokens`` like
any other.

The format, and whether the output starts inside the reasoning, are read off the prompt's
last tokens (colibri.sampling.reasoning_split.mode_from_prompt). An output that never
reasons is never touched; a budget of 0 closes the reasoning as soon as it is open.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..sampling.reasoning_split import Splitter, closing_text, make_splitter, mode_from_prompt
from ..sampling.think_block import PROMPT_TAIL_TOKENS

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer

__all__ = ["ReasoningBudget"]


class ReasoningBudget:
    """The stage of one generation (see the module docstring)."""

    def __init__(self, budget: int, tokenizer: Tokenizer) -> None:
        self.budget = budget
        self._tokenizer = tokenizer
        self._closing: list[int] = []
        self._splitter: Splitter | None = None
        self._detok = tokenizer.stream(strip_leading_space=False)
        self._spent = 0  # tokens chosen while the block was open
        self._forced: list[int] = []  # closing tokens still to write

    def start(self, history: Sequence[int]) -> None:
        """Reads where the output starts off the prompt (the tail of `history`)."""
        tail = self._tokenizer.decode(list(history[-PROMPT_TAIL_TOKENS:]))
        mode = mode_from_prompt(tail)
        self._splitter = make_splitter(mode)
        self._closing = self._tokenizer.encode(closing_text(mode), add_special_tokens=False)

    def apply(self, logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.floating[Any]]:
        """`logits` as they are, or masked to the next closing token once the budget is
        spent."""
        s = self._splitter
        if not self._forced and s is not None and s.inside and self._spent >= self.budget:
            self._forced = list(self._closing)
        if not self._forced:
            return logits
        tok = self._forced[0]
        out = np.full_like(logits, -np.inf)
        out[tok] = logits[tok] if np.isfinite(logits[tok]) else 0.0
        return out

    def advance(self, token_id: int) -> None:
        """Records the chosen token."""
        if self._forced and self._forced[0] == token_id:
            self._forced.pop(0)
        s = self._splitter
        if s is None:
            return
        was_inside = s.inside
        s.feed(self._detok.add(token_id))
        if was_inside or s.inside:
            self._spent += 1
