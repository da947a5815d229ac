"""Which reasoning format an output is in, and the splitter for it: ``<think>`` blocks
(colibri.sampling.think_block; ``think_opened`` when the prompt opened the block), harmony
channels (colibri.sampling.harmony, gpt-oss) or Kimi-K3's tagged channels
(colibri.sampling.tagged_channels; ``k3_think`` / ``k3_response``: the channel the prompt
opened). Every splitter has ``feed(piece) ->
(reasoning, answer)``, ``finish()`` and ``inside``."""

from __future__ import annotations

from typing import Literal, Protocol

from .harmony import HARMONY_CLOSING, HarmonySplitter, prompt_opens_harmony
from .tagged_channels import K3_CLOSING, TaggedSplitter, k3_prompt_channel
from .think_block import THINK_CLOSE, ReasoningSplitter, prompt_opens_reasoning

__all__ = ["ReasoningMode", "Splitter", "closing_text", "make_splitter", "mode_from_prompt",
           "split_text"]

ReasoningMode = Literal["think", "think_opened", "harmony", "k3_think", "k3_response"]


class Splitter(Protocol):
    @property
    def inside(self) -> bool: ...

    def feed(self, piece: str) -> tuple[str, str]: ...

    def finish(self) -> tuple[str, str]: ...


def make_splitter(mode: ReasoningMode) -> Splitter:
    if mode == "harmony":
        return HarmonySplitter()
    if mode in ("k3_think", "k3_response"):
        return TaggedSplitter(mode == "k3_think")
    return ReasoningSplitter(mode == "think_opened")


def split_text(text: str, mode: ReasoningMode) -> tuple[str, str]:
    """A whole output's ``(reasoning, answer)`` (the same split as fed in pieces)."""
    s = make_splitter(mode)
    r1, a1 = s.feed(text)
    r2, a2 = s.finish()
    return r1 + r2, a1 + a2


def closing_text(mode: ReasoningMode) -> str:
    """What ends the reasoning for the model, in its format's own layout."""
    if mode in ("k3_think", "k3_response"):
        return K3_CLOSING
    return HARMONY_CLOSING if mode == "harmony" else "\n" + THINK_CLOSE + "\n\n"


def mode_from_prompt(prompt_tail: str) -> ReasoningMode:
    """The format read off a prompt alone (no template at hand): harmony's generation
    prompt, a Kimi-K3 channel opened, an opened ``<think>``, or else a ``<think>`` block the
    output may open."""
    if prompt_opens_harmony(prompt_tail):
        return "harmony"
    channel = k3_prompt_channel(prompt_tail)
    if channel is not None:
        return "k3_think" if channel == "think" else "k3_response"
    return "think_opened" if prompt_opens_reasoning(prompt_tail) else "think"
