"""Issue 35, item 4: what a structured-output request may ask llguidance to compile is
bounded (colibri.generate.grammar_limits). Each hostile case of the issue (a
million-value enum, schemas nested hundreds of levels, a 100,000-option choice, an
exploding regex, a $ref that only refers to itself, a 10 MB enum value) is refused
quickly with an InvalidRequestError naming its limit, never a RecursionError or a panic;
each limit lets its edge through and refuses one past it."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from colibri.errors import InvalidRequestError
from colibri.generate.grammar_limits import (
    GrammarLimits,
    check_tools,
    parse_limits,
    regex_size,
)
from colibri.generate.structured import (
    Choice,
    Compiled,
    Constraint,
    Grammar,
    JsonSchema,
    Regex,
    compile_format,
)
from colibri.tokenizers import Tokenizer
from support.realmodel import smollm2_gguf

QUICK = 2.0  # seconds: generous on a loaded 2-core host (the refusals take milliseconds)
VOCAB = 49152


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    t = Tokenizer.from_gguf(smollm2_gguf())
    compile_format(JsonSchema(), t, VOCAB)  # llguidance's vocabulary, built once
    return t


@contextmanager
def refused(limit: str) -> Iterator[None]:
    """The block raises InvalidRequestError naming GrammarLimits.`limit` within QUICK."""
    t0 = time.perf_counter()
    with pytest.raises(InvalidRequestError, match=rf"GrammarLimits\.{limit} .*--grammar-limits"):
        yield
    assert time.perf_counter() - t0 < QUICK


def nested_objects(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def nested_arrays(depth: int) -> dict[str, Any]:
    """A schema document exactly `depth` levels of objects deep."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


# --- the cases ------------------------------------------------------------------


def test_a_million_value_enum_is_refused_before_compiling(tok: Tokenizer) -> None:
    fmt = JsonSchema({"enum": [f"v{i}" for i in range(1_000_000)]})
    with refused("max_enum_values"):
        compile_format(fmt, tok, VOCAB)


@pytest.mark.parametrize("levels", [33, 300, 1000, 5000])
def test_deep_schemas_are_refused_without_recursion_error(tok: Tokenizer, levels: int) -> None:
    schema = nested_objects(levels)
    with refused("max_schema_depth"):
        compile_format(JsonSchema(schema), tok, VOCAB)
    text = '{"type":"object","properties":{"a":' * levels + "{}" + "}}" * levels
    with refused("max_schema_depth"):
        compile_format(JsonSchema(text), tok, VOCAB)  # as JSON text too


def test_a_hundred_thousand_option_choice_is_refused(tok: Tokenizer) -> None:
    with refused("max_choices"):
        compile_format(Choice([f"option {i}" for i in range(100_000)]), tok, VOCAB)


@pytest.mark.parametrize("pattern", ["(a{1000}){1000}", "((a{1000}){1000}){1000}",
                                     "(a{1000}b{1000}){1000}", "[a-z]{1000}{1000}"])
