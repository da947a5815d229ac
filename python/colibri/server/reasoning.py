"""Reasoning in the server's answers (docs/serving.md, Reasoning): a request whose chat
template writes ``<think>...</think>`` blocks (colibri.chat.reasoning.template_reasons) has
its output split into reasoning and answer; the answer alone goes on to the tool-call
parser. The request controls: OpenAI's ``chat_template_kwargs`` (vLLM's name), Anthropic's
``thinking`` (the template's ``enable_thinking``; its budget is not enforced yet)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..chat.reasoning import ReasoningSplitter, split_reasoning
from ..chat.reasoning import reasoning_mode as _mode
from ..chat.template import ChatTemplate

if TYPE_CHECKING:
    from ..model import Model
    from .options import Plan
    from .wire import AnthropicThinking

__all__ = ["reasoning_mode", "reasoning_splitter", "split_output", "thinking_variables"]

def reasoning_mode(model: Model, template: ChatTemplate, ids: list[int]) -> bool | None:
    """None when `template` writes no reasoning blocks (the output is not split); else
    whether the prompt `ids` opened the block (the output starts inside it)."""
    return _mode(template, model.tokenizer, ids)


def reasoning_splitter(p: Plan) -> ReasoningSplitter | None:
    return None if p.reasoning is None else ReasoningSplitter(p.reasoning)


def split_output(p: Plan, text: str) -> tuple[str, str]:
    """A whole output's (reasoning, answer); ("", text) when the template does not reason."""
    return ("", text) if p.reasoning is None else split_reasoning(text, p.reasoning)


def thinking_variables(thinking: AnthropicThinking | None) -> dict[str, Any]:
    """Anthropic's ``thinking`` as template variables: ``enable_thinking`` (what the Qwen3,
    GLM and DeepSeek templates read); nothing when absent (the template's default)."""
    return {} if thinking is None else {"enable_thinking": thinking.type == "enabled"}
