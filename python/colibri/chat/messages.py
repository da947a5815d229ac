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
    _check_tools_depth(tools)
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


MAX_TOOLS_DEPTH = 64
"""Deepest nesting of arrays and objects in ``tools`` (as the server's bodies,
server/wire_checks.MAX_DEPTH, and GrammarLimits.max_schema_depth): the templates'
``tojson`` recurses, and a few hundred levels raised RecursionError (issue 35, item 4)."""


def _check_tools_depth(tools: Tools | None) -> None:
    """InvalidRequestError for ``tools`` nested deeper than MAX_TOOLS_DEPTH (an iterative
    walk: it never recurses itself)."""
    stack: list[tuple[Any, int]] = [(tools, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, Mapping):
            items: Any = value.values()
        elif isinstance(value, list | tuple):
            items = value
        else:
            continue
        if depth >= MAX_TOOLS_DEPTH:
            raise InvalidRequestError(f"tools are nested deeper than {MAX_TOOLS_DEPTH} levels "
                                      f"of arrays and objects; flatten their parameters")
        stack.extend((item, depth + 1) for item in items)
