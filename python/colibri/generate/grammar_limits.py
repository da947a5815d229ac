"""Limits on what a structured-output request may ask llguidance to compile (issue 35,
item 4), checked before anything is compiled: a hostile schema, choice list, regex or
grammar is refused in time linear in its size, as :class:`~colibri.errors.InvalidRequestError`
naming the limit and how to raise it.

Every walk here is iterative (an explicit stack), so a schema nested thousands of levels
deep costs its size in time and never Python's recursion limit.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from ..errors import InvalidRequestError

__all__ = ["GrammarLimits", "check_choices", "check_grammar_text", "check_regex",
           "check_schema", "check_tools", "parse_limits", "schema_text"]

KIB = 1024


@dataclass(frozen=True)
class GrammarLimits:
    """What one request's structured output may hold (docs/serving.md, Limits). The
    defaults sit far above the schemas, lists and grammars real clients send (OpenAI's
    structured outputs allow 1,000 enum values and 10 levels of nesting) and far below
    what made llguidance take seconds or hundreds of MiB."""

    max_schema_bytes: int = 1024 * KIB
    """A JSON schema's size as compact JSON (a response_format schema, or one tool's
    parameters)."""
    max_schema_depth: int = 64
    """Nesting of arrays and objects in a schema document (an object property is two
    levels: ``properties`` and its schema). 64 is the server's whole-body limit
    (server/wire_checks.MAX_DEPTH); llguidance's JSON reader stops at 128, and the tool
    grammars wrap the parameters in five more levels."""
    max_enum_values: int = 10_000
    """Values in one ``enum`` (10,000 compile in ~0.05 s; a million took 6 s and 840 MiB)."""
    max_enum_bytes: int = 256 * KIB
    """Every ``enum`` and ``const`` value of a schema together, as JSON (a 10 MB value
    took 1 s and 380 MiB)."""
    max_choices: int = 10_000
    """Options of a ``choice`` (100,000 compiled 30 s, then llguidance panicked)."""
    max_choice_bytes: int = 256 * KIB
    """A ``choice``'s options together, in UTF-8."""
    max_regex_bytes: int = 8 * KIB
    """A regular expression's length in UTF-8 (``regex``, and each ``pattern`` of a schema)."""
    max_regex_size: int = 100_000
    """A regular expression's size with its counted repetitions multiplied out
    (``(a{1000}){1000}`` is 1,000,000): nested counts made llguidance's lexer build
    millions of states and fail mid-generation."""
    max_grammar_bytes: int = 128 * KIB
    """A Lark or GBNF grammar's text in UTF-8 (llguidance panics past 65,000 symbols)."""
    max_tools: int = 128
    """Tools one request may declare (OpenAI's limit)."""
    max_tools_bytes: int = 1024 * KIB
    """Every tool's parameter schema together, as compact JSON."""
    compile_seconds: float = 10.0
    """Wall-clock time the compile and the first mask may take; past it the request is
    refused (llguidance's own fuel limits stop most runaway work well before)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidRequestError(f"GrammarLimits.{f.name} must be a positive number, "
                                          f"got {value!r}")


def parse_limits(text: str, base: GrammarLimits | None = None) -> GrammarLimits:
    """`base` (default: the defaults) with ``KEY=VALUE[,KEY=VALUE...]`` applied, KEY a
    :class:`GrammarLimits` field (``max_enum_values=50000,compile_seconds=30``): what
    ``colibri serve --grammar-limits`` takes."""
    names = {f.name: f.type for f in fields(GrammarLimits)}
    changes: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in names:
            raise InvalidRequestError(f"grammar limit {item!r}: use KEY=VALUE with KEY one of "
                                      f"{', '.join(names)}")
        try:
            changes[key] = float(value) if key == "compile_seconds" else int(value)
        except ValueError:
            raise InvalidRequestError(f"grammar limit {key}: {value!r} is not a number") \
                from None
    return replace(base or GrammarLimits(), **changes)


def _over(what: str, got: str, limit: str, name: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{what} ({got}; the limit is {limit}); raise GrammarLimits.{name} (colibri "
        f"serve --grammar-limits {name}=N) to allow more")


def _size(n: int) -> str:
    return f"{n:,} bytes"


# --- regular expressions -----------------------------------------------------------------

_COUNT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def regex_size(pattern: str) -> int:
    """`pattern`'s size with counted repetitions multiplied out: each atom (a character, an
    escape, a class) is 1, a group the sum of its alternatives, ``x{m,n}`` n times x's
    (m for ``{m,}``); ``*``, ``+`` and ``?`` leave it. One pass, no recursion."""
    frames = [0]  # the size of each open group so far
    pending = 0  # the last atom's size, until a quantifier has had its say
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "{" and (m := _COUNT.match(pattern, i)):
            high = m.group(2)
            pending *= int(high) if high else int(m.group(1))
            i = m.end()
            continue
        if c in "*+?":
            i += 1
            continue
        frames[-1] += pending
        pending = 0
        if c == "(":
            frames.append(0)
            if pattern.startswith("?", i + 1):  # (?:...), (?P<x>...), (?i): skip the flags
                j = i + 2
                while j < n and pattern[j] not in ":)>":
                    j += 1
                i = j if j < n and pattern[j] == ")" else j + 1
                continue
        elif c == ")":
            pending = frames.pop() if len(frames) > 1 else 0
        elif c == "|":
            pass
        elif c == "\\":
            pending = 1
            if pattern[i + 1:i + 2] in ("p", "P", "x") and pattern[i + 2:i + 3] == "{":
                i = pattern.find("}", i)
                i = n if i < 0 else i
            else:
                i += 1
        elif c == "[":
            pending = 1
            i = _class_end(pattern, i)
        else:
            pending = 1
        i += 1
    return sum(frames) + pending


def _class_end(pattern: str, i: int) -> int:
    """The index of the ``]`` closing the class opened at `i` (nested classes too)."""
    depth, j, n = 0, i, len(pattern)
    while j < n:
        c = pattern[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            depth += 1
            j += 1
            if pattern.startswith("^", j):
                j += 1
            if pattern.startswith("]", j):  # a ']' right after '[' or '[^' is literal
                j += 1
            continue
        if c == "]":
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return n


def check_regex(pattern: str, limits: GrammarLimits,
                what: str = "response_format: the regular expression") -> None:
    size = len(pattern.encode("utf-8", "surrogatepass"))
    if size > limits.max_regex_bytes:
        raise _over(f"{what} is too long", _size(size), _size(limits.max_regex_bytes),
                    "max_regex_bytes")
    expanded = regex_size(pattern)
    if expanded > limits.max_regex_size:
        raise _over(f"{what} expands too far (counted repetitions multiplied out)",
                    f"{expanded:,}", f"{limits.max_regex_size:,}", "max_regex_size")


# --- choices and grammars -----------------------------------------------------------------


def check_choices(options: Sequence[str], limits: GrammarLimits) -> None:
    if len(options) > limits.max_choices:
        raise _over("response_format: the choice has too many options", f"{len(options):,}",
                    f"{limits.max_choices:,}", "max_choices")
    total = sum(len(o.encode("utf-8", "surrogatepass")) for o in options)
    if total > limits.max_choice_bytes:
        raise _over("response_format: the choice's options are too long together", _size(total),
                    _size(limits.max_choice_bytes), "max_choice_bytes")


def check_grammar_text(text: str, limits: GrammarLimits) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_grammar_bytes:
        raise _over("response_format: the grammar is too long", _size(size),
                    _size(limits.max_grammar_bytes), "max_grammar_bytes")


# --- JSON schemas -------------------------------------------------------------------------


def schema_text(schema: Any, limits: GrammarLimits,
                what: str = "response_format: the JSON schema") -> str:
    """`schema` (a mapping, or JSON text) checked (:func:`check_schema`) and written as
    compact JSON, the form llguidance reads."""
    if isinstance(schema, str):
        _check_bytes(len(schema.encode("utf-8", "surrogatepass")), limits, what)
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise _over(f"{what} is nested too deep", "deeper than Python's JSON reader goes",
                        f"{limits.max_schema_depth} levels", "max_schema_depth") from None
        except ValueError as exc:
            raise InvalidRequestError(f"{what} is not valid JSON: {exc}") from None
    check_schema(schema, limits, what)
    try:  # the walk bounded the depth: only a max_schema_depth in the hundreds gets here
        text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        raise InvalidRequestError(f"{what} is nested too deep to write as JSON; lower "
                                  f"GrammarLimits.max_schema_depth") from None
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"{what} is not JSON: {exc}") from None
    _check_bytes(len(text.encode("utf-8", "surrogatepass")), limits, what)
    return text


def _check_bytes(size: int, limits: GrammarLimits, what: str) -> None:
    if size > limits.max_schema_bytes:
        raise _over(f"{what} is too large", f"{_size(size)} as JSON",
                    _size(limits.max_schema_bytes), "max_schema_bytes")


def check_schema(schema: Any, limits: GrammarLimits,
                 what: str = "response_format: the JSON schema") -> None:
    """`schema` within `limits`: depth first (so nothing after it recurses deeper), then
    enum/const values, regex patterns, ``$ref`` chains that lead only to themselves and
    its size as compact JSON. The walk stops past the size limit, so a huge schema costs
    no more than a large one."""
    enum_bytes, size = 0, 0
    stack: list[tuple[Any, int, bool]] = [(schema, 1, False)]  # (value, depth, in an enum)
    while stack and size <= limits.max_schema_bytes:
        value, depth, in_enum = stack.pop()
        if isinstance(value, Mapping):
            items: Any = value.items()
        elif isinstance(value, list | tuple):
            items = enumerate(value)
        else:
            n = _leaf_bytes(value)
            size += n
            enum_bytes += n if in_enum else 0
            continue
        if depth > limits.max_schema_depth:
            raise _over(f"{what} is nested too deep", f"more than {limits.max_schema_depth} "
                        "levels of arrays and objects", f"{limits.max_schema_depth}",
                        "max_schema_depth")
        n = 2 + max(0, len(value) - 1)  # brackets and commas
        for key, item in items:
            inner = in_enum
            if isinstance(key, str):
                n += _leaf_bytes(key) + 1  # the key and its colon
                if key in ("enum", "const") and isinstance(value, Mapping):
                    inner = True
                    _check_enum(key, item, limits, what)
                elif key == "pattern" and isinstance(item, str):
                    check_regex(item, limits, f"{what}: a pattern")
            stack.append((item, depth + 1, inner))
        size += n
        enum_bytes += n if in_enum else 0
    if size > limits.max_schema_bytes:
        raise _over(f"{what} is too large", f"more than {_size(limits.max_schema_bytes)} "
                    "as JSON", _size(limits.max_schema_bytes), "max_schema_bytes")
    if enum_bytes > limits.max_enum_bytes:
        raise _over(f"{what}: its enum and const values are too large together",
                    _size(enum_bytes), _size(limits.max_enum_bytes), "max_enum_bytes")
    _check_refs(schema, what)


def _leaf_bytes(value: Any) -> int:
    """`value`'s size as compact JSON (``ensure_ascii=False``, UTF-8)."""
    if isinstance(value, str):
        return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if isinstance(value, bool) or value is None:
        return 4 if value in (True, None) else 5
    try:
        return len(json.dumps(value))
    except (TypeError, ValueError):
        return 0  # not JSON: the schema reader refuses it after


