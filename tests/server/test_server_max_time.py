"""A request's own time limit (issue 34, item 5): ``max_time`` on chat completions,
completions and Anthropic messages stops generating once it has passed, with the answer so
far and finish "length" (Anthropic: stop_reason "max_tokens"), below the server-wide
--request-timeout (which is an error). The real SmolLM2 served in-process, greedy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import colibri as co
from colibri.server import create_app
from support.realmodel import smollm2_gguf

CHAT = {"model": "smollm2", "temperature": 0, "max_tokens": 8, "min_tokens": 8,
        "messages": [{"role": "user", "content": "Count to ten"}]}
MESSAGES = {"model": "smollm2", "temperature": 0, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Count to ten"}]}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=256))
    with TestClient(create_app(model, model_name="smollm2", close_model=True),
                    raise_server_exceptions=False) as c:
        yield c


def test_chat_stops_at_its_limit(client: TestClient) -> None:
    free = client.post("/v1/chat/completions", json=CHAT).json()
    cut = client.post("/v1/chat/completions", json={**CHAT, "max_time": 1e-9}).json()
    assert free["usage"]["completion_tokens"] == 8
    assert cut["usage"]["completion_tokens"] == 1
    assert cut["choices"][0]["finish_reason"] == "length"
    assert free["choices"][0]["message"]["content"].startswith(
        cut["choices"][0]["message"]["content"])
    roomy = client.post("/v1/chat/completions", json={**CHAT, "max_time": 600}).json()
    assert roomy["choices"][0]["message"] == free["choices"][0]["message"]


def test_completions_and_messages_take_it_too(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"model": "smollm2", "prompt": "One, two,",
                                             "max_tokens": 8, "min_tokens": 8,
                                             "max_time": 1e-9})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 1
    a = client.post("/v1/messages", json={**MESSAGES, "max_time": 1e-9})
    assert a.status_code == 200, a.text
    assert a.json()["usage"]["output_tokens"] <= 1
    assert a.json()["stop_reason"] in ("max_tokens", "end_turn")


def test_streamed_chat_ends_with_length(client: TestClient) -> None:
    with client.stream("POST", "/v1/chat/completions",
                       json={**CHAT, "max_time": 1e-9, "stream": True}) as r:
        frames = [line for line in r.iter_lines() if line.startswith("data: {")]
    assert r.status_code == 200
    assert '"finish_reason":"length"' in frames[-1].replace(" ", "")


@pytest.mark.parametrize("bad", [0, -1, "soon", None])
def test_bad_limits_are_400(client: TestClient, bad: Any) -> None:
    if bad is None:
        body = '{"model": "smollm2", "max_time": NaN, "messages": [{"role": "user", ' \
               '"content": "hi"}]}'
        r = client.post("/v1/chat/completions", content=body,
                        headers={"content-type": "application/json"})
    else:
        r = client.post("/v1/chat/completions", json={**CHAT, "max_time": bad})
    assert r.status_code == 400, r.text
    a = client.post("/v1/messages", json={**MESSAGES, "max_time": -1})
    assert a.status_code == 400 and a.json()["type"] == "error"