def test_exploding_regexes_are_refused(tok: Tokenizer, pattern: str) -> None:
    with refused("max_regex_size"):
        compile_format(Regex(pattern), tok, VOCAB)
    with refused("max_regex_size"):  # as a schema's pattern
        compile_format(JsonSchema({"type": "string", "pattern": pattern}), tok, VOCAB)


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"},
], ids=["self", "a-b-a"])
def test_a_ref_to_itself_is_refused(tok: Tokenizer, schema: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    with pytest.raises(InvalidRequestError, match="cannot start any output"):
        compile_format(JsonSchema(schema), tok, VOCAB)
    assert time.perf_counter() - t0 < QUICK


def test_a_recursive_ref_with_a_way_out_compiles(tok: Tokenizer) -> None:
    tree = {"type": "object", "properties": {"v": {"type": "integer"},
                                             "kids": {"type": "array", "items": {"$ref": "#"}}},
            "required": ["v"]}
    assert isinstance(compile_format(JsonSchema(tree), tok, VOCAB), Compiled)


def test_a_ten_megabyte_enum_value_is_refused(tok: Tokenizer) -> None:
    with refused("max_schema_bytes"):
        compile_format(JsonSchema({"enum": ["x" * 10_000_000]}), tok, VOCAB)
    with refused("max_enum_bytes"):
        compile_format(JsonSchema({"enum": ["x" * 300_000]}), tok, VOCAB)


def test_deeply_nested_tool_parameters_are_refused() -> None:
    with refused("max_schema_depth"):
        check_tools([nested_objects(400)], GrammarLimits())


# --- the edges of each limit ----------------------------------------------------------------


def edge(make: Callable[[int], Any], at: int, limit: str, tok: Tokenizer,
         limits: GrammarLimits | None = None) -> None:
    """`make(at)` compiles; `make(at + 1)` is refused by `limit`."""
    assert isinstance(compile_format(make(at), tok, VOCAB), Compiled)
    with refused(limit):
        compile_format(make(at + 1), tok, VOCAB)


def test_the_enum_count_edge(tok: Tokenizer) -> None:
    edge(lambda n: JsonSchema({"enum": list(range(n))}), 10_000, "max_enum_values", tok)


def test_the_choice_count_edge(tok: Tokenizer) -> None:
    small = GrammarLimits(max_choices=500)
    edge(lambda n: Choice([f"c{i}" for i in range(n)], small), 500, "max_choices", tok)


def test_the_depth_edge(tok: Tokenizer) -> None:
    edge(lambda n: JsonSchema(nested_arrays(n)), GrammarLimits().max_schema_depth,
         "max_schema_depth", tok)


def test_the_byte_edges(tok: Tokenizer) -> None:
    def sized(n: int) -> str:  # a schema of exactly n bytes as compact JSON
        base = json.dumps({"description": ""}, separators=(",", ":"))
        return json.dumps({"description": "d" * (n - len(base))}, separators=(",", ":"))
    limits = GrammarLimits(max_schema_bytes=5000)
    edge(lambda n: JsonSchema(json.loads(sized(n)), limits=limits), 5000, "max_schema_bytes",
         tok)
    limits = GrammarLimits(max_enum_bytes=1000)
    edge(lambda n: JsonSchema({"enum": ["e" * (n - 4)]}, limits=limits), 1000,
         "max_enum_bytes", tok)  # ["..."]: the value and four bytes
    limits = GrammarLimits(max_choice_bytes=300)
    edge(lambda n: Choice(["a" * (n - 100), "b" * 100], limits), 300, "max_choice_bytes", tok)
    limits = GrammarLimits(max_regex_bytes=200)
    edge(lambda n: Regex("a" * n, limits), 200, "max_regex_bytes", tok)
    limits = GrammarLimits(max_grammar_bytes=300)
    head = 'start: "x" | ' + '"'
    edge(lambda n: Grammar(head + "y" * (n - len(head) - 1) + '"', limits=limits), 300,
         "max_grammar_bytes", tok)


def test_the_regex_size_edge(tok: Tokenizer) -> None:
    limits = GrammarLimits(max_regex_size=1000)
    edge(lambda n: Regex(f"(ab){{{n // 2}}}" if n % 2 == 0 else f"(ab){{{n // 2}}}c",
                         limits), 1000, "max_regex_size", tok)
    assert regex_size(r"\d{3}-[0-9]{2,4}(?:x|yz)*") == 3 + 1 + 4 + 3
    assert regex_size(r"(?i)\p{Greek}{10}") == 10


def test_tool_limits() -> None:
    params = {"type": "object", "properties": {"a": {"type": "string"}}}
    check_tools([params] * 128, GrammarLimits())
    with refused("max_tools"):
        check_tools([params] * 129, GrammarLimits())
    size = len(json.dumps(params, separators=(",", ":")))
    check_tools([params] * 4, GrammarLimits(max_tools_bytes=4 * size))
    with refused("max_tools_bytes"):
        check_tools([params] * 4, GrammarLimits(max_tools_bytes=4 * size - 1))


def test_the_compile_time_limit(tok: Tokenizer) -> None:
    # 10,000 options compile in about a tenth of a second: a millisecond's limit stops
    # the wait (the compile itself runs on, bounded by llguidance's fuel).
    opts = [f"option number {i}" for i in range(10_000)]
    with refused("compile_seconds"):
        compile_format(Choice(opts, GrammarLimits(compile_seconds=0.001)), tok, VOCAB)


def test_a_compiled_format_is_reused(tok: Tokenizer) -> None:
    compiled = compile_format(JsonSchema({"enum": ["yes", "no"]}), tok, VOCAB)
    assert compile_format(compiled, tok, VOCAB) is compiled
    a, b = Constraint(compiled, tok, VOCAB), Constraint(compiled, tok, VOCAB)
    yes = tok.encode('"yes"', add_special_tokens=False)
    for t in yes:
        assert a.allowed()[t]
        a.advance(t)
    assert a.done and not b.done  # each generation advances its own copy
    a.close()
    b.close()


def test_parse_limits() -> None:
    limits = parse_limits("max_enum_values=50000, compile_seconds=2.5")
    assert limits.max_enum_values == 50_000 and limits.compile_seconds == 2.5
    assert limits.max_choices == GrammarLimits().max_choices
    for bad in ("max_enum=3", "max_enum_values", "max_enum_values=x", "max_choices=0"):
        with pytest.raises(InvalidRequestError):
            parse_limits(bad)


def test_a_matcher_failing_mid_generation_is_the_requests_error(tok: Tokenizer) -> None:
    # Within every limit, yet llguidance's lexer runs out of expressions after a few
    # tokens: the request's error (a 400, or an invalid_request_error frame once a
    # stream has started), never InternalError ("the model failed", a 500).
    c = Constraint(Regex(r"(\w{1,100}){1,100}"), tok, VOCAB)
    with pytest.raises(InvalidRequestError, match="llguidance's limits during generation"):
        for t in tok.encode("Alertstationhello", add_special_tokens=False):
            c.allowed()
            c.advance(t)
        c.allowed()
    c.close()
