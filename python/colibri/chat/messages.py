"""Conversations for chat templates: messages from what callers pass, rendered with a
model's template (``Model.chat``, ``apply_chat_template`` and ``count_tokens``).

The rule for prompts (docs/api.md, "Raw or templated"): a ``str`` prompt given to
``generate``/``stream`` is a raw completion; ``messages=`` and :meth:`chat` go through
the model's chat template. ``apply_chat_template`` shows (or tokenizes) exactly what the
templated calls prefill.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequestError
from .nesting import check_nesting
from .tool_templates import has_tool_turns, template_for_tools

if TYPE_CHECKING:
    from .template import ChatTemplate

__all__ = ["Messages", "Tools", "as_messages", "render_conversation"]

Messages = Sequence[Mapping[str, Any]]
Tools = Sequence[Mapping[str, Any]]


def as_messages(messages: str | Messages, system: str | None = None) -> list[dict[str, Any]]:
    """A conversation from a str (one user message) or a list of messages, with an
    optional system message first."""
    if isinstance(messages, str):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": messages}]
    elif isinstance(messages, Sequence):
        msgs = [dict(m) if isinstance(m, Mapping) else m for m in messages]  # type: ignore[misc]
    else:
        raise InvalidRequestError(
            f"messages must be a str or a list of {{'role': ..., 'content': ...}} mappings, "
            f"not {type(messages).__name__}"
        )
    if system is not None:
        msgs.insert(0, {"role": "system", "content": system})
    return msgs


def render_conversation(template: ChatTemplate, messages: str | Messages, *,
                        tools: Tools | None = None, add_generation_prompt: bool = True,
                        **variables: Any) -> str:
    """The text `template` makes of `messages` (a str is one user message): what
    ``Model.apply_chat_template`` returns and templated generations prefill.

    A conversation with ``tools``, or with tool calls or results in it, goes through
    :func:`~colibri.chat.tool_templates.template_for_tools`: `template` when it renders
    tools, else colibri's shipped tool template for its family (ChatML). ``tools`` that no
    template would render raise InvalidRequestError rather than being dropped."""
    msgs = as_messages(messages)
    check_nesting(tools, "tools")
    if tools is not None or has_tool_turns(msgs):
        chosen = template_for_tools(template)
        if chosen is not None:
            template = chosen
        elif tools is not None:
            raise InvalidRequestError(
                f"the model's {template.name} does not render tools, and colibri ships no "
                "tool template for its format (it has one for ChatML templates): set "
                "model.chat_template to a Jinja template that renders them (docs/api.md), "
                "or describe the tools in a system message"
            )
    return template.render(msgs, add_generation_prompt=add_generation_prompt,
                           tools=tools, **variables)
