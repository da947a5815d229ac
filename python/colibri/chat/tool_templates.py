"""Chat templates colibri ships for tool use, for models whose own template renders no tools
(SmolLM2-Instruct's, the default model's, is plain ChatML with no ``tools``).

Each entry of :data:`TOOL_TEMPLATES` is data: the Jinja source, the tool-call format its
calls are written in (a ``colibri.server.tool_formats.FORMATS`` name, the one the server
parses and forces), and the markers that say a model's template is of its family (all of
them in the template's source). :func:`template_for_tools` picks the template a
conversation with tools is rendered with:

1. the template in use, when it renders tools (its source mentions ``tools``);
2. else the first shipped entry whose markers its source holds, compiled with the same
   BOS/EOS tokens;
3. else none: the caller raises an error naming how to pass a template that renders them
   (``model.chat_template = ...`` in Python, ``--chat-template`` for ``colibri serve``).

Conversations without tools keep the model's own template, so plain chats are unchanged.

``chatml-tools``: ChatML turns (``<|im_start|>role ... <|im_end|>``); with tools, the
system turn lists each function's JSON definition inside ``<tools></tools>`` and asks for
calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (the ``hermes``
format, the convention of the Hermes and Qwen ChatML models); an assistant's earlier calls
are written back in that form, and ``tool`` results go back as a user turn of
``<tool_response>`` blocks. Written for colibri (docs/serving.md, "Tool calls").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .template import ChatTemplate

__all__ = ["CHATML_TOOLS", "TOOL_TEMPLATES", "ToolTemplate", "has_tool_turns",
           "renders_tools", "shipped_tool_template", "template_for_tools"]


@dataclass(frozen=True)
class ToolTemplate:
    """A tool-capable template colibri ships: ``source`` (Jinja), ``call_format`` (the
    ``colibri.server.tool_formats`` format its calls are written in) and ``fits`` (markers
    that must all be in a model's template for this one to stand in for it)."""

    name: str
    source: str
    call_format: str
    fits: tuple[str, ...]

    def suits(self, source: str) -> bool:
        return all(m in source for m in self.fits)


_CHATML_TOOLS_SOURCE = """\
{%- macro call_text(call) -%}
{%- set fn = call['function'] if call['function'] is defined else call -%}
{%- set args = fn['arguments'] if fn['arguments'] is defined else {} -%}
<tool_call>
{"name": {{ fn['name'] | tojson }}, "arguments": \
{{ args if args is string else args | tojson }}}
</tool_call>
{%- endmacro -%}
{%- if messages and messages[0]['role'] == 'system' -%}
{%- set system = messages[0]['content'] -%}
{%- set turns = messages[1:] -%}
{%- else -%}
{%- set system = none -%}
{%- set turns = messages -%}
{%- endif -%}
{%- if tools -%}
{{- '<|im_start|>system\\n' -}}
{{- system if system is not none else 'You are a helpful assistant.' -}}
{{- '\\n\\nYou can call functions to help you answer. Their definitions, one JSON object \
per line:\\n<tools>\\n' -}}
{%- for tool in tools -%}
{{- (tool['function'] if tool['function'] is defined else tool) | tojson -}}{{- '\\n' -}}
{%- endfor -%}
{{- '</tools>\\n\\nTo call a function, answer with a <tool_call></tool_call> block holding \
a JSON object with the function\\'s "name" and its "arguments", one block per call:\\n\
<tool_call>\\n{"name": "<function name>", "arguments": {"<parameter>": <value>}}\\n\
</tool_call>\\nEach result comes back in a <tool_response></tool_response> block.\
<|im_end|>\\n' -}}
{%- elif system is not none -%}
{{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' -}}
{%- endif -%}
{%- for m in turns -%}
{%- if m['role'] == 'tool' -%}
{%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<|im_start|>user\\n' -}}
{%- else -%}{{- '\\n' -}}{%- endif -%}
{{- '<tool_response>\\n' + m['content'] + '\\n</tool_response>' -}}
{%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- elif m['role'] == 'assistant' and m['tool_calls'] -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if m['content'] -%}{{- m['content'] + '\\n' -}}{%- endif -%}
{%- for call in m['tool_calls'] -%}
{%- if not loop.first -%}{{- '\\n' -}}{%- endif -%}{{- call_text(call) -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""

CHATML_TOOLS = ToolTemplate("chatml-tools", _CHATML_TOOLS_SOURCE, call_format="hermes",
                            fits=("<|im_start|>", "<|im_end|>"))

TOOL_TEMPLATES: tuple[ToolTemplate, ...] = (CHATML_TOOLS,)
"""The shipped tool templates, tried in order (the first that suits a model's template)."""


def renders_tools(template: ChatTemplate) -> bool:
    """Whether the template uses the ``tools`` it is given (its source names them)."""
    return "tools" in template.source


def shipped_tool_template(source: str) -> ToolTemplate | None:
    """The first :data:`TOOL_TEMPLATES` entry that suits a template of this source."""
    return next((t for t in TOOL_TEMPLATES if t.suits(source)), None)


def template_for_tools(template: ChatTemplate) -> ChatTemplate | None:
    """The template a conversation with tools is rendered with: `template` itself when
    it renders tools, else the shipped one for its family (same BOS/EOS), else None."""
    if renders_tools(template):
        return template
    shipped = shipped_tool_template(template.source)
    if shipped is None:
        return None
    return ChatTemplate(shipped.source, bos_token=template.bos_token,
                        eos_token=template.eos_token,
                        name=f"colibri's {shipped.name} template")


def has_tool_turns(messages: Sequence[Mapping[str, Any]] | str) -> bool:
    """Whether a conversation carries tool calls or tool results (it then needs a template
    that writes them, as a request with tools does)."""
    if isinstance(messages, str):
        return False
    return any(isinstance(m, Mapping) and (m.get("role") == "tool" or m.get("tool_calls"))
               for m in messages)