def _check_enum(key: str, value: Any, limits: GrammarLimits, what: str) -> None:
    if key == "enum" and isinstance(value, list) and len(value) > limits.max_enum_values:
        raise _over(f"{what}: an enum has too many values", f"{len(value):,}",
                    f"{limits.max_enum_values:,}", "max_enum_values")


def _check_refs(schema: Any, what: str) -> None:
    """A ``$ref`` whose target is itself only a ``$ref``, and so on back to the first
    (``{"$ref": "#"}``; A -> B -> A): no value can ever match it."""
    if not isinstance(schema, Mapping):
        return
    ref = schema.get("$ref")
    seen: set[str] = set()
    node: Any = schema
    while isinstance(ref, str) and ref.startswith("#") and set(node) <= {"$ref", "$defs",
                                                                          "definitions"}:
        if ref in seen:
            raise InvalidRequestError(
                f"{what} cannot start any output: its $ref {ref!r} leads back to itself "
                f"with nothing else to match; give the recursion a schema to end on")
        seen.add(ref)
        node = _resolve(schema, ref)
        if not isinstance(node, Mapping):
            return
        ref = node.get("$ref")


def _resolve(root: Mapping[str, Any], ref: str) -> Any:
    """The node a local JSON pointer (``#/$defs/A``) names, or None."""
    node: Any = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


# --- tools --------------------------------------------------------------------------------


def check_tools(parameters: Sequence[Any], limits: GrammarLimits) -> None:
    """The parameter schemas of a request's tools, for a forced call's grammar: their
    count, each one as a schema, and their size together."""
    if len(parameters) > limits.max_tools:
        raise _over("tools: the request declares too many tools", f"{len(parameters):,}",
                    f"{limits.max_tools:,}", "max_tools")
    total = 0
    for i, params in enumerate(parameters):
        total += len(schema_text(params, limits, f"tools[{i}]'s parameters"))
        if total > limits.max_tools_bytes:
            raise _over("tools: the parameter schemas are too large together",
                        f"more than {_size(limits.max_tools_bytes)}",
                        _size(limits.max_tools_bytes), "max_tools_bytes")
