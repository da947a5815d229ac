"""Checks of a request body that its pydantic types cannot say (colibri.server.wire): text
that the tokenizer can encode, a bounded nesting depth, and the shapes of the parts the
types keep loose (tool calls in a conversation, Anthropic content blocks). Each raises
ValueError with a message naming the place, which pydantic turns into a 400.

All of them walk the body once, iteratively: a hostile body (deep nesting, huge arrays)
costs time linear in its size and never Python's recursion limit.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_VALUES", "check_anthropic_blocks", "check_body",
           "check_tool_calls"]

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a request may hold (tool parameter schemas and
response_format schemas included): real schemas stay far below it; deeper ones made the
template, the grammar compiler and the tool-call parser recurse without bound."""

MAX_VALUES = 20_000
"""Most JSON values (objects, arrays, strings, numbers...) a request may hold, a legacy
completion's token-id prompt not counted. The body is parsed and validated on the
server's event loop, and validation costs up to ~15 us a value (more when each one is an
error: a list of 100,000 wrong items took 1.5 s), so an 8 MiB body of small values would
hold the loop for seconds; 20,000 covers conversations of thousands of turns and
hundreds of tools (the hostile-request campaign, tests/fuzz/http_campaign.py)."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def check_body(body: Any) -> Any:
    """`body` unchanged, or ValueError: a string with a lone UTF-16 surrogate (JSON's
    ``\\ud800`` escape; no tokenizer can encode it), nesting deeper than MAX_DEPTH or more
    than MAX_VALUES values."""
    stack: list[tuple[Any, int, str]] = [(body, 0, "body")]
    if isinstance(body, dict) and _token_ids(body.get("prompt")):
        stack = [(v, 1, f"body.{k}") for k, v in body.items() if k != "prompt"]
    seen = len(stack)
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise ValueError(f"{where}: the text holds a lone UTF-16 surrogate (such as "
                                 f"\\ud800), which is not a character; send valid UTF-8")
            continue
        if isinstance(value, dict):
            items: Any = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            continue
        if depth >= MAX_DEPTH:
            raise ValueError(f"{where}: nested deeper than {MAX_DEPTH} levels of arrays and "
                             f"objects; flatten it")
        seen += len(value)  # counted before they are walked: a huge list is refused at once
        if seen > MAX_VALUES:
            raise ValueError(f"the request holds more than {MAX_VALUES:,} JSON values "
                             f"(objects, arrays, strings, numbers); split it")
        for key, item in items:
            if isinstance(key, str) and _SURROGATE.search(key):
                raise ValueError(f"{where}: a key holds a lone UTF-16 surrogate")
            stack.append((item, depth + 1, f"{where}.{key}"))
    return body


def _token_ids(prompt: Any) -> bool:
    """Whether `prompt` is a list of token ids (integers only: no value to check)."""
    if not isinstance(prompt, list) or not prompt or type(prompt[0]) is not int:
        return False
    if set(map(type, prompt)) != {int}:  # ~2x faster than all(...) on millions of ids
        # A mixed list would be tried against each of the prompt's types, with an error
        # for every item that fails each one: refused here at once.
        raise ValueError("prompt: a list of token ids must hold integers only")
    return True


def check_tool_calls(calls: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """An assistant message's ``tool_calls``: each ``{"function": {"name": str,
    "arguments": str or object}}`` (``id`` and ``type`` optional)."""
    for i, call in enumerate(calls or []):
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"tool_calls[{i}].function must be an object with a string "
                             f"'name' (and 'arguments': a JSON string or an object)")
        args = fn.get("arguments", "")
        if not isinstance(args, str | dict):
            raise ValueError(f"tool_calls[{i}].function.arguments must be a JSON string or "
                             f"an object, not {type(args).__name__}")
    return calls


def _text_blocks(blocks: list[Any], where: str) -> None:
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ValueError(f"{where}[{i}] must be a content block: an object with a 'type'")
        if block["type"] == "text" and not isinstance(block.get("text"), str):
            raise ValueError(f"{where}[{i}]: a text block needs a string 'text'")


def check_anthropic_blocks(content: Any, where: str = "content") -> Any:
    """An Anthropic message's content (or ``system``): a string, or a list of content
    blocks whose text is a string and whose ``tool_result`` content is a string or a list
    of blocks."""
    if not isinstance(content, list):
        return content
    _text_blocks(content, where)
    for i, block in enumerate(content):
        if block["type"] != "tool_result" or "content" not in block:
            continue
        inner = block["content"]
        if isinstance(inner, list):
            _text_blocks(inner, f"{where}[{i}].content")
        elif not isinstance(inner, str):
            raise ValueError(f"{where}[{i}]: a tool_result's content must be a string or a "
                             f"list of content blocks, not {type(inner).__name__}")
    return content
