"""``colibri serve`` driven by the official ``openai`` client: chat, completions, streaming,
logprobs, json_schema, n, stop, errors. The oracle is the Python API on the same GGUF in
this process: a greedy answer through the server is token for token ``Model.chat`` /
``Model.generate`` for the same prompt, and its logprobs are the same numbers."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

import colibri as co
from colibri.generate.samples import sample_seeds
from support.server_helpers import SERVER_KEY, ServerProcess

KEY = SERVER_KEY
MSGS = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(smollm2_server: ServerProcess) -> ServerProcess:
    return smollm2_server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(smollm2_oracle: co.Model) -> co.Model:
    return smollm2_oracle


def test_models_lists_the_served_name(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == ["smollm2"]
    assert client.models.retrieve("smollm2").id == "smollm2"


def test_greedy_chat_equals_model_chat(client: openai.OpenAI, model: co.Model) -> None:
    r = client.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=24,
                                       temperature=0)
    g = model.chat(MSGS, max_tokens=24)
    assert r.choices[0].message.content == g.text
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == g.finish_reason
    assert r.usage.prompt_tokens == len(g.prompt_ids)
    assert r.usage.completion_tokens == len(g.token_ids)
    assert r.usage.total_tokens == len(g.prompt_ids) + len(g.token_ids)
    # max_completion_tokens is the newer name of the same limit.
    r2 = client.chat.completions.create(model="smollm2", messages=MSGS,
                                        max_completion_tokens=24, temperature=0)
    assert r2.choices[0].message.content == g.text


def test_streamed_chat_equals_model_stream(client: openai.OpenAI, model: co.Model) -> None:
    g = model.chat(MSGS, max_tokens=20)
    stream = client.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=20,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
            continue
        delta = chunk.choices[0].delta
        pieces.append(delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces) == g.text
    assert finish == g.finish_reason
    assert usage is not None and usage.completion_tokens == len(g.token_ids)


def test_completion_equals_model_generate(client: openai.OpenAI, model: co.Model) -> None:
    prompt = "The capital of France is"
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=12,
                                  temperature=0)
    g = model.generate(prompt, max_tokens=12)
    assert r.choices[0].text == g.text and r.choices[0].finish_reason == g.finish_reason
    assert r.usage.prompt_tokens == len(g.prompt_ids)
    # Token ids as the prompt: used as given.
    r_ids = client.completions.create(model="smollm2", prompt=g.prompt_ids, max_tokens=12,
                                      temperature=0)
    assert r_ids.choices[0].text == g.text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="smollm2", prompt=prompt, max_tokens=12, temperature=0, stream=True))
    assert streamed == g.text


def test_chat_logprobs_equal_the_python_api(client: openai.OpenAI, model: co.Model) -> None:
    r = client.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=8,
                                       temperature=0, logprobs=True, top_logprobs=3)
    g = model.chat(MSGS, max_tokens=8, sampling=co.Sampling(logprobs=True, top_logprobs=3))
    got = r.choices[0].logprobs.content
    assert g.logprobs is not None and len(got) == len(g.logprobs) == len(g.token_ids)
    tok = model.tokenizer
    for wire, lp in zip(got, g.logprobs, strict=True):
        assert wire.token == lp.text
        assert bytes(wire.bytes) == tok.token_bytes(lp.token_id)
        assert wire.logprob == pytest.approx(lp.logprob, abs=1e-12)
        assert [t.token for t in wire.top_logprobs] == [t.text for t in lp.top]
        assert [t.logprob for t in wire.top_logprobs] == pytest.approx(
            [t.logprob for t in lp.top], abs=1e-12)
        assert wire.top_logprobs[0].logprob >= wire.top_logprobs[-1].logprob


def test_streamed_chat_logprobs(client: openai.OpenAI, model: co.Model) -> None:
    g = model.chat(MSGS, max_tokens=6, sampling=co.Sampling(logprobs=True, top_logprobs=2))
    got = []
    for chunk in client.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=6,
                                                temperature=0, logprobs=True, top_logprobs=2,
                                                stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            got.extend(chunk.choices[0].logprobs.content or [])
    assert g.logprobs is not None
    assert [w.logprob for w in got] == pytest.approx([lp.logprob for lp in g.logprobs],
                                                     abs=1e-12)


def test_legacy_completion_logprobs(client: openai.OpenAI, model: co.Model) -> None:
    prompt = "The capital of France is"
    r = client.completions.create(model="smollm2", prompt=prompt, max_tokens=6,
                                  temperature=0, logprobs=2)
    g = model.generate(prompt, max_tokens=6,
                       sampling=co.Sampling(logprobs=True, top_logprobs=2))
    lp = r.choices[0].logprobs
    assert g.logprobs is not None
    assert lp.tokens == [x.text for x in g.logprobs]
    assert lp.token_logprobs == pytest.approx([x.logprob for x in g.logprobs], abs=1e-12)
    assert [len(d) for d in lp.top_logprobs] == [len({t.text for t in x.top})
                                                  for x in g.logprobs]
    assert lp.text_offset[0] == 0
    assert lp.text_offset[1:] == [sum(len(t) for t in lp.tokens[:i])
                                  for i in range(1, len(lp.tokens))]


SCHEMA = {"type": "object",
          "properties": {"city": {"type": "string", "maxLength": 20},
                         "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}


def test_json_schema_output_parses_and_validates(client: openai.OpenAI,
                                                 model: co.Model) -> None:
    # (With "A big city as JSON." SmolLM2 writes a population with digits until max_tokens.)
    msgs = [{"role": "user", "content": "Give me a city and its population as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA,
                                                  "strict": True}}
    r = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=48,
                                       temperature=0, response_format=fmt)
    assert r.choices[0].finish_reason == "stop"
    value = json.loads(r.choices[0].message.content)
    jsonschema.validate(value, SCHEMA)
    g = model.chat(msgs, max_tokens=48, response_format=fmt)
    assert r.choices[0].message.content == g.text
    r2 = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Paris as JSON, one key."}],
        max_tokens=200, temperature=0, response_format={"type": "json_object"})
    assert r2.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r2.choices[0].message.content), dict)


def test_stop_seed_and_n(client: openai.OpenAI, model: co.Model) -> None:
    full = model.chat(MSGS, max_tokens=24).text
    stop = full.split()[2]
    r = client.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=24,
                                       temperature=0, stop=[stop])
    assert r.choices[0].message.content == full[:full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    # n samples at temperature 0.9 with a seed: sample i is generate() with
    # sample_seeds(seed, n)[i], as Model.generate_n draws them.
    r = client.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=10,
                                       temperature=0.9, seed=7, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    for c, seed in zip(r.choices, sample_seeds(7, 2), strict=True):
        g = model.chat(MSGS, max_tokens=10, sampling=co.Sampling(temperature=0.9, seed=seed))
        assert c.message.content == g.text
    one = client.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=10,
                                         temperature=0.9, seed=7)
    assert one.choices[0].message.content == model.chat(
        MSGS, max_tokens=10, sampling=co.Sampling(temperature=0.9, seed=7)).text


def test_errors_have_openai_shape_and_status(client: openai.OpenAI,
                                             server: ServerProcess) -> None:
    bad_key = openai.OpenAI(base_url=server.base, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e401:
        bad_key.models.list()
    assert e401.value.status_code == 401
    assert e401.value.body["type"] == "authentication_error"  # type: ignore[index]
    r = httpx.get(server.base + "/models")  # no key at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/health").json()["status"] == "ok"  # no key needed
    with pytest.raises(openai.NotFoundError) as e404:
        client.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=2)
    assert e404.value.body["code"] == "model_not_found"  # type: ignore[index]
    r = httpx.get(server.base + "/nothing-here", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and "error" in r.json()
    with pytest.raises(openai.BadRequestError) as e400:
        client.chat.completions.create(model="smollm2", messages=MSGS, temperature=5)
    assert e400.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="n must be at most"):
        client.chat.completions.create(model="smollm2", messages=MSGS, n=100)
    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "word " * 2000}])
    assert long.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    # (SmolLM2's template renders no tools; colibri's ChatML tool template stands in:
    # tests/server/test_server_default_tools.py.)
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        client.chat.completions.create(model="smollm2", messages=MSGS, tools=[{
            "type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            tool_choice={"type": "function", "function": {"name": "g"}})
    with pytest.raises(openai.BadRequestError, match="echo"):
        client.completions.create(model="smollm2", prompt="Hi", echo=True)
    with pytest.raises(openai.BadRequestError, match="schema"):
        client.chat.completions.create(model="smollm2", messages=MSGS, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}})
