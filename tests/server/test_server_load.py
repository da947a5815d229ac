"""The scheduler under load, through real HTTP: concurrent clients get exactly what each
request gives alone, a full queue answers 429 with Retry-After, a client that disconnects
frees its slot (the metrics show it), and SIGTERM lets a running stream finish."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

import colibri as co
from support.realmodel import smollm2_gguf
from support.server_helpers import SERVER_KEY, ServerProcess, metric, wait_for

HEADERS = {"Authorization": f"Bearer {SERVER_KEY}"}
QUESTIONS = ["What is the capital of France?", "Name a planet.", "Say hello.",
             "What is 2+2?", "Name a colour."]


def _request(client: openai.OpenAI, i: int, j: int) -> tuple[tuple[int, int], str]:
    q, n = (i + j) % len(QUESTIONS), 3 + (i * 5 + j) % 5  # mixed prompts and lengths
    msgs = [{"role": "user", "content": QUESTIONS[q]}]
    if (i + j) % 2:  # half of them streamed
        stream = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=n,
                                                temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    else:
        r = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=n,
                                           temperature=0)
        text = r.choices[0].message.content or ""
    return (q, n), text


def test_concurrent_clients_get_what_each_request_gives_alone(
        smollm2_server: ServerProcess, smollm2_oracle: co.Model) -> None:
    clients = [openai.OpenAI(base_url=smollm2_server.base, api_key=SERVER_KEY, max_retries=0,
                             timeout=300) for _ in range(4)]

    def worker(i: int) -> list[tuple[tuple[int, int], str]]:
        return [_request(clients[i], i, j) for j in range(5)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = [r for f in [pool.submit(worker, i) for i in range(4)] for r in f.result()]
    assert len(results) == 20  # no request failed (an error would have raised)
    alone: dict[tuple[int, int], str] = {}
    for (q, n), text in results:
        if (q, n) not in alone:
            alone[(q, n)] = smollm2_oracle.chat(QUESTIONS[q], max_tokens=n).text
        assert text == alone[(q, n)], (QUESTIONS[q], n)
    m = httpx.get(smollm2_server.url + "/metrics").text
    assert metric(m, "colibri_running_requests") == 0
    assert metric(m, "colibri_queue_depth") == 0
    assert metric(m, "colibri_time_to_first_token_seconds_count") >= 20
    # The four clients' generations shared steps: some forward advanced several of them.
    assert metric(m, "colibri_batch_rows_total") > metric(m, "colibri_batch_steps_total") > 0
    assert metric(m, "colibri_generated_tokens_total") >= sum(
        3 + (i * 5 + j) % 5 for i in range(4) for j in range(5)) - 20  # EOS may end early


def test_full_queue_429_and_disconnects_free_their_slots(
        smollm2_server: ServerProcess, smollm2_oracle: co.Model) -> None:
    url = smollm2_server.base + "/chat/completions"
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 400, "temperature": 0, "stream": True}
    before = httpx.get(smollm2_server.url + "/metrics").text
    cancelled0 = metric(before, "colibri_cancelled_requests_total")
    rejected0 = metric(before, "colibri_rejected_requests_total")
    slots = int(metric(before, "colibri_max_running_requests"))
    held = []
    try:
        # `slots` running + 3 queued fill the server (--max-queue 3): each is admitted once
        # its response headers arrive.
        for _ in range(slots + 3):
            c = httpx.Client(timeout=60, headers=HEADERS)
            ctx = c.stream("POST", url, json=body)
            r = ctx.__enter__()
            assert r.status_code == 200
            held.append((c, ctx))
        m = httpx.get(smollm2_server.url + "/metrics").text
        assert metric(m, "colibri_running_requests") == slots
        assert metric(m, "colibri_queue_depth") == 3
        full = httpx.post(url, json={**body, "stream": False}, headers=HEADERS, timeout=60)
        assert full.status_code == 429
        assert int(full.headers["Retry-After"]) >= 1
        assert full.json()["error"]["type"] == "rate_limit_error"
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=smollm2_server.base, api_key=SERVER_KEY, max_retries=0
                          ).chat.completions.create(model="smollm2", messages=body["messages"])
    finally:
        for c, ctx in held:
            ctx.__exit__(None, None, None)
            c.close()

    def idle() -> bool:
        t = httpx.get(smollm2_server.url + "/metrics").text
        return (metric(t, "colibri_running_requests") == 0
                and metric(t, "colibri_queue_depth") == 0)

    wait_for(idle, 60, "the disconnected requests to free their slots")
    after = httpx.get(smollm2_server.url + "/metrics").text
    assert metric(after, "colibri_cancelled_requests_total") >= cancelled0 + 1
    assert metric(after, "colibri_rejected_requests_total") == rejected0 + 2
    # The server is whole again: a greedy answer is still the oracle's.
    client = openai.OpenAI(base_url=smollm2_server.base, api_key=SERVER_KEY, max_retries=0)
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user",
                                       "content": "Say hello."}], max_tokens=6, temperature=0)
    assert r.choices[0].message.content == smollm2_oracle.chat("Say hello.", max_tokens=6).text


def test_sigterm_drains_a_running_stream() -> None:
    s = ServerProcess(smollm2_gguf(), "-c", "256", "-q")
    try:
        name = httpx.get(s.base + "/models").json()["data"][0]["id"]
        body = {"model": name,
                "messages": [{"role": "user", "content": "Count to twenty."}],
                "max_tokens": 24, "temperature": 0, "stream": True}
        frames = []
        with httpx.Client(timeout=120) as c, c.stream("POST", s.base + "/chat/completions",
                                                      json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    frames.append(line)
                    if len(frames) == 2:  # generating: now ask the server to stop
                        s.proc.send_signal(15)
                        t0 = time.monotonic()
        assert frames[-1] == "data: [DONE]"  # the stream ran to its end
        assert any('"finish_reason":"length"' in f for f in frames)
        assert s.proc.wait(60) == 0, s.log()
        assert time.monotonic() - t0 < 60
        with pytest.raises(httpx.TransportError):
            httpx.get(s.url + "/health", timeout=5)
    finally:
        s.stop()


def test_a_non_streamed_request_is_cancelled_when_its_client_leaves(
        smollm2_server: ServerProcess) -> None:
    base = smollm2_server.url
    before = httpx.get(base + "/metrics").text
    tokens0 = metric(before, "colibri_generated_tokens_total")
    # min_tokens holds the generation at 450 tokens whatever the model says (EOS is masked
    # until then): >= 1 s even at 400 tok/s, so a client that gives up after 0.5 s leaves a
    # request still running on any machine (with 400 tokens and a 2 s timeout a fast host
    # could finish first).
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 450, "min_tokens": 450, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(smollm2_server.base + "/chat/completions", json=body, headers=HEADERS,
                   timeout=httpx.Timeout(60, read=0.5))

    def idle() -> bool:
        return metric(httpx.get(base + "/metrics").text, "colibri_running_requests") == 0

    wait_for(idle, 60, "the abandoned request to be cancelled")
    after = httpx.get(base + "/metrics").text
    assert metric(after, "colibri_cancelled_requests_total") >= \
        metric(before, "colibri_cancelled_requests_total") + 1
    assert metric(after, "colibri_generated_tokens_total") - tokens0 < 450  # stopped early


def test_serve_flags_are_checked_before_loading(tmp_path: Path) -> None:
    from colibri.cli import main

    assert main(["serve", str(tmp_path / "none.gguf"), "--port", "70000"]) == 2
    assert main(["serve", str(tmp_path / "none.gguf"), "--chat-template",
                 str(tmp_path / "missing.jinja")]) == 2
    assert main(["serve", str(tmp_path / "none.gguf"), "--port", "0"]) == 1  # no such model


def test_a_port_in_use_is_refused_before_loading(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A taken port is the command's one-line error, before any model is read (issue 38,
    item 10: it was uvicorn's, after the load): the model path here does not exist, so
    reaching the load would fail differently."""
    import socket

    from colibri.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(tmp_path / "none.gguf"), "--host", "127.0.0.1",
                     "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"colibri: error: argument --port: cannot listen on 127.0.0.1:{port}")
    assert "pick another --port" in err and len(err.splitlines()) == 1


