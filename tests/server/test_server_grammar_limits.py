"""Issue 35, item 4 over HTTP: a hostile response_format or tool schema is a 400 in each
API's error shape, streamed or not (the grammar is compiled while the request is
planned, before a stream's 200), quickly, naming the limit; the limits are the server's
(create_app(grammar_limits=...), colibri serve --grammar-limits); a schema at a limit's
edge is served. In-process through FastAPI's test client on the real SmolLM2."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import colibri as co
from colibri.generate.grammar_limits import GrammarLimits
from colibri.server import create_app
from support.realmodel import smollm2_gguf

HI = [{"role": "user", "content": "Hi"}]
QUICK = 2.0  # seconds past the body's upload and parse, on a loaded 2-core host


@pytest.fixture(scope="module")
def model() -> Iterator[co.Model]:
    m = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=512))
    yield m
    m.close()


@pytest.fixture(scope="module")
def client(model: co.Model) -> Iterator[TestClient]:
    # A larger body limit than the default 8 MiB, so the 10 MB cases reach the grammar.
    with TestClient(create_app(model, model_name="smollm2", max_body_bytes=64 << 20),
                    raise_server_exceptions=False) as c:
        yield c


def schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def tool(params: dict[str, Any], name: str = "f") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params}}


def openai_refused(c: TestClient, body: dict[str, Any], limit: str | None) -> None:
    for stream in (False, True):
        text = json.dumps({"model": "smollm2", "max_tokens": 2, "messages": HI, **body,
                           "stream": stream})
        t0 = time.perf_counter()
        r = c.post("/v1/chat/completions", content=text,
                   headers={"content-type": "application/json"})
        took = time.perf_counter() - t0
        assert r.status_code == 400, r.text[:500]
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error"
        if limit is not None:
            assert f"GrammarLimits.{limit}" in err["message"]
            assert f"--grammar-limits {limit}=" in err["message"]
        assert took < QUICK + len(text) / 5e6, took  # plus ~1 s per 5 MB of JSON


SCHEMAS = {
    # A million values are refused earlier, by the body's value count
    # (wire_checks.MAX_VALUES, 20,000); one over max_enum_values reaches the grammar check.
    "a million-value enum": ({"enum": [f"v{i}" for i in range(1_000_000)]}, None),
    "an enum one value over the limit": ({"enum": [f"v{i}" for i in range(10_001)]},
                                         "max_enum_values"),
    "a ten-megabyte enum value": ({"enum": ["x" * 10_000_000]}, "max_schema_bytes"),
    "an exploding pattern": ({"type": "string", "pattern": "(a{1000}b{1000}){1000}"},
                             "max_regex_size"),
    "a $ref to itself": ({"$ref": "#"}, None),
    "refs in a ring": ({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"$ref": "#/$defs/A"}},
                        "$ref": "#/$defs/A"}, None),
}


@pytest.mark.parametrize("case", list(SCHEMAS))
def test_hostile_response_formats_are_400s(client: TestClient, case: str) -> None:
    schema, limit = SCHEMAS[case]
    openai_refused(client, {"response_format": schema_format(schema)}, limit)


def test_hostile_tools_are_400s(client: TestClient) -> None:
    plain = tool({"type": "object", "properties": {"a": {"type": "string"}}})
    openai_refused(client, {"tools": [plain] * 129}, "max_tools")
    wide = tool({"type": "object", "properties": {"a": {"enum": list(range(10_001))}}})
    openai_refused(client, {"tools": [wide]}, "max_enum_values")
    forced = {"tools": [tool({"type": "object", "properties": {"a": {
        "type": "string", "pattern": "((a{1000}){1000}){1000}"}}})], "tool_choice": "required"}
    openai_refused(client, forced, "max_regex_size")
    for stream in (False, True):
        r = client.post("/v1/messages", json={
            "model": "smollm2", "max_tokens": 2, "messages": HI, "stream": stream,
            "tools": [{"name": "f", "input_schema": {"$ref": "#"}}],
            "tool_choice": {"type": "any"}})
        assert r.status_code == 400, r.text[:300]
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert "cannot start any output" in body["error"]["message"]


def test_the_edges_are_served(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json={
        "model": "smollm2", "max_tokens": 2, "messages": HI,
        "response_format": schema_format({"enum": [f"v{i}" for i in range(10_000)]})})
    assert r.status_code == 200, r.text[:300]
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    r = client.post("/v1/chat/completions", json={
        "model": "smollm2", "max_tokens": 2, "messages": HI, "stream": True,
        "response_format": schema_format(tree)})
    assert r.status_code == 200 and "error" not in r.text, r.text[:300]


def test_the_server_takes_its_own_limits(model: co.Model) -> None:
    app = create_app(model, model_name="smollm2",
                     grammar_limits=GrammarLimits(max_enum_values=5, max_tools=1))
    with TestClient(app, raise_server_exceptions=False) as c:
        ok = c.post("/v1/chat/completions", json={
            "model": "smollm2", "max_tokens": 2, "messages": HI,
            "response_format": schema_format({"enum": list(range(5))})})
        assert ok.status_code == 200, ok.text[:300]
        openai_refused(c, {"response_format": schema_format({"enum": list(range(6))})},
                       "max_enum_values")
        two = [tool({"type": "object"}, "f"), tool({"type": "object"}, "g")]
        openai_refused(c, {"tools": two}, "max_tools")


def test_the_python_api_never_raises_recursion_error(model: co.Model) -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(1000):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(co.errors.InvalidRequestError, match="max_schema_depth"):
        model.generate("Hi", max_tokens=2, response_format=co.JsonSchema(deep))
    with pytest.raises(co.errors.InvalidRequestError, match="nested deeper than 64"):
        model.apply_chat_template(HI, tools=[tool(deep)])


def test_serve_refuses_a_bad_grammar_limit_before_loading() -> None:
    from support.cli_run import assert_one_line_error, colibri_cli

    proc = colibri_cli("serve", "no-such-model", "--port", "0", "--grammar-limits",
                       "max_enums=5")
    assert_one_line_error(proc, 2, "--grammar-limits", "max_enum_values")


MALFORMED_TOOLS = {  # found by tests/fuzz/http_campaign.py (seed 2): each was a 500
    "required a number": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": 7},
    "required of objects": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": [{"x": "city"}]},
    "properties a list": {"type": "object", "properties": ["city"]},
    "a property schema a number": {"type": "object", "properties": {"city": 3}},
    "anyOf an object": {"anyOf": {"type": "string"}},
    "minLength negative": {"type": "object",
                           "properties": {"city": {"type": "string", "minLength": -1}}},
}


@pytest.mark.parametrize("case", list(MALFORMED_TOOLS))
def test_malformed_tool_schemas_with_a_forced_call_are_400s(client: TestClient,
                                                            case: str) -> None:
    """A forced call's grammar is built by walking the tool's schema: a keyword of the
    wrong JSON type is a 400 naming it, on both APIs, never a TypeError's 500."""
    params = MALFORMED_TOOLS[case]
    openai_refused(client, {"tools": [tool(params)], "tool_choice": "required"}, None)
    r = client.post("/v1/messages", json={
        "model": "smollm2", "max_tokens": 2, "messages": HI,
        "tools": [{"name": "f", "input_schema": params}], "tool_choice": {"type": "any"}})
    assert r.status_code == 400, r.text[:500]
    assert r.json()["error"]["type"] == "invalid_request_error"
