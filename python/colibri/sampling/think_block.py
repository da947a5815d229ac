"""The text of a ``<think>...</think>`` reasoning block in a model's output, split from the
answer as it is generated (the families that reason so: DeepSeek-R1 and V3.1+, GLM-4.5+,
Qwen3 / 3.5, MiniMax-M2, Kimi-K2-thinking).

:class:`ReasoningSplitter` splits the model's output, fed in pieces as they are generated, into
(reasoning, answer) deltas, in time linear in the output: only one block, at the start of the
output (after whitespace), is reasoning; markers later in the answer stay answer text, as in
the families' own parsers. It holds back at most a possible marker prefix (under 8 characters)
and whitespace at the start of the output. Whitespace at the start of the reasoning and right
after ``</think>`` is dropped (the templates write ``<think>\\n`` and ``</think>\\n\\n``). A
block the output never closes (max_tokens cut it) is all reasoning: nothing is lost. Only the
output is split: markers the user wrote are prompt text.

It lives on the sampling floor, beside the stop-string checker, because the decode loop
reads it too (colibri.generate.reasoning_budget); colibri.chat.reasoning adds what depends on
chat templates and results.
"""

from __future__ import annotations

__all__ = ["PROMPT_TAIL_TOKENS", "THINK_CLOSE", "THINK_OPEN", "ReasoningSplitter",
           "prompt_opens_reasoning", "split_reasoning"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_BEFORE, _INSIDE, _AFTER = 0, 1, 2


def prompt_opens_reasoning(prompt_tail: str) -> bool:
    """True when the rendered prompt (its last few tokens' text are enough) ends in an
    open ``<think>``: the model's output starts inside the block."""
    return prompt_tail.rstrip().endswith(THINK_OPEN)


PROMPT_TAIL_TOKENS = 16
"""The prompt's last tokens read to see whether it ends in an open ``<think>``."""


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

    @property
    def inside(self) -> bool:
        """True while the output fed so far is inside the reasoning block."""
        return self._state == _INSIDE

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
