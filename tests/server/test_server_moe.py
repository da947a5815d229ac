"""The server on the demo MoE with its experts streamed under a small RAM budget (slow):
concurrent clients get, token for token, what the same model loaded resident gives each
request alone, and the metrics show the experts were read from disk."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from test_server_load import QUESTIONS

import colibri as co
from support.realmodel import smollm2_gguf
from support.server_helpers import ServerProcess, metric
from support.streaming_helpers import budget_for_slots

pytestmark = pytest.mark.slow
CTX = 256
SLOTS = 40  # of 30 layers x 4 experts: most are read again and again


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from colibri.models.demo_moe import make_demo_moe

    path: Path = make_demo_moe(smollm2_gguf(), tmp_path_factory.mktemp("demo") / "demo4.gguf",
                               n_experts=4, top_k=2, seed=3, experts="halves")
    return path


@pytest.fixture(scope="module")
def server(demo: Path) -> Iterator[ServerProcess]:
    budget = budget_for_slots(demo, SLOTS, threads=2, context_length=CTX, precision="int8")
    s = ServerProcess(demo, "-c", str(CTX), "--threads", "2", "--ram-budget", str(budget),
                      "--served-model-name", "demo", "-q")
    yield s
    assert s.stop() == 0, s.log()


def test_streamed_moe_under_load_equals_resident_alone(server: ServerProcess,
                                                       demo: Path) -> None:
    clients = [openai.OpenAI(base_url=server.base, api_key="x", max_retries=0, timeout=600)
               for _ in range(4)]

    def worker(i: int) -> list[tuple[tuple[int, int], str]]:
        out = []
        for j in range(5):
            q, n = (i + j) % len(QUESTIONS), 3 + (i * 5 + j) % 5
            r = clients[i].chat.completions.create(
                model="demo", messages=[{"role": "user", "content": QUESTIONS[q]}],
                max_tokens=n, temperature=0)
            out.append(((q, n), r.choices[0].message.content or ""))
        return out

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = [r for f in [pool.submit(worker, i) for i in range(4)] for r in f.result()]
    assert len(results) == 20
    with co.Model.load(demo, engine=co.EngineConfig(context_length=CTX)) as resident:
        assert resident.stats().memory.cache_slots >= 120  # every expert fits: nothing streamed
        alone = {k: resident.chat(QUESTIONS[k[0]], max_tokens=k[1]).text for k, _ in results}
    for key, text in results:
        assert text == alone[key], key
    m = httpx.get(server.url + "/metrics").text
    assert metric(m, "colibri_expert_bytes_read_total") > 0
    assert 0 < metric(m, "colibri_expert_hit_rate") < 1
    assert metric(m, "colibri_running_requests") == 0
