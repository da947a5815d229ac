"""Reasoning budgets through the server (issue 34, items 1 and 5): Anthropic's
``thinking.budget_tokens`` and colibri's ``reasoning_budget`` on chat completions cap the
tokens spent inside the <think> block; OpenAI's ``reasoning_effort`` reaches the template.
The real SmolLM2, greedy, with a ChatML template that opens the block in the prompt; the
request's plan gets ``min_tokens`` so the small model keeps writing instead of ending at
once (it would otherwise answer nothing to budget)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import colibri as co
from colibri.server import create_app, routes_anthropic, routes_openai
from support.realmodel import smollm2_gguf

TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n"
    "{%- if reasoning_effort is defined %}effort={{ reasoning_effort }}\n{% endif -%}"
    "{%- if enable_thinking is not defined or enable_thinking -%}<think>\n{%- endif -%}"
    "{%- endif -%}{#- closed with </think> -#}")
MAX = 40


def _keep_writing(make_plan: Any) -> Any:
    def wrapped(*args: Any) -> Any:
        p = make_plan(*args)
        p.options["min_tokens"] = MAX
        return p
    return wrapped


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TestClient, co.Model]]:
    model = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=512))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(routes_openai, "chat_plan", _keep_writing(routes_openai.chat_plan))
        mp.setattr(routes_anthropic, "_plan", _keep_writing(routes_anthropic._plan))
        with TestClient(create_app(model, model_name="smollm2", close_model=True,
                                   chat_template=TEMPLATE),
                        raise_server_exceptions=False) as c:
            yield c, model


def _messages(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/messages", json={
        "model": "smollm2", "temperature": 0, "max_tokens": MAX,
        "messages": [{"role": "user", "content": "Say hello to the world"}], **body})


def _chat(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/chat/completions", json={
        "model": "smollm2", "temperature": 0, "max_tokens": MAX,
        "messages": [{"role": "user", "content": "Say hello to the world"}], **body})


def _blocks(r: Any) -> tuple[str, str]:
    assert r.status_code == 200, r.text
    content = r.json()["content"]
    thinking = "".join(b["thinking"] for b in content if b["type"] == "thinking")
    text = "".join(b["text"] for b in content if b["type"] == "text")
    return thinking, text


def test_anthropic_budget_caps_the_thinking(served: tuple[TestClient, co.Model]) -> None:
    client, model = served
    free_thinking, free_text = _blocks(_messages(client, thinking={"type": "enabled"}))
    assert free_text == ""  # unbudgeted, the model thinks to max_tokens
    for budget in (3, 8):
        thinking, text = _blocks(_messages(
            client, thinking={"type": "enabled", "budget_tokens": budget}))
        assert text, "the model answers after its budget"
        # What it thought is where the unbudgeted run began, no longer than the budget.
        assert free_thinking.startswith(thinking.rstrip("\n"))
        assert len(model.tokenizer.encode(thinking, add_special_tokens=False)) <= budget + 1


def test_openai_reasoning_budget(served: tuple[TestClient, co.Model]) -> None:
    client, model = served
    r = _chat(client, reasoning_budget=5)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert msg["content"]
    assert len(model.tokenizer.encode(msg["reasoning_content"], add_special_tokens=False)) <= 6


def test_reasoning_effort_reaches_the_template(served: tuple[TestClient, co.Model]) -> None:
    client, _ = served
    plain = _chat(client, max_tokens=1)
    high = _chat(client, max_tokens=1, reasoning_effort="high")
    assert plain.status_code == high.status_code == 200
    # "effort=high\n" is in the prompt: more prompt tokens than without it.
    assert high.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("thinking", [
    {"type": "enabled", "budget_tokens": MAX},       # not below max_tokens
    {"type": "enabled", "budget_tokens": 0},         # below Anthropic's minimum of 1
    {"type": "enabled", "budget_tokens": "many"},
])
def test_bad_anthropic_budgets_are_400(served: tuple[TestClient, co.Model],
                                       thinking: dict[str, Any]) -> None:
    client, _ = served
    r = _messages(client, thinking=thinking)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error"
    assert _messages(client, max_tokens=2).status_code == 200  # still serving


@pytest.mark.parametrize("body", [{"reasoning_budget": -1}, {"reasoning_budget": 2.5},
                                  {"reasoning_effort": "extreme"}])
def test_bad_openai_reasoning_controls_are_400(served: tuple[TestClient, co.Model],
                                               body: dict[str, Any]) -> None:
    client, _ = served
    r = _chat(client, **body)
    assert r.status_code == 400, r.text
    assert "error" in r.json()
