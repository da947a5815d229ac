"""``POST /v1/messages`` driven by the official ``anthropic`` client, against the Python
API on the same GGUF (greedy: the same tokens)."""

from __future__ import annotations

import anthropic
import pytest

import colibri as co
from support.server_helpers import SERVER_KEY, ServerProcess

SYSTEM = "You are a terse assistant."
ASK = [{"role": "user", "content": "Name three colours."}]
# anthropic 2.x's client no longer has temperature/top_p/top_k; the server still takes them
# (the Messages API had them), sent as extra body fields. Without it the server samples at
# temperature 1, the API's documented default.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def client(smollm2_server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=smollm2_server.url, api_key=SERVER_KEY, max_retries=0,
                               timeout=300)


def test_messages_equal_model_chat(client: anthropic.Anthropic,
                                   smollm2_oracle: co.Model) -> None:
    msg = client.messages.create(model="smollm2", max_tokens=16, extra_body=GREEDY, system=SYSTEM,
                                 messages=ASK)
    g = smollm2_oracle.chat(ASK, system=SYSTEM, max_tokens=16)
    assert msg.type == "message" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == g.text
    assert msg.stop_reason == ("max_tokens" if g.finish_reason == "length" else "end_turn")
    assert msg.usage.input_tokens == len(g.prompt_ids)
    assert msg.usage.output_tokens == len(g.token_ids)
    # System as text blocks, content as text blocks: the same prompt.
    again = client.messages.create(
        model="smollm2", max_tokens=16, extra_body=GREEDY,
        system=[{"type": "text", "text": SYSTEM}],
        messages=[{"role": "user", "content": [{"type": "text", "text": ASK[0]["content"]}]}])
    assert again.content[0].text == g.text


def test_count_tokens(client: anthropic.Anthropic, smollm2_oracle: co.Model) -> None:
    n = client.messages.count_tokens(model="smollm2", system=SYSTEM, messages=ASK)
    assert n.input_tokens == smollm2_oracle.count_tokens(
        messages=[{"role": "system", "content": SYSTEM}, *ASK])


def test_stop_sequences_and_end_turn(client: anthropic.Anthropic,
                                     smollm2_oracle: co.Model) -> None:
    full = smollm2_oracle.chat(ASK, system=SYSTEM, max_tokens=16).text
    stop = full.split()[1]
    msg = client.messages.create(model="smollm2", max_tokens=16, extra_body=GREEDY, system=SYSTEM,
                                 messages=ASK, stop_sequences=[stop, "never-there"])
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == full[:full.index(stop)]
    short = [{"role": "user", "content": "Say hi."}]
    g = smollm2_oracle.chat(short, max_tokens=64)
    assert g.finish_reason == "stop"  # SmolLM2 ends this answer itself
    msg = client.messages.create(model="smollm2", max_tokens=64, extra_body=GREEDY, messages=short)
    assert msg.stop_reason == "end_turn" and msg.content[0].text == g.text


def test_streaming_events(client: anthropic.Anthropic, smollm2_oracle: co.Model) -> None:
    g = smollm2_oracle.chat(ASK, system=SYSTEM, max_tokens=12)
    with client.messages.stream(model="smollm2", max_tokens=12, extra_body=GREEDY, system=SYSTEM,
                                messages=ASK) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == g.text == final.content[0].text
    assert final.stop_reason == ("max_tokens" if g.finish_reason == "length" else "end_turn")
    assert final.usage.output_tokens == len(g.token_ids)


def test_errors(smollm2_server: ServerProcess, client: anthropic.Anthropic) -> None:
    bad = anthropic.Anthropic(base_url=smollm2_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e401:
        bad.messages.create(model="smollm2", max_tokens=4, messages=ASK)
    assert e401.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as e404:
        client.messages.create(model="claude-x", max_tokens=4, messages=ASK)
    assert e404.value.body["type"] == "error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="smollm2", max_tokens=4, messages=ASK,
                               extra_body={"temperature": 1.5})
    with pytest.raises(anthropic.BadRequestError, match="image"):
        client.messages.create(model="smollm2", max_tokens=4, messages=[{"role": "user",
                               "content": [{"type": "image", "source": {
                                   "type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
