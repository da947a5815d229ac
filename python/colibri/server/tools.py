"""Tool calls: which format a chat template writes them in (colibri.server.tool_formats:
Hermes/Qwen, GLM-4.5/4.6, DeepSeek-V3/R1, DeepSeek-V3.1, Kimi-K2, Qwen3-Coder/Qwen3.5,
MiniMax-M2, Llama 3.x, Mistral, gpt-oss), parsing them back out of
the text (:func:`parse_calls`; streams: colibri.server.tool_stream; :func:`split_answer`
also drops a call that max_tokens cut), and the grammar that forces one
(``tool_choice="required"`` or a named function: colibri.server.tool_grammars). Which
template renders the tools: colibri.chat.tool_templates.

A template that renders tools in a format not in the table (Command R's, functionary's,
DeepSeek-V3.2's DSML) still gets the tools in
its prompt, but its answers come back as plain text (``content``), never as
``tool_calls``, and ``tool_choice="required"``/named is refused there (docs/serving.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ColibriError
from ..generate.grammar_limits import GrammarLimits, check_tools
from ..generate.structured import Grammar
from .errors import ApiError
from .tool_formats import FORMATS, ToolCall, template_format
from .tool_grammars import BUILDERS, forced_grammar_text
from .tool_schema_shape import check_schema_shape

__all__ = ["ToolCall", "drop_partial_call", "forced_call_grammar", "parse_calls",
           "split_answer", "template_format"]

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FORCED_FORMATS = tuple(BUILDERS)  # formats forced_call_grammar writes (all of them)


def parse_calls(text: str, id_prefix: str = "call_", fmt: str = "hermes",
                tools: Sequence[dict[str, Any]] | None = None) -> tuple[str, list[ToolCall]]:
    """(the text with the parsed calls removed and stripped, the calls) in format `fmt`
    (a :data:`~colibri.server.tool_formats.FORMATS` name; `tools`: the request's, for
    formats whose argument types come from the schema). A call that does not parse stays
    in the text; an unterminated last call (EOS or max_tokens before its closing tag) is
    parsed if its arguments are complete."""
    return FORMATS[fmt].parse(text, id_prefix, tools)


def drop_partial_call(text: str, fmt: str = "hermes") -> tuple[str, bool]:
    """For an answer that max_tokens cut: (the text before the first call marker left in
    it, stripped; whether anything was dropped). What follows that marker is a call the
    parser could not read, cut before its end: it is not content."""
    found = [i for i in (text.find(o) for o in FORMATS[fmt].opens) if i >= 0]
    if not found:
        return text, False
    return text[:min(found)].strip(), True


def split_answer(text: str, fmt: str, tools: Sequence[dict[str, Any]] | None,
                 id_prefix: str = "call_", cut: bool = False,
                 ) -> tuple[str, list[ToolCall], bool]:
    """(content, calls, dropped) of a whole answer: :func:`parse_calls`, then, when
    `cut` (max_tokens ended it), :func:`drop_partial_call` on what is left."""
    content, calls = parse_calls(text, id_prefix, fmt, tools)
    dropped = False
    if cut:
        content, dropped = drop_partial_call(content, fmt)
    return content, calls, dropped


class ForcedCallGrammar(Grammar):
    """A forced call's grammar: built from tool schemas that :func:`check_tools` has
    held to the tool limits, so its text is not held to ``max_grammar_bytes`` (meant
    for grammars a client writes)."""

    def check_limits(self) -> None:
        pass


def forced_call_grammar(tools: Sequence[dict[str, Any]], only: str | None,
                        fmt: str = "hermes", limits: GrammarLimits | None = None) -> Grammar:
    """A Lark grammar (llguidance's ``%json``) that admits exactly one call in format
    `fmt` (colibri.server.tool_grammars) to `only` (a named tool_choice) or to any of
    `tools` ("required"), its arguments matching the function's JSON schema. The tools
    are checked against `limits` first (None: the defaults; a 400 past them), so the
    schema walks that build the grammar never go deeper than ``max_schema_depth``."""
    limits = GrammarLimits() if limits is None else limits
    funcs = [t["function"] for t in tools]
    if only is not None:
        funcs = [f for f in funcs if f["name"] == only]
        if not funcs:
            raise ApiError(400, f"tool_choice names the function {only!r}, which is not in "
                                "tools", param="tool_choice")
    try:
        check_tools([f.get("parameters") or {} for f in funcs], limits)
        for f in funcs:  # the builders walk the schemas: their keywords' types first
            check_schema_shape(f.get("parameters") or {}, f"tools: {f['name']}.parameters")
        text = forced_grammar_text(fmt, funcs)  # recursive: only after the depth check
    except ColibriError as exc:
        raise ApiError(400, str(exc), param="tools") from exc
    except RecursionError:  # a max_schema_depth raised past Python's recursion limit
        raise ApiError(400, "tools: a parameter schema is nested too deep to build its "
                            "grammar; lower GrammarLimits.max_schema_depth",
                       param="tools") from None
    return ForcedCallGrammar(text, limits=limits)
