"""Reasoning split from the answer where a template writes them as tagged channels (Kimi-K3:
``<|open|>think<|sep|>REASONING<|close|>think<|sep|><|open|>response<|sep|>ANSWER
<|close|>response<|sep|>``, then its tool section).

The generation prompt opens the first channel (``think`` with thinking on, ``response``
with it off), so the output starts inside it. :class:`TaggedSplitter` routes the reasoning
channel's text to reasoning and the response channel's to the answer, drops the channel
markers, and passes everything after the response channel (the tool section, for the
tool-call parser) to the answer verbatim. Text where a marker was expected, and an output
cut anywhere, stay where they are: nothing is lost. Linear time: it holds back at most a
possible marker's start.
"""

from __future__ import annotations

__all__ = ["K3_CLOSING", "K3_RESPONSE", "K3_THINK", "TaggedSplitter", "k3_prompt_channel"]

K3_THINK, K3_RESPONSE = "<|open|>think<|sep|>", "<|open|>response<|sep|>"
_THINK_END, _RESPONSE_END = "<|close|>think<|sep|>", "<|close|>response<|sep|>"
_MESSAGE_END = "<|close|>message<|sep|>"
K3_CLOSING = _THINK_END + K3_RESPONSE
"""What ends Kimi-K3's reasoning and opens its response (the reasoning budget writes it)."""

_REASONING, _OPENING, _ANSWER, _AFTER = 0, 1, 2, 3


def k3_prompt_channel(prompt_tail: str) -> str | None:
    """``"think"`` or ``"response"`` when a prompt ends by opening that Kimi-K3 channel."""
    tail = prompt_tail.rstrip()
    if tail.endswith(K3_THINK):
        return "think"
    if tail.endswith(K3_RESPONSE):
        return "response"
    return None


def _held(text: str, marker: str) -> int:
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class TaggedSplitter:
    """Splits a Kimi-K3 output fed piece by piece into ``(reasoning, answer)`` deltas;
    ``thinking``: the prompt opened the think channel (else the response channel)."""

    def __init__(self, thinking: bool) -> None:
        self._state = _REASONING if thinking else _ANSWER
        self._buf = ""

    @property
    def inside(self) -> bool:
        """True while the output is in the reasoning channel."""
        return self._state == _REASONING

    def feed(self, piece: str) -> tuple[str, str]:
        reasoning: list[str] = []
        answer: list[str] = []
        self._buf += piece
        while self._buf and self._step(reasoning, answer):
            pass
        return "".join(reasoning), "".join(answer)

    def _step(self, reasoning: list[str], answer: list[str]) -> bool:
        buf = self._buf
        if self._state == _AFTER:  # the tool section, verbatim; the message's end dropped
            at = buf.find(_MESSAGE_END)
            if at < 0:
                keep = _held(buf, _MESSAGE_END)
                answer.append(buf[:len(buf) - keep])
                self._buf = buf[len(buf) - keep:]
                return False
            answer.append(buf[:at])
            self._buf = buf[at + len(_MESSAGE_END):]
            return True
        if self._state == _OPENING:  # after the reasoning: the response channel opens
            if buf.startswith(K3_RESPONSE):
                self._buf, self._state = buf[len(K3_RESPONSE):], _ANSWER
                return True
            if K3_RESPONSE.startswith(buf):
                return False  # maybe its start: wait
            self._state = _ANSWER  # something else: answer text as it is
            return True
        end = _THINK_END if self._state == _REASONING else _RESPONSE_END
        out = reasoning if self._state == _REASONING else answer
        at = buf.find(end)
        if at < 0:
            keep = _held(buf, end)
            out.append(buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        out.append(buf[:at])
        self._buf = buf[at + len(end):]
        self._state = _OPENING if self._state == _REASONING else _AFTER
        return True

    def finish(self) -> tuple[str, str]:
        """What was held back: in the reasoning channel it is reasoning, else answer."""
        held, self._buf = self._buf, ""
        return (held, "") if self._state == _REASONING else ("", held)
