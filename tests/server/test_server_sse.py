"""The wire format of the streams, read raw with httpx: OpenAI's ``data: {json}`` frames
ending with ``data: [DONE]``, Anthropic's named events in their order; and the scheduler's
timeout, in process."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

import colibri as co
from colibri.server.errors import QueueFull, RequestTimeout
from colibri.server.scheduler import Scheduler
from support.server_helpers import SERVER_KEY, ServerProcess

HEADERS = {"Authorization": f"Bearer {SERVER_KEY}"}
ASK = [{"role": "user", "content": "Name a planet."}]


def _frames(raw: str) -> list[str]:
    """The events of an SSE body: separated by one blank line, none empty."""
    assert raw.endswith("\n\n"), raw[-50:]
    events = raw[:-2].split("\n\n")
    assert all(events), "an empty event"
    return events


def test_openai_stream_wire_format(smollm2_server: ServerProcess,
                                   smollm2_oracle: co.Model) -> None:
    body = {"model": "smollm2", "messages": ASK, "max_tokens": 8, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", smollm2_server.base + "/chat/completions", json=body,
                      headers=HEADERS, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert "content-length" not in r.headers
        raw = r.read().decode()
    events = _frames(raw)
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    *body_chunks, last, usage = chunks
    assert last["choices"][0]["finish_reason"] is not None and last["choices"][0]["delta"] == {}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in body_chunks)
    g = smollm2_oracle.chat(ASK, max_tokens=8)
    assert text == g.text and usage["usage"]["completion_tokens"] == len(g.token_ids)
    # Without include_usage: no usage chunk.
    body["stream_options"] = None
    raw = httpx.post(smollm2_server.base + "/chat/completions", json=body, headers=HEADERS,
                     timeout=120).text
    assert all("usage" not in json.loads(e[6:]) for e in _frames(raw)[:-1])


def test_anthropic_stream_wire_format(smollm2_server: ServerProcess,
                                      smollm2_oracle: co.Model) -> None:
    body = {"model": "smollm2", "messages": ASK, "max_tokens": 8, "temperature": 0,
            "stream": True}
    raw = httpx.post(smollm2_server.url + "/v1/messages", json=body,
                     headers={"x-api-key": SERVER_KEY}, timeout=120).text
    names, datas = [], []
    for e in _frames(raw):
        head, payload = e.split("\n")
        assert head.startswith("event: ") and payload.startswith("data: ")
        names.append(head[7:])
        datas.append(json.loads(payload[6:]))
        assert datas[-1]["type"] == names[-1]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    text = "".join(d["delta"]["text"] for d in datas[2:-3])
    g = smollm2_oracle.chat(ASK, max_tokens=8)
    assert text == g.text
    assert datas[-2]["usage"]["output_tokens"] == len(g.token_ids)
    assert datas[0]["message"]["usage"]["input_tokens"] == len(g.prompt_ids)


def test_scheduler_timeout_and_queue(smollm2_oracle: co.Model) -> None:
    """In process: a request past its deadline is cancelled (RequestTimeout) and its slot
    freed; a full queue refuses at once."""
    async def main() -> None:
        s = Scheduler(smollm2_oracle, max_queue=0, timeout=0.3)
        ids = smollm2_oracle.encode_prompt(messages=ASK)
        ticket = s.admit()
        with pytest.raises(QueueFull):
            s.admit()
        got = []
        with pytest.raises(RequestTimeout):
            async with ticket:
                async for chunk in ticket.stream(ids, {"max_tokens": 400, "min_tokens": 400}):
                    got.append(chunk)
        assert len(got) < 400
        assert (s.running, s.waiting) == (0, 0) and s.metrics.timeouts_total == 1
        s.timeout = None
        async with s.admit() as t:  # the slot is free again
            texts = [c.text async for c in t.stream(ids, {"max_tokens": 4})]
        assert "".join(texts) == smollm2_oracle.chat(ASK, max_tokens=4).text

    asyncio.run(main())
