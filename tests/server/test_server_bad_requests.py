"""Issue 35, item 6: bodies that passed the wire types and then failed inside the server
(500s, some blaming the model) are 400s in each API's error shape, named by field. Run
in-process through FastAPI's test client against the real SmolLM2 (each is refused before
any token is generated)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import colibri as co
from colibri.server import create_app
from colibri.server.wire_checks import MAX_DEPTH, MAX_VALUES
from support.realmodel import smollm2_gguf

HI = [{"role": "user", "content": "Hi"}]
CALLED = {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                                "function": {"name": "f", "arguments": "{}"}}]}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=512))
    with TestClient(create_app(model, model_name="smollm2", close_model=True),
                    raise_server_exceptions=False) as c:
        yield c


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


OPENAI = {
    "a tool call's function is a string": {"messages": [
        *HI, {**CALLED, "tool_calls": [{"id": "1", "type": "function", "function": "f"}]}]},
    "a tool call's function is a list": {"messages": [
        *HI, {**CALLED, "tool_calls": [{"id": "1", "type": "function", "function": [1]}]}]},
    "a tool call's arguments are a number": {"messages": [
        *HI, {**CALLED, "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]},
    "a lone surrogate in text": {"messages": [{"role": "user", "content": "a\ud800b"}]},
    "a schema that is only a $ref to itself": {"messages": HI, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}},
    "a repetition penalty of 1e-308": {"messages": HI, "repetition_penalty": 1e-308},
    "max_tokens true": {"messages": HI, "max_tokens": True},
    "n as a string": {"messages": HI, "n": "2"},
    "tool parameters nested 400 deep": {"messages": HI, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": _nested(400)}}]},
}


@pytest.mark.parametrize("case", list(OPENAI))
def test_openai_bad_bodies_are_400s(client: TestClient, case: str) -> None:
    body = {"model": "smollm2", "max_tokens": 2, **OPENAI[case]}
    for stream in (False, True):
        r = client.post("/v1/chat/completions", headers={"content-type": "application/json"},
                        content=json.dumps({**body, "stream": stream}))  # \ud800 stays escaped
        # The grammar is compiled while the request is planned (issue 35, item 4), so a
        # stream's bad schema is a 400 too, not an error frame after a 200.
        assert r.status_code == 400, (case, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "model failed" not in err["message"]


ANTHROPIC = {
    "a tool_result whose content is a number": 5,
    "a tool_result whose content is null": None,
    "a tool_result whose content is a list of strings": ["a", "b"],
}


@pytest.mark.parametrize("case", [*ANTHROPIC, "a text block whose text is null"])
def test_anthropic_bad_bodies_are_400s(client: TestClient, case: str) -> None:
    if case in ANTHROPIC:
        messages: list[dict[str, Any]] = [
            *HI, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                     "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                          "content": ANTHROPIC[case]}]}]
    else:
        messages = [{"role": "user", "content": [{"type": "text", "text": None}]}]
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    r = client.post("/v1/messages", json={"model": "smollm2", "max_tokens": 2,
                                          "messages": messages, "tools": tools})
    assert r.status_code == 400, (case, r.text)
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_the_good_neighbours_still_pass(client: TestClient) -> None:
    # What the checks must not refuse: a call's arguments as an object, a tool_result as
    # blocks, nesting at the limit's edge, a surrogate pair (a real character).
    ok = client.post("/v1/chat/completions", json={
        "model": "smollm2", "max_tokens": 2, "messages": [
            {"role": "user", "content": "emoji \U0001f600"},
            {**CALLED, "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
            {"role": "tool", "tool_call_id": "1", "content": "done"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": _nested(20)}}]})
    assert ok.status_code == 200, ok.text
    ok = client.post("/v1/messages", json={"model": "smollm2", "max_tokens": 2, "messages": [
        *HI, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                 "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                      "content": [{"type": "text", "text": "sunny"}]}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}]})
    assert ok.status_code == 200, ok.text
    assert MAX_DEPTH >= 32


def test_the_python_api_refuses_the_same(client: TestClient) -> None:
    with pytest.raises(co.errors.ConfigError, match=r"repetition_penalty.*\[0.001, 1000\]"):
        co.Sampling(repetition_penalty=1e-308)
    model = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=256))
    with pytest.raises(co.errors.InvalidRequestError, match="cannot start any output"):
        model.generate("Hi", max_tokens=2, response_format=co.JsonSchema({"$ref": "#"}))


def test_a_body_over_the_limit_is_413_before_it_is_read() -> None:
    # Issue 35, item 3: a 20 MB message blocked the loop for 20 s, 100 MB aborted the
    # server. A declared length over the limit and a chunked body past it are both 413s
    # in the route's shape; /health answers meanwhile; a body under the limit is served.
    model = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=256))
    app = create_app(model, model_name="smollm2", close_model=True, max_body_bytes=64 << 10)
    big = json.dumps({"model": "smollm2", "max_tokens": 1,
                      "messages": [{"role": "user", "content": "x" * (80 << 10)}]})
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/chat/completions", content=big,
                   headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert "64.0 KiB" in r.json()["error"]["message"]
        r = c.post("/v1/messages", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
            data = big.encode()
            for i in range(0, len(data), 8 << 10):
                yield data[i : i + (8 << 10)]

        r = c.post("/v1/chat/completions", content=chunks(),
                   headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert c.get("/health").status_code == 200
        ok = c.post("/v1/chat/completions", json={"model": "smollm2", "max_tokens": 1,
                                                  "messages": HI})
        assert ok.status_code == 200


# Found by the hostile-request campaign (tests/fuzz/http_campaign.py, docs/reliability.md
# "Hostile requests").


@pytest.mark.parametrize(("method", "path", "anthropic"), [
    ("POST", "/v1/models", False), ("GET", "/v1/chat/completions", False),
    ("DELETE", "/v1/messages", True)])
def test_a_wrong_method_is_a_client_error(client: TestClient, method: str, path: str,
                                          anthropic: bool) -> None:
    # Seed 1, cases 58, 102, 110: a 405 came back typed "server_error" (the type of an
    # unlisted status), blaming the server for the client's method.
    r = client.request(method, path)
    assert r.status_code == 405, r.text
    body = r.json()
    assert body["error"]["type"] == "invalid_request_error"
    assert (body.get("type") == "error") == anthropic


@pytest.mark.parametrize("field", ["tools", "stop", "messages"])
def test_a_body_of_too_many_values_is_refused_at_once(client: TestClient, field: str) -> None:
    # Seed 3, cases 207, 300, 475: lists of 10,000 wrong items cost 70-160 ms of
    # validation on the event loop (one error each, 1.5 s for 100,000); an 8 MiB body
    # holds 4 million. Now refused before validation, whatever the items.
    body: dict[str, Any] = {"model": "smollm2", "max_tokens": 2, "messages": HI}
    body[field] = [0] * 4_000_000 if field != "messages" else HI * (MAX_VALUES // 2)
    t0 = time.monotonic()
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text[:300]
    assert f"more than {MAX_VALUES:,} JSON values" in r.json()["error"]["message"]
    assert time.monotonic() - t0 < 10  # the JSON parsing of 8 MB; was minutes


def test_token_id_prompts_are_not_counted_but_must_be_integers(client: TestClient) -> None:
    ids = client.post("/v1/completions", json={"model": "smollm2", "max_tokens": 1,
                                               "prompt": [1] * (MAX_VALUES + 100)})
    assert ids.status_code == 400  # longer than the 512-token context: not the count
    assert "JSON values" not in ids.text
    mixed = client.post("/v1/completions", json={"model": "smollm2", "max_tokens": 1,
                                                 "prompt": [1, "a"] * 100_000})
    assert mixed.status_code == 400
    assert "integers only" in mixed.json()["error"]["message"]
