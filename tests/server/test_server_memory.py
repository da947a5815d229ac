"""The server's memory rules through real HTTP: the KV budget makes a request wait in the
queue instead of oversubscribing (and a full queue still answers 429), and the prompt
cache prefills a shared prefix once (a second request prefills only its new suffix and
answers what it answers without the cache)."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

import colibri as co
from colibri import errors
from colibri.generate.prefix_share import common_prefix
from colibri.server.memory import slot_kv_budget
from support.realmodel import smollm2_gguf
from support.server_helpers import SERVER_CTX, ServerProcess, metric, wait_for
from support.streaming_helpers import budget_for_slots, engine

LONG = 120  # tokens the first request generates (it holds the KV budget meanwhile)


def _metrics(server: ServerProcess) -> str:
    return httpx.get(server.url + "/metrics", timeout=30).text


def _body(content: str, n: int, stream: bool = False) -> dict[str, object]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": content}],
            "max_tokens": n, "min_tokens": n, "temperature": 0, "stream": stream}


@pytest.fixture(scope="module")
def kv_server() -> Iterator[ServerProcess]:
    """Two slots, but a KV budget for about one request of LONG tokens (a position of
    SmolLM2's cache is 30 layers x keys and values x 192 values, 46 KB in the f32 cache of
    its default float32 activations: the first request reserves ~7.1 MB, the short ones
    ~2 MB each, so 8 MiB holds the first but not the first and another)."""
    s = ServerProcess(smollm2_gguf(), "-c", str(SERVER_CTX), "--parallel", "2",
                      "--kv-budget", "8MiB", "--max-queue", "1",
                      "--served-model-name", "smollm2", "-q")
    yield s
    s.stop()


def test_kv_budget_queues_a_request_until_the_running_one_ends(
        kv_server: ServerProcess, smollm2_oracle: co.Model) -> None:
    url = kv_server.base + "/chat/completions"
    m0 = _metrics(kv_server)
    assert metric(m0, "colibri_kv_budget_bytes") == 8 << 20
    waits0 = metric(m0, "colibri_kv_waits_total")

    def streamed(content: str) -> str:
        with httpx.stream("POST", url, json=_body(content, LONG, True), timeout=300) as r:
            assert r.status_code == 200
            return r.read().decode()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        first = pool.submit(streamed, "Tell a story.")
        wait_for(lambda: metric(_metrics(kv_server), "colibri_running_requests") == 1,
                 120, "the first request to run")
        second = pool.submit(lambda: httpx.post(url, json=_body("Name a colour.", 8),
                                                timeout=300))
        third = pool.submit(lambda: httpx.post(url, json=_body("Say hello.", 8), timeout=300))
        # A slot is free but the KV budget is not: both wait in the queue.
        wait_for(lambda: metric(_metrics(kv_server), "colibri_queue_depth") == 2, 60,
                 "two queued requests")
        m = _metrics(kv_server)
        assert metric(m, "colibri_running_requests") == 1
        assert metric(m, "colibri_kv_reserved_bytes") <= 8 << 20
        # 1 running + 2 queued = the 2 slots + 1 queue place: the next one gets 429.
        refused = httpx.post(url, json=_body("Hi", 4), timeout=60)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert "data: [DONE]" in first.result()
        texts = [f.result().json()["choices"][0]["message"]["content"] for f in (second, third)]
    assert texts == [smollm2_oracle.chat(q, max_tokens=8, min_tokens=8).text
                     for q in ("Name a colour.", "Say hello.")]
    m1 = _metrics(kv_server)
    assert metric(m1, "colibri_kv_waits_total") >= waits0 + 1
    assert metric(m1, "colibri_kv_reserved_bytes") == 0
    assert metric(m1, "colibri_running_requests") == 0


def test_a_request_needing_more_than_the_budget_runs_alone(kv_server: ServerProcess) -> None:
    """Its reservation (the whole context) exceeds the budget: it still runs, alone."""
    r = httpx.post(kv_server.base + "/chat/completions",
                   json={"model": "smollm2", "max_tokens": 300, "temperature": 0,
                         "messages": [{"role": "user", "content": "Hi"}]}, timeout=300)
    assert r.status_code == 200


SYSTEM = ("You are a careful assistant for a small bookshop. " * 12).strip()


def test_prompt_cache_prefills_a_shared_prefix_once(smollm2_oracle: co.Model) -> None:
    server = ServerProcess(smollm2_gguf(), "-c", str(SERVER_CTX), "--prompt-cache", "64MiB",
                           "--served-model-name", "smollm2", "-q")
    try:
        url = server.base + "/chat/completions"
        questions = ["Which book should I read first?", "Do you sell maps?"]
        msgs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
                for q in questions]
        ids = [smollm2_oracle.encode_prompt(messages=m) for m in msgs]
        shared = common_prefix(ids[0], ids[1])
        assert shared > 100  # the system prompt and the chat template's head
        got, prefilled = [], []
        for m in msgs:
            before = metric(_metrics(server), "colibri_prefill_tokens_total")
            r = httpx.post(url, json={"model": "smollm2", "messages": m, "max_tokens": 8,
                                      "temperature": 0}, timeout=300)
            assert r.status_code == 200
            got.append(r.json()["choices"][0]["message"]["content"])
            prefilled.append(metric(_metrics(server), "colibri_prefill_tokens_total") - before)
        assert prefilled == [len(ids[0]), len(ids[1]) - shared]
        assert metric(_metrics(server), "colibri_prompt_cache_reused_tokens_total") == shared
    finally:
        server.stop()
    assert got == [smollm2_oracle.generate(messages=m, max_tokens=8).text for m in msgs]


def test_requests_arriving_together_prefill_a_shared_system_prompt_once(
        smollm2_oracle: co.Model) -> None:
    """8 requests at once through HTTP with one system prompt: the first prefills it, the
    seven others copy it from a running request (colibri.generate.prefix_share); each answers what
    it answers alone without any cache."""
    questions = ["Which book first?", "Do you sell maps?", "When do you open?",
                 "Can I order?", "Gift cards?", "Is there a café?", "Used books?",
                 "Where are you?"]
    msgs = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
            for q in questions]
    ids = [smollm2_oracle.encode_prompt(messages=m) for m in msgs]
    shared = min(common_prefix(ids[0], i) for i in ids[1:])
    assert shared > 100
    server = ServerProcess(smollm2_gguf(), "-c", str(SERVER_CTX), "--prompt-cache", "64MiB",
                           "--parallel", "8", "--served-model-name", "smollm2", "-q")
    try:
        url = server.base + "/chat/completions"

        def ask(m: list[dict[str, str]]) -> str:
            r = httpx.post(url, json={"model": "smollm2", "messages": m, "max_tokens": 8,
                                      "temperature": 0}, timeout=300)
            assert r.status_code == 200
            return str(r.json()["choices"][0]["message"]["content"])

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(ask, msgs))
        text = _metrics(server)
        shares = metric(text, "colibri_prompt_shares_total")
        copied = metric(text, "colibri_prompt_shared_tokens_total")
        reused = metric(text, "colibri_prompt_cache_reused_tokens_total")
        prefilled = metric(text, "colibri_prefill_tokens_total")
    finally:
        server.stop()
    total = sum(len(i) for i in ids)
    assert prefilled == total - copied - reused
    assert copied + reused >= 7 * shared and prefilled <= total - 7 * shared
    assert shares >= 1  # (a request arriving after another ended reuses the cache instead)
    assert got == [smollm2_oracle.generate(messages=m, max_tokens=8).text for m in msgs]


def _synthetic_moe() -> ModuleType:
    name = "synthetic_moe"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).resolve().parents[2] / "benchmarks" / "synthetic_moe.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def test_a_larger_kv_budget_is_taken_from_the_expert_cache(tmp_path: Path) -> None:
    """colibri.server.memory: the default KV budget never touches the expert cache; a
    larger one shrinks it (the budget's split still adds up), one that would leave fewer
    slots than a token's experts is a ConfigError."""
    path = tmp_path / "tiny.gguf"
    _synthetic_moe().write_synthetic_gguf("tiny", path, seed=0)
    budget = budget_for_slots(path, 40, context_length=256)
    m = co.Model.load(path, engine=engine(budget=budget, context_length=256))
    try:
        before = m.stats().memory
        assert before is not None and before.cache_slots == 40
        default = slot_kv_budget(m, 4)
        assert before.kv_bytes <= default < before.kv_bytes + before.slot_bytes
        assert m.stats().memory.cache_slots == 40  # type: ignore[union-attr]
        want = 2 * before.kv_bytes + 5 * before.slot_bytes
        assert slot_kv_budget(m, 4, want) == want
        after = m.stats().memory
        assert after is not None
        assert after.cache_slots < 40 and after.kv_bytes == want
        assert (after.dense_bytes + after.kv_bytes + after.work_bytes + after.cache_bytes
                <= after.budget == before.budget)
        with pytest.raises(errors.ConfigError, match="--kv-budget"):
            slot_kv_budget(m, 4, budget)
        assert m.generate([5, 6, 7], max_tokens=3).token_ids  # still runs
    finally:
        m.close()
