"""Reasoning separated from the answer (issue 34, item 1), end to end through the real
SmolLM2 served in-process: a ChatML template that writes ``<think>`` (so the server splits),
and the model's output forced by a regex grammar set on the request's plan (the model
really generates it, token by token, under the grammar)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import colibri as co
from colibri.generate.structured import compile_format
from colibri.server import create_app, routes_anthropic, routes_openai
from support.realmodel import smollm2_gguf

# ChatML; an assistant's reasoning_content is written back in a <think> block, and
# enable_thinking=true opens the block in the prompt (as DeepSeek-R1's template does).
TEMPLATE = (
    "{%- if tools -%}<|im_start|>system\nTools: {{ tools | tojson }}; call one as "
    "<tool_call>{\"name\": N, \"arguments\": A}</tool_call><|im_end|>\n{%- endif -%}"
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n"
    "{%- if m.reasoning_content is defined and m.reasoning_content -%}"
    "<think>{{ m.reasoning_content }}</think>{%- endif -%}"
    "{{ m.content }}<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and enable_thinking -%}<think>\n{%- endif -%}"
    "{%- endif -%}")

WORDS = r"[a-z]{2,8}( [a-z]{2,8}){1,3}"
THOUGHT_THEN_ANSWER = rf"<think>{WORDS}</think>\n\n{WORDS}"
FORCED: list[str] = []  # the regex the next request's output is forced to (empty: none)


def _forcing(make_plan: Any) -> Any:
    def wrapped(*args: Any) -> Any:
        p = make_plan(*args)
        if FORCED:
            model = args[0] if isinstance(args[0], co.Model) else args[0].model
            p.options["response_format"] = compile_format(
                co.Regex(FORCED[0]), model.tokenizer, model.config.vocab_size)
        return p
    return wrapped


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    model = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=512))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(routes_openai, "chat_plan", _forcing(routes_openai.chat_plan))
        mp.setattr(routes_anthropic, "_plan", _forcing(routes_anthropic._plan))
        with TestClient(create_app(model, model_name="smollm2", close_model=True,
                                   chat_template=TEMPLATE),
                        raise_server_exceptions=False) as c:
            yield c


@pytest.fixture
def forced() -> Iterator[list[str]]:
    FORCED.clear()
    yield FORCED
    FORCED.clear()


def _chat(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/chat/completions", json={
        "model": "smollm2", "temperature": 0, "max_tokens": 60,
        "messages": [{"role": "user", "content": "Say hi"}], **body})
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _frames(client: TestClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    return [json.loads(ln[6:]) for ln in lines]


def test_openai_message_has_reasoning_content(client: TestClient, forced: list[str]) -> None:
    forced.append(THOUGHT_THEN_ANSWER)
    msg = _chat(client)["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"]
    for part in (msg["reasoning_content"], msg["content"]):
        assert "<think>" not in part and "</think>" not in part
        assert part == part.strip()


def test_openai_stream_deltas_equal_the_whole(client: TestClient, forced: list[str]) -> None:
    forced.append(THOUGHT_THEN_ANSWER)
    whole = _chat(client)["choices"][0]["message"]
    frames = _frames(client, "/v1/chat/completions", {
        "model": "smollm2", "temperature": 0, "max_tokens": 60, "stream": True,
        "messages": [{"role": "user", "content": "Say hi"}]})
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert (reasoning, content) == (whole["reasoning_content"], whole["content"])
    first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
    assert all("reasoning_content" not in d for d in deltas[first_content:])


def test_prompt_opened_block(client: TestClient, forced: list[str]) -> None:
    forced.append(rf"{WORDS}</think>{WORDS}")  # the template wrote <think> already
    msg = _chat(client, chat_template_kwargs={"enable_thinking": True})["choices"][0]["message"]
    assert msg["reasoning_content"] and msg["content"]
    assert "</think>" not in msg["reasoning_content"] + msg["content"]


def test_unterminated_block_is_reasoning(client: TestClient, forced: list[str]) -> None:
    forced.append(r"<think>[a-z ]{200}")
    out = _chat(client, max_tokens=8)["choices"][0]
    assert out["finish_reason"] == "length"
    assert out["message"]["reasoning_content"] and out["message"]["content"] == ""


def test_users_markers_are_not_reasoning(client: TestClient, forced: list[str]) -> None:
    forced.append(WORDS)
    msg = _chat(client, messages=[{"role": "user", "content": "<think>secret</think> hi"}],
                )["choices"][0]["message"]
    assert "reasoning_content" not in msg and msg["content"]


CALL = r'<tool_call>\{"name": "f", "arguments": \{"a": 1\}\}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}]


def test_tool_calls_are_parsed_from_the_answer_only(client: TestClient,
                                                     forced: list[str]) -> None:
    forced.append(rf"<think>maybe {CALL}</think>\n\n{CALL}")
    out = _chat(client, tools=TOOLS)["choices"][0]
    assert out["finish_reason"] == "tool_calls"
    assert [json.loads(c["function"]["arguments"]) for c in out["message"]["tool_calls"]] \
        == [{"a": 1}]
    assert "<tool_call>" in out["message"]["reasoning_content"]
    forced[0] = rf"<think>maybe {CALL}</think>\n\nno call"
    msg = _chat(client, tools=TOOLS)["choices"][0]["message"]
    assert "tool_calls" not in msg and msg["content"] == "no call"
    forced[0] = rf"<think>maybe {CALL}</think>\n\n{CALL}"
    frames = _frames(client, "/v1/chat/completions", {
        "model": "smollm2", "temperature": 0, "max_tokens": 60, "stream": True,
        "tools": TOOLS, "messages": [{"role": "user", "content": "Say hi"}]})
    deltas = [f["choices"][0]["delta"] for f in frames if f["choices"]]
    # One call (streamed as written: its first delta, then its arguments' fragments).
    assert {c["index"] for d in deltas for c in d.get("tool_calls", [])} == {0}
    assert "<tool_call>" in "".join(d.get("reasoning_content", "") for d in deltas)
    assert "<tool_call>" not in "".join(d.get("content") or "" for d in deltas)


def test_template_kwargs_are_checked(client: TestClient) -> None:
    for bad in ({"messages": []}, {"x": "y" * 5000}, ["enable_thinking"]):
        r = client.post("/v1/chat/completions", json={
            "model": "smollm2", "messages": [{"role": "user", "content": "hi"}],
            "chat_template_kwargs": bad})
        assert r.status_code == 400, r.text


def test_anthropic_thinking_block_first(client: TestClient, forced: list[str]) -> None:
    forced.append(THOUGHT_THEN_ANSWER)
    body = {"model": "smollm2", "max_tokens": 60, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hi"}]}
    r = client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    blocks = r.json()["content"]
    assert [b["type"] for b in blocks] == ["thinking", "text"]
    assert blocks[0]["signature"] == "" and blocks[0]["thinking"] and blocks[1]["text"]
    events = _frames(client, "/v1/messages", {**body, "stream": True})
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == blocks[0]["thinking"]
    assert "".join(d.get("text", "") for d in deltas) == blocks[1]["text"]
    assert {"type": "signature_delta", "signature": ""} in deltas


def test_anthropic_thinking_control_and_history(client: TestClient, forced: list[str]) -> None:
    def count(**extra: Any) -> int:
        r = client.post("/v1/messages/count_tokens", json={"model": "smollm2", **extra})
        assert r.status_code == 200, r.text
        return int(r.json()["input_tokens"])
    hi = [{"role": "user", "content": "hi"}]
    assert count(messages=hi, thinking={"type": "enabled", "budget_tokens": 1024}) \
        > count(messages=hi)  # the prompt opens the block
    assert count(messages=hi, thinking={"type": "disabled"}) == count(messages=hi)
    history = [*hi, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "they greet", "signature": ""},
        {"type": "text", "text": "hello"}]}, {"role": "user", "content": "again"}]
    plain = [*hi, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    assert count(messages=history) > count(messages=plain)  # rendered as the template does
    forced.append(rf"{WORDS}</think>{WORDS}")
    r = client.post("/v1/messages", json={
        "model": "smollm2", "max_tokens": 60, "messages": history,
        "thinking": {"type": "enabled", "budget_tokens": 50}})
    assert [b["type"] for b in r.json()["content"]] == ["thinking", "text"]


def test_anthropic_thinking_is_checked(client: TestClient) -> None:
    for bad in ({"type": "maybe"}, {"type": "enabled", "budget_tokens": 0}, "on"):
        r = client.post("/v1/messages", json={
            "model": "smollm2", "max_tokens": 4, "thinking": bad,
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400, r.text
