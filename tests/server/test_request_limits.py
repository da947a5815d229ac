"""Issue 35: the server's request limits. Item 3: a request's message count and text
length are checked before its prompt is rendered or tokenized. Run in-process against the
real SmolLM2 with a 512-token context; the tokenizer's encode is wrapped to record what
reaches it, so a test can show that a refused request never got there."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

import colibri as co
from colibri.server import create_app
from colibri.server.prompt_size import PromptLimits, longest_token_bytes, text_chars
from colibri.server.wire import MAX_LOGIT_BIAS
from support.realmodel import smollm2_gguf

CONTEXT = 512


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TestClient, co.Model, list[int]]]:
    model = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=CONTEXT))
    seen: list[int] = []  # lengths of the texts the tokenizer was asked to encode
    tok = model.tokenizer
    encode = tok.encode

    def recording(text: str, **kw: Any) -> list[int]:
        seen.append(len(text))
        return encode(text, **kw)

    tok.encode = recording  # type: ignore[method-assign]
    app = create_app(model, model_name="smollm2", close_model=True,
                     prompt_limits=PromptLimits(max_messages=50))
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c, model, seen


def test_longest_token_is_an_upper_bound() -> None:
    """The bound the check rests on, against the `tokenizers` library's own decoding of
    every token (an independent implementation of the vocabulary)."""
    import tokenizers

    from support.tokenizer_vectors import hf_tokenizer_dir

    hf = tokenizers.Tokenizer.from_file(
        str(hf_tokenizer_dir("smollm2", smollm2_gguf()) / "tokenizer.json"))
    model = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=CONTEXT))
    try:
        longest = longest_token_bytes(model.tokenizer)
        widest = max(len(hf.decode([i], skip_special_tokens=False).encode())
                     for i in range(hf.get_vocab_size()))
        assert longest == widest
    finally:
        model.close()


def test_text_chars_counts_every_string() -> None:
    value = [{"role": "user", "content": [{"type": "text", "text": "abc"}]}, ["de", 3, None]]
    assert text_chars([value]) == len("role") + len("user") + len("content") + len("type") \
        + len("text") + len("text") + len("abc") + len("de")


def _chat(c: TestClient, messages: list[dict[str, Any]]) -> Any:
    return c.post("/v1/chat/completions",
                  json={"model": "smollm2", "max_tokens": 1, "messages": messages})


def test_too_many_messages_are_refused_before_rendering(
        served: tuple[TestClient, co.Model, list[int]]) -> None:
    c, _, seen = served
    seen.clear()
    r = _chat(c, [{"role": "user", "content": "a"}] * 51)
    assert r.status_code == 400, r.text
    assert "51 messages" in r.json()["error"]["message"]
    assert "--max-messages" in r.json()["error"]["message"]
    assert seen == []
    assert _chat(c, [{"role": "user", "content": "a"}] * 49).status_code == 200


def test_a_text_longer_than_the_context_can_hold_is_refused_unread(
        served: tuple[TestClient, co.Model, list[int]]) -> None:
    c, model, seen = served
    ceiling = CONTEXT * longest_token_bytes(model.tokenizer)
    seen.clear()
    t0 = time.perf_counter()
    r = _chat(c, [{"role": "user", "content": "x" * (ceiling + 1)}])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "characters" in err["message"]
    assert seen == []  # refused from its length alone
    assert time.perf_counter() - t0 < 5
    # The Anthropic route and the legacy completions route check the same way.
    r = c.post("/v1/messages", json={"model": "smollm2", "max_tokens": 1, "messages": [
        {"role": "user", "content": "x" * (ceiling + 1)}]})
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    r = c.post("/v1/completions", json={"model": "smollm2", "max_tokens": 1,
                                        "prompt": "x" * (ceiling + 1)})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert seen == []


def test_a_text_under_the_ceiling_is_tokenized_and_judged_by_its_tokens(
        served: tuple[TestClient, co.Model, list[int]]) -> None:
    """Just under the character ceiling the request reaches the tokenizer and is refused by
    its token count (the message the tokens give), so the early check never refuses a
    prompt that would have fit."""
    c, model, seen = served
    ceiling = CONTEXT * longest_token_bytes(model.tokenizer)
    seen.clear()
    r = _chat(c, [{"role": "user", "content": "x" * (ceiling - 200)}])
    assert r.status_code == 400
    assert "tokens but the context holds" in r.json()["error"]["message"]
    assert seen and max(seen) >= ceiling - 200
    assert _chat(c, [{"role": "user", "content": "hello " * 50}]).status_code == 200


def test_prompt_limits_validate() -> None:
    with pytest.raises(ValueError):
        PromptLimits(max_messages=0)
    with pytest.raises(ValueError):
        PromptLimits(max_messages=True)


def test_logit_bias_entries_are_bounded(served: tuple[TestClient, co.Model, list[int]]) -> None:
    c, _, _ = served
    body = {"model": "smollm2", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    ok = c.post("/v1/chat/completions",
                json={**body, "logit_bias": {str(i): -1.0 for i in range(MAX_LOGIT_BIAS)}})
    assert ok.status_code == 200, ok.text
    r = c.post("/v1/chat/completions",
               json={**body, "logit_bias": {str(i): -1.0 for i in range(MAX_LOGIT_BIAS + 1)}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "logit_bias"
