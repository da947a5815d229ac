"""Issue 35: the server's event loop stays responsive whatever one request sends. A
request's rendering and tokenization run off the loop, so /health keeps answering
meanwhile; a message too long for the context is refused from its length, before it is
tokenized (server/prompt_size.py). Through a real server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from support.realmodel import smollm2_gguf
from support.server_helpers import ServerProcess

CONTEXT = 8192
SENTENCE = "The quick brown fox jumps over the lazy dog. "


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    s = ServerProcess(smollm2_gguf(), "-c", str(CONTEXT), "-q", "--max-body-bytes", "16MiB",
                      "--served-model-name", "smollm2", "--parallel", "1")
    yield s
    s.stop()


def _probe_while(server: ServerProcess, text: str) -> tuple[dict[str, object], float, int]:
    """Posts `text` as one message and probes /health every 50 ms until it is answered:
    the answer, the slowest probe, and the number of probes."""
    result: dict[str, object] = {}

    def big() -> None:
        t0 = time.monotonic()
        r = httpx.post(server.base + "/chat/completions", timeout=300, json={
            "model": "smollm2", "max_tokens": 1,
            "messages": [{"role": "user", "content": text}]})
        result.update(status=r.status_code, seconds=time.monotonic() - t0, body=r.text)

    worker = threading.Thread(target=big)
    worker.start()
    worst = 0.0
    probes = 0
    with httpx.Client(timeout=30) as c:
        while worker.is_alive():
            t0 = time.monotonic()
            assert c.get(server.url + "/health").status_code == 200
            worst = max(worst, time.monotonic() - t0)
            probes += 1
            time.sleep(0.05)
    worker.join()
    return result, worst, probes


def test_health_answers_while_a_long_prompt_is_tokenized(server: ServerProcess) -> None:
    # Just under what the context could hold at the vocabulary's longest token (81 bytes
    # for SmolLM2: 663k characters at 8,192 tokens), so it is tokenized (~0.3 s alone,
    # 147k tokens) and then refused by its token count.
    text = SENTENCE * (CONTEXT * 80 // len(SENTENCE))
    result, worst, probes = _probe_while(server, text)
    assert result["status"] == 400, result
    assert "tokens but the context holds" in str(result["body"])
    assert probes >= 2, result["seconds"]
    assert worst < 1.0, (worst, result["seconds"])


def test_a_message_longer_than_the_context_can_hold_is_refused_unread(
        server: ServerProcess) -> None:
    """6.3 MB took seconds of tokenizing before its 400; now its length alone refuses it."""
    result, worst, _ = _probe_while(server, SENTENCE * 140_000)
    assert result["status"] == 400 and "characters" in str(result["body"]), result
    assert float(result["seconds"]) < 5.0  # the body's upload and parse  # type: ignore[arg-type]
    assert worst < 1.0
