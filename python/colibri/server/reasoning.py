"""Reasoning in the server's answers (docs/serving.md, Reasoning): a request whose chat
template writes ``<think>...</think>`` blocks (colibri.chat.reasoning.template_reasons) has
its output split into reasoning and answer; the answer alone goes on to the tool-call
parser. The request controls: OpenAI's ``chat_template_kwargs`` (vLLM's name),
``reasoning_effort`` (a template variable) and ``reasoning_budget`` (colibri's), Anthropic's
``thinking`` (the template's ``enable_thinking``, and its ``budget_tokens`` as the
generation's reasoning budget, colibri.generate.reasoning_budget)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..chat.reasoning import ReasoningMode
from ..chat.reasoning import reasoning_mode as _mode
from ..chat.template import ChatTemplate
from ..sampling.reasoning_split import Splitter, make_splitter, split_text
from .errors import ApiError

if TYPE_CHECKING:
    from ..model import Model
    from .options import Plan
    from .wire import AnthropicThinking

__all__ = ["reasoning_mode", "reasoning_splitter", "split_output", "thinking_budget",
           "thinking_variables"]

def reasoning_mode(model: Model, template: ChatTemplate, ids: list[int]) -> ReasoningMode | None:
    """How the output is split (colibri.chat.reasoning.reasoning_mode); None: not at all."""
    return _mode(template, model.tokenizer, ids)


def reasoning_splitter(p: Plan) -> Splitter | None:
    return None if p.reasoning is None else make_splitter(p.reasoning)


def split_output(p: Plan, text: str) -> tuple[str, str]:
    """A whole output's (reasoning, answer); ("", text) when the template does not reason."""
    return ("", text) if p.reasoning is None else split_text(text, p.reasoning)


def thinking_variables(thinking: AnthropicThinking | None) -> dict[str, Any]:
    """Anthropic's ``thinking`` as template variables: ``enable_thinking`` (what the Qwen3,
    GLM and DeepSeek templates read); nothing when absent (the template's default)."""
    return {} if thinking is None else {"enable_thinking": thinking.type == "enabled"}


def thinking_budget(thinking: AnthropicThinking | None, max_tokens: int) -> int | None:
    """Anthropic's ``budget_tokens`` as the generation's reasoning budget (None: no cap).
    As in Anthropic's API it must be below ``max_tokens``, which counts the thinking too;
    Anthropic's floor of 1,024 is not kept (a local model may be asked to think less)."""
    if thinking is None or thinking.type != "enabled" or thinking.budget_tokens is None:
        return None
    if thinking.budget_tokens >= max_tokens:
        raise ApiError(400, f"thinking.budget_tokens ({thinking.budget_tokens}) must be less "
                            f"than max_tokens ({max_tokens}), which counts the thinking too",
                       param="thinking.budget_tokens")
    return thinking.budget_tokens