# --- 8 concurrent clients x 20 requests (slow) ------------------------------------------

LONG_QUESTIONS = [*QUESTIONS, "Explain in two sentences why the sky is blue.",
                  "Write a haiku about the sea.", "List the days of the week."]


@pytest.fixture(scope="module")
def eight_slot_server() -> Iterator[ServerProcess]:
    s = ServerProcess(smollm2_gguf(), "-c", "512", "--parallel", "8", "--max-queue", "8",
                      "--served-model-name", "smollm2", "-q")
    yield s
    assert s.stop() == 0, s.log()


@pytest.mark.slow
def test_eight_clients_twenty_requests_each_equal_alone(
        eight_slot_server: ServerProcess, smollm2_oracle: co.Model) -> None:
    """160 greedy requests of mixed prompts and lengths (3..40 tokens, half streamed) from
    8 clients at once against 8 batched slots: 0 errors, 0 dropped streams, each answer
    the oracle's for the same request alone."""
    server = eight_slot_server
    clients = [openai.OpenAI(base_url=server.base, api_key="x", max_retries=0, timeout=600)
               for _ in range(8)]

    def one(i: int, j: int) -> tuple[tuple[int, int], str, str | None]:
        q, n = (3 * i + j) % len(LONG_QUESTIONS), 3 + (7 * i + 11 * j) % 38
        msgs = [{"role": "user", "content": LONG_QUESTIONS[q]}]
        if (i + j) % 2:
            stream = clients[i].chat.completions.create(
                model="smollm2", messages=msgs, max_tokens=n, temperature=0, stream=True)
            parts, finish = [], None
            for c in stream:
                if c.choices:
                    parts.append(c.choices[0].delta.content or "")
                    finish = c.choices[0].finish_reason or finish
            return (q, n), "".join(parts), finish  # finish None: the stream was dropped
        r = clients[i].chat.completions.create(model="smollm2", messages=msgs, max_tokens=n,
                                               temperature=0)
        return (q, n), r.choices[0].message.content or "", r.choices[0].finish_reason

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(lambda i=i: [one(i, j) for j in range(20)]) for i in range(8)]
        results = [r for f in futures for r in f.result()]
    assert len(results) == 160
    assert all(finish in ("stop", "length") for _, _, finish in results)
    alone: dict[tuple[int, int], str] = {}
    for (q, n), text, _ in results:
        if (q, n) not in alone:
            alone[(q, n)] = smollm2_oracle.chat(LONG_QUESTIONS[q], max_tokens=n).text
        assert text == alone[(q, n)], (LONG_QUESTIONS[q], n)
    m = httpx.get(server.url + "/metrics").text
    assert metric(m, "colibri_rejected_requests_total") == 0
    assert metric(m, "colibri_running_requests") == 0
    assert metric(m, "colibri_batch_rows_total") > metric(m, "colibri_batch_steps_total")
