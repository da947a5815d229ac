"""Issue 35: the server's event loop stays responsive whatever one request sends. A
request's rendering and tokenization (here a 6 MB message, which ends in a 400 for the
context) run off the loop, so /health keeps answering meanwhile. Through a real server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from support.realmodel import smollm2_gguf
from support.server_helpers import ServerProcess


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    s = ServerProcess(smollm2_gguf(), "-c", "512", "-q", "--max-body-bytes", "16MiB",
                      "--served-model-name", "smollm2")
    yield s
    s.stop()


def test_health_answers_while_a_huge_prompt_is_tokenized(server: ServerProcess) -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 140_000  # 6.3 MB
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
    assert result["status"] == 400 and "context" in str(result["body"])
    # The big request took seconds (tokenizing 6 MB); probes kept coming back quickly.
    assert float(result["seconds"]) > 1.0 and probes >= 5, result["seconds"]  # type: ignore[arg-type]
    assert worst < 1.0, (worst, result["seconds"])
