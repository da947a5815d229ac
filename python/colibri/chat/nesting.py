"""The nesting bound on values given to a chat template (messages, tools, variables).

Templates' ``tojson`` and colibri's own copies of those values (chat/plain_content.py)
recurse; a few hundred levels raised RecursionError (issue 35, item 4). 64 matches the
server's bound on request bodies (server/wire_checks.MAX_DEPTH) and
``GrammarLimits.max_schema_depth``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import InvalidRequestError

__all__ = ["MAX_NESTING", "check_nesting"]

MAX_NESTING = 64
"""Deepest nesting of arrays and objects in one value given to a chat template."""


def check_nesting(value: Any, what: str) -> None:
    """InvalidRequestError when `value` nests arrays and objects deeper than MAX_NESTING
    (an iterative walk: it never recurses itself)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            items: Any = item.values()
        elif isinstance(item, list | tuple):
            items = item
        else:
            continue
        if depth >= MAX_NESTING:
            raise InvalidRequestError(f"{what} are nested deeper than {MAX_NESTING} levels "
                                      "of arrays and objects; flatten them")
        stack.extend((v, depth + 1) for v in items)
