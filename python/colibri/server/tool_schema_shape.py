"""The shape of a tool's parameter schema, checked before colibri's own code walks it.

The forced-call grammars (server/tool_grammars.py) read a tool's JSON schema themselves:
they close its objects (``additionalProperties: false``), list its ``required`` keys and,
for GLM's format, turn string parameters into bare text. A client's schema can hold any
JSON at those keys (``"required": 7``, ``"properties": []``), which made those walks raise
TypeError (500s found by tests/fuzz/http_campaign.py). This walk, iterative and run after
the depth and size limits, refuses such a schema with a 400 naming the keyword; what it
admits, the walks can read. It checks the keywords the walks read, not all of JSON
Schema: llguidance judges the rest when it compiles the grammar.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidRequestError

__all__ = ["check_schema_shape"]

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMAS = ("additionalProperties", "contains", "not", "if", "then", "else", "propertyNames",
            "unevaluatedProperties", "unevaluatedItems", "additionalItems")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def _bad(where: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f"{where}: {what}")


def check_schema_shape(schema: Any, where: str) -> None:
    """InvalidRequestError unless every subschema of `schema` is an object or a boolean
    and the keywords the grammar builders read have their JSON Schema types."""
    stack: list[tuple[Any, str]] = [(schema, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise _bad(at, f"a schema must be an object or a boolean, not {type(node).__name__}")
        required = node.get("required")
        if required is not None and not (isinstance(required, list)
                                         and all(isinstance(k, str) for k in required)):
            raise _bad(at, "'required' must be an array of property names")
        kind = node.get("type")
        if kind is not None and not (isinstance(kind, str) or (
                isinstance(kind, list) and all(isinstance(k, str) for k in kind))):
            raise _bad(at, "'type' must be a type name or an array of them")
        if "enum" in node and not isinstance(node["enum"], list):
            raise _bad(at, "'enum' must be an array")
        for key in _COUNTS:
            n = node.get(key)
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
                raise _bad(at, f"'{key}' must be a non-negative integer")
        for key in _SCHEMA_MAPS:
            if key in node:
                value = node[key]
                if not isinstance(value, dict):
                    raise _bad(at, f"'{key}' must be an object of schemas")
                stack.extend((v, f"{at}.{key}.{k}") for k, v in value.items())
        for key in _SCHEMA_LISTS:
            if key in node:
                value = node[key]
                if not isinstance(value, list):
                    raise _bad(at, f"'{key}' must be an array of schemas")
                stack.extend((v, f"{at}.{key}[{i}]") for i, v in enumerate(value))
        for key in _SCHEMAS:
            if key in node:
                stack.append((node[key], f"{at}.{key}"))
        if "items" in node:
            items = node["items"]
            if isinstance(items, list):  # draft 4-2019 tuple form
                stack.extend((v, f"{at}.items[{i}]") for i, v in enumerate(items))
            else:
                stack.append((items, f"{at}.items"))
