"""A forced call's grammar follows the function's schema (colibri.server.tool_grammars):
required keys present, no keys the schema does not list unless ``additionalProperties``
allows them, string ``minLength``/``maxLength``, enums, types, nested objects and arrays,
compact JSON.

Checked three ways, each independent of the grammar's code: texts fed token by token
through the matcher (accepted or refused as the schema says); random walks through the
grammar (each step a random allowed token, half the time one that may close a value, so
walks end) in every format, each finished call parsed back and validated with
``jsonschema`` against the schema as given, and checked for keys the schema does not list;
and SmolLM2 sampled at temperature 1 under the grammar, validated the same way.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import pytest

import colibri as co
from colibri.generate.structured import Constraint
from colibri.server.tool_formats import FORMATS
from colibri.server.tool_grammars import closed
from colibri.server.tools import forced_call_grammar, parse_calls
from colibri.tokenizers import Tokenizer
from support.realmodel import smollm2_gguf


def tool(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name, "description": f"{name} for the test"}
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


# No additionalProperties anywhere: the grammar admits only the listed keys.
OPEN = tool("get_weather", {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
    "required": ["city"]})
LENGTHS = tool("lookup", {"type": "object", "properties": {
    "code": {"type": "string", "minLength": 3, "maxLength": 5},
    "note": {"type": "string", "maxLength": 4}}, "required": ["code", "note"]})
NESTED = tool("search", {"type": "object", "properties": {
    "query": {"type": "string", "maxLength": 12},
    "filters": {"type": "object", "properties": {
        "max_price": {"type": "number", "minimum": 0, "maximum": 100},
        "in_stock": {"type": "boolean"}}, "required": ["max_price"]},
    "tags": {"type": "array", "items": {"enum": ["new", "used"]}, "maxItems": 3},
    "limit": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["query", "filters"]})
EXTRA_OK = tool("tag", {"type": "object", "properties": {"id": {"type": "integer"}},
                        "required": ["id"], "additionalProperties": {"type": "boolean"}})
CHOICE = tool("pick", {"type": "object", "properties": {
    "value": {"anyOf": [{"type": "integer"}, {"type": "null"},
                        {"type": "object", "properties": {"x": {"type": "integer"}},
                         "required": ["x"]}]}},
    "required": ["value"]})
NO_PARAMS = tool("ping", None)
SCHEMAS = [OPEN, LENGTHS, NESTED, EXTRA_OK, CHOICE, NO_PARAMS]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_gguf())


def unlisted_keys(value: Any, schema: dict[str, Any]) -> list[str]:
    """Keys of `value` (recursively) that an object schema listing properties without
    saying anything of additionalProperties does not list: the grammar must not write
    them (a JSON Schema validator would accept them)."""
    out: list[str] = []
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        props = schema["properties"]
        if "additionalProperties" not in schema:
            out += [k for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                out += unlisted_keys(v, props[k])
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for v in value:
            out += unlisted_keys(v, schema["items"])
    for branch in schema.get("anyOf", ()):
        try:
            jsonschema.validate(value, branch)
        except jsonschema.ValidationError:
            continue
        out += unlisted_keys(value, branch)
        break
    return out


def check_call(text: str, fmt: str, fn: dict[str, Any]) -> None:
    rest, calls = parse_calls(text, "call_", fmt, [fn])
    assert rest == "" and len(calls) == 1, (fmt, text)
    (call,) = calls
    schema = fn["function"].get("parameters") or {"type": "object"}
    assert call.name == fn["function"]["name"]
    jsonschema.validate(call.arguments, schema)
    assert unlisted_keys(call.arguments, schema) == [], (text, call.arguments)


def accepts(tok: Tokenizer, grammar: Any, text: str) -> bool:
    """Whether the grammar admits `text` whole: each of its tokens allowed in turn, and
    then the end."""
    c = Constraint(grammar, tok, tok.vocab_size)
    try:
        for t in tok.encode(text, add_special_tokens=False, special=False):
            if not c.allowed()[t]:
                return False
            c.advance(t)
        return c.done or bool(c.allowed()[sorted(tok.eos_ids)[0]])
    finally:
        c.close()


def walk(tok: Tokenizer, grammar: Any, rng: random.Random, closers: np.ndarray,
         max_steps: int = 300) -> str | None:
    """A random text of the grammar, or None when it did not end in `max_steps` tokens."""
    c = Constraint(grammar, tok, tok.vocab_size)
    eos = sorted(tok.eos_ids)
    out: list[int] = []
    try:
        for _ in range(max_steps):
            if c.done:
                return tok.decode(out)
            allowed = c.allowed()
            if any(allowed[e] for e in eos):
                return tok.decode(out)
            pool = np.flatnonzero(allowed & closers) if rng.random() < 0.5 else []
            if len(pool) == 0:
                pool = np.flatnonzero(allowed)
            t = int(pool[rng.randrange(len(pool))])
            out.append(t)
            c.advance(t)
        return None
    finally:
        c.close()


@pytest.fixture(scope="module")
def closers(tok: Tokenizer) -> np.ndarray:
    """Tokens whose text may end a value or an object (so random walks finish)."""
    return np.array([any(ch in tok.token_bytes(i).decode("utf-8", "replace")
                         for ch in '"}],<\n')
                     for i in range(tok.vocab_size)])


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("fn", SCHEMAS, ids=[t["function"]["name"] for t in SCHEMAS])
def test_random_calls_follow_the_schema(tok: Tokenizer, closers: np.ndarray, fmt: str,
                                        fn: dict[str, Any]) -> None:
    grammar = forced_call_grammar([fn], None, fmt)
    rng = random.Random(f"{fmt}/{fn['function']['name']}")
    texts = [walk(tok, grammar, rng, closers) for _ in range(24)]
    done = [t for t in texts if t is not None]
    assert len(done) >= 18, f"only {len(done)} of 24 walks ended"
    for text in done:
        check_call(text, fmt, fn)


def _hermes(fn: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{fn}", "arguments": {args}}}\n</tool_call>'


@pytest.mark.parametrize(("fn", "args", "ok"), [
    (OPEN, '{"city": "Paris"}', True),
    (OPEN, '{"city": "Paris", "unit": "C"}', True),
    (OPEN, '{"city": "Paris", "junk": 1}', False),  # a key the schema does not list
    (OPEN, '{"unit": "C"}', False),  # the required key missing
    (OPEN, '{"city": "Paris", "unit": "K"}', False),  # not in the enum
    (OPEN, '{"city": 7}', False),  # not a string
    (OPEN, '{"city":"Paris"}', False),  # not compact JSON's spacing
    (LENGTHS, '{"code": "abc", "note": ""}', True),
    (LENGTHS, '{"code": "abcde", "note": "wxyz"}', True),
    (LENGTHS, '{"code": "ab", "note": ""}', False),  # under minLength
    (LENGTHS, '{"code": "abcdef", "note": ""}', False),  # over maxLength
    (LENGTHS, '{"code": "abc", "note": "vwxyz"}', False),
    (NESTED, '{"query": "shoes", "filters": {"max_price": 50}}', True),
    (NESTED, '{"query": "shoes", "filters": {"max_price": 50, "colour": "red"}}', False),
    (NESTED, '{"query": "shoes", "filters": {}}', False),
    (NESTED, '{"query": "shoes", "filters": {"max_price": 150}}', False),
    (NESTED, '{"query": "shoes", "filters": {"max_price": 1}, "tags": ["new", "old"]}', False),
    (NESTED, '{"query": "shoes", "filters": {"max_price": 1}, "limit": 2.5}', False),
    (EXTRA_OK, '{"id": 3, "urgent": true}', True),  # additionalProperties allows it
    (EXTRA_OK, '{"id": 3, "urgent": "yes"}', False),  # ... as a boolean only
    (CHOICE, '{"value": null}', True),
    (CHOICE, '{"value": {"x": 1}}', True),
    (CHOICE, '{"value": {"x": 1, "y": 2}}', False),
    (NO_PARAMS, '{"anything": [1, 2]}', True),  # no schema: any object
])
def test_the_grammar_admits_what_the_schema_does(tok: Tokenizer, fn: dict[str, Any],
                                                 args: str, ok: bool) -> None:
    grammar = forced_call_grammar([fn], None, "hermes")
    assert accepts(tok, grammar, _hermes(fn["function"]["name"], args)) is ok


def test_glm_string_values_keep_their_lengths(tok: Tokenizer) -> None:
    """GLM writes strings bare: its grammar bounds them by minLength and maxLength."""
    grammar = forced_call_grammar([LENGTHS], None, "glm")
    call = ("<tool_call>lookup\n<arg_key>code</arg_key>\n<arg_value>{}</arg_value>\n"
            "<arg_key>note</arg_key>\n<arg_value></arg_value>\n</tool_call>")
    assert accepts(tok, grammar, call.format("abc"))
    assert not accepts(tok, grammar, call.format("ab"))
    assert not accepts(tok, grammar, call.format("abcdef"))


def test_closed_adds_no_keys_where_the_schema_decides() -> None:
    params = OPEN["function"]["parameters"]
    assert closed(params) == {**params, "additionalProperties": False}
    assert closed(params) is not params and "additionalProperties" not in params
    nested = closed(NESTED["function"]["parameters"])
    assert nested["additionalProperties"] is False
    assert nested["properties"]["filters"]["additionalProperties"] is False
    for kept in (EXTRA_OK["function"]["parameters"],  # says what else it takes
                 {"type": "object"},  # lists no properties: any object
                 {"properties": {"a": {}}, "required": ["a", "b"]},  # b is not listed
                 {"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]},
                 {"properties": {"a": {}}, "$ref": "#/$defs/more"}):
        assert closed(kept) == kept
    # allOf's branches and not's schema are left alone; anyOf's branches are closed.
    obj = {"properties": {"x": {}}}
    assert closed({"allOf": [obj], "not": obj}) == {"allOf": [obj], "not": obj}
    assert closed({"anyOf": [obj]}) == {"anyOf": [{**obj, "additionalProperties": False}]}


@pytest.fixture(scope="module")
def smollm2() -> Iterator[co.Model]:
    with co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=1024)) as m:
        yield m


@pytest.mark.parametrize("fn", [OPEN, NESTED], ids=["open", "nested"])
def test_sampled_calls_follow_the_schema(smollm2: co.Model, fn: dict[str, Any]) -> None:
    """SmolLM2 at temperature 1 under the grammar (its shipped tool template's prompt):
    every call it finishes validates and has no unlisted keys (before the grammar closed
    objects, it added keys such as "description" to OPEN's)."""
    ask = "What is the weather in Paris?" if fn is OPEN else "Find shoes under 50 euros."
    ids = smollm2.apply_chat_template(ask, tools=[fn], tokenize=True)
    gens = smollm2.generate_n(ids, n=12, max_tokens=96,
                              sampling=co.Sampling(temperature=1.0, seed=7),
                              response_format=forced_call_grammar([fn], None))
    finished = [g for g in gens if g.finish_reason == "stop"]
    assert len(finished) >= 8, [g.text for g in gens]
    for g in finished:
        check_call(g.text, "hermes", fn)
