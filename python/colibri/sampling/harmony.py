"""Reasoning split from the answer in OpenAI's harmony format (gpt-oss).

A harmony answer is a run of messages, each ``HEADER<|message|>BODY`` ended by
``<|end|>``, ``<|return|>`` or ``<|call|>``; the next one starts with ``<|start|>`` and its
role (the template's generation prompt writes the first one's ``<|start|>assistant``, so
the output starts at its header). The header names the channel (``<|channel|>analysis``,
``final`` or ``commentary``) and, for a tool call, the recipient (``to=functions.NAME``,
before or after the channel).

:class:`HarmonySplitter` routes the bodies as they are generated: ``analysis`` is reasoning,
``final`` and a ``commentary`` message without a recipient (a preamble to the user) are
answer, and a message with a recipient (a tool call) goes to the answer verbatim, header
and markers included, for the tool-call parser to read. Text outside any message, a header
that never reaches ``<|message|>`` within MAX_HEADER characters, and an output cut inside
a header are answer text: nothing is lost. Linear time: it holds back at most a possible
marker's start (under 14 characters) and a header being read.
"""

from __future__ import annotations

__all__ = ["HARMONY_CLOSING", "MAX_HEADER", "HarmonySplitter", "prompt_opens_harmony"]

START, MESSAGE = "<|start|>", "<|message|>"
CHANNEL = "<|channel|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>")
MAX_HEADER = 512
"""Most characters of one message's header (gpt-oss writes a few dozen)."""

HARMONY_CLOSING = "<|end|>" + START + "assistant" + CHANNEL + "final" + MESSAGE
"""What ends the analysis message and opens the final answer (the reasoning budget writes
it, colibri.generate.reasoning_budget)."""

_HEADER, _BODY, _BETWEEN = 0, 1, 2
_REASONING, _ANSWER, _CALL = 0, 1, 2


def prompt_opens_harmony(prompt_tail: str) -> bool:
    """True when a rendered prompt ends in harmony's generation prompt (the output starts
    at the assistant message's header)."""
    return prompt_tail.rstrip().endswith(START + "assistant")


def _held(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that starts one of `markers`."""
    longest = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), longest, -1):
            if m.startswith(text[-k:]):
                longest = k
                break
    return longest


def _first(text: str, markers: tuple[str, ...]) -> tuple[int, str]:
    """The earliest of `markers` in `text`: (index, marker), or (-1, "")."""
    best, found = -1, ""
    for m in markers:
        i = text.find(m)
        if i >= 0 and (best < 0 or i < best):
            best, found = i, m
    return best, found


def _kind(header: str) -> int:
    if "to=" in header:
        return _CALL
    at = header.find(CHANNEL)
    words = header[at + len(CHANNEL):].split() if at >= 0 else []
    return _REASONING if words and words[0].startswith("analysis") else _ANSWER


class HarmonySplitter:
    """Splits a harmony output fed piece by piece into ``(reasoning, answer)`` deltas
    (:meth:`feed`); :meth:`finish` gives what is held back at the end."""

    def __init__(self) -> None:
        self._state = _HEADER
        self._kind = _ANSWER
        self._buf = ""  # unread text: a header, or a possible marker's start
        self._started = False  # this message's header came after <|start|>

    @property
    def inside(self) -> bool:
        """True while the output is in an ``analysis`` message's body."""
        return self._state == _BODY and self._kind == _REASONING

    def feed(self, piece: str) -> tuple[str, str]:
        reasoning: list[str] = []
        answer: list[str] = []
        self._buf += piece
        while self._buf and self._step(reasoning, answer):
            pass
        return "".join(reasoning), "".join(answer)

    def _step(self, reasoning: list[str], answer: list[str]) -> bool:
        """Reads what it can of the buffer; False when it must wait for more text."""
        buf = self._buf
        if self._state == _HEADER:
            at = buf.find(MESSAGE)
            if at < 0:
                if len(buf) > MAX_HEADER:  # not harmony after all: plain answer text
                    answer.append(self._opening() + buf)
                    self._buf, self._state = "", _BETWEEN
                    return True
                return False
            header = buf[:at]
            self._kind = _kind(header)
            if self._kind == _CALL:
                answer.append(self._opening() + header + MESSAGE)
            self._buf, self._state = buf[at + len(MESSAGE):], _BODY
            return True
        if self._state == _BODY:
            at, end = _first(buf, ENDS)
            body = buf if at < 0 else buf[:at]
            keep = _held(body, ENDS) if at < 0 else 0
            out = reasoning if self._kind == _REASONING else answer
            out.append(body[:len(body) - keep])
            if self._kind == _CALL and at >= 0:
                answer.append(end)
            if at < 0:
                self._buf = body[len(body) - keep:]
                return False
            self._buf, self._state = buf[at + len(end):], _BETWEEN
            return True
        at = buf.find(START)  # _BETWEEN: text outside a message is answer
        if at < 0:
            keep = _held(buf, (START,))
            answer.append(buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        answer.append(buf[:at])
        self._buf, self._state, self._started = buf[at + len(START):], _HEADER, True
        return True

    def _opening(self) -> str:
        return START if self._started else ""

    def finish(self) -> tuple[str, str]:
        """What was held back: a header never finished is answer text, the end of an
        ``analysis`` body is reasoning."""
        held, self._buf = self._buf, ""
        if self._state == _HEADER:
            return "", (self._opening() + held) if held or self._started else ""
        if self._state == _BODY and self._kind == _REASONING:
            return held, ""
        return "", held
