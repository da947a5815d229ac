"""Prompt-prefix sharing between requests running at the same time (colibri.generate.prefix_share,
through the server's scheduler and step loop): eight requests with one ~200-token system
prompt prefill it once, and each one's greedy tokens are those it gets alone on a model
without any cache; a leader that is cancelled, fails or is dropped before it holds the
prefix leaves its followers to prefill it themselves (nothing hangs)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

import colibri as co
from colibri.generate.batching import StepBatcher
from colibri.generate.prefix_share import MIN_SHARED, common_prefix
from colibri.server.metrics import Metrics, render
from colibri.server.scheduler import Scheduler
from support.realmodel import smollm2_gguf

CTX = 512
TOKENS = 12
SYSTEM = ("You are the assistant of a small bookshop in Lyon. You answer questions about "
          "books, opening hours, maps, gift cards and orders, briefly and politely. ") * 6
QUESTIONS = ["Which book should I read first?", "Do you sell maps?", "When do you open?",
             "Can I order a book?", "Do you have gift cards?", "Is there a café?",
             "Do you buy used books?", "Where are you?"]


def _options() -> dict[str, object]:
    return {"max_tokens": TOKENS, "min_tokens": TOKENS, "sampling": {"temperature": 0}}


@pytest.fixture(scope="module")
def shared_model() -> Iterator[co.Model]:
    m = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=CTX,
                                                             prompt_cache="64MiB"))
    yield m
    m.close()


@pytest.fixture(scope="module")
def plain_model() -> Iterator[co.Model]:
    with co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=CTX)) as m:
        yield m


@pytest.fixture(scope="module")
def prompts(plain_model: co.Model) -> list[list[int]]:
    return [plain_model.encode_prompt(messages=[{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": q}])
            for q in QUESTIONS]


@pytest.fixture(scope="module")
def alone(plain_model: co.Model, prompts: list[list[int]]) -> list[list[int]]:
    return [plain_model.generate(p, max_tokens=TOKENS, min_tokens=TOKENS).token_ids
            for p in prompts]


def _shared(prompts: list[list[int]]) -> int:
    return min(common_prefix(prompts[0], p) for p in prompts[1:])


async def _request(s: Scheduler, ids: list[int]) -> list[int]:
    ticket = s.admit(positions=len(ids) + TOKENS)
    async with ticket:
        return [c.token_id async for c in ticket.stream(ids, _options())
                if c.token_id is not None]


def _metric(text: str, name: str) -> int:
    (line,) = [x for x in text.splitlines() if x.startswith(name + " ")]
    return int(float(line.split()[1]))


@pytest.mark.parametrize("kv_room", [8, 4])
def test_eight_requests_prefill_a_shared_system_prompt_once(
        shared_model: co.Model, prompts: list[list[int]], alone: list[list[int]],
        kv_room: int) -> None:
    """All eight at once (kv_room 8), or a KV budget with room for four at a time (the
    others wait in the queue and find the prefix in a running request or the cache)."""
    model = shared_model
    model.prompt_cache.clear()
    shared = _shared(prompts)
    assert shared >= 200 and shared >= MIN_SHARED
    metrics = Metrics()
    s = Scheduler(model, metrics, max_running=8, max_queue=8)
    per = max(len(p) + TOKENS for p in prompts) * s.kv_position_bytes
    s.kv_budget = kv_room * per
    peak = [0]

    async def run() -> list[list[int]]:
        async def watch() -> None:
            while True:
                peak[0] = max(peak[0], s.kv_reserved)
                await asyncio.sleep(0.002)
        w = asyncio.ensure_future(watch())
        try:
            return list(await asyncio.gather(*(_request(s, p) for p in prompts)))
        finally:
            w.cancel()
    try:
        got = asyncio.run(run())
    finally:
        s.close()
    assert got == alone  # greedy: the same tokens as alone, without any cache
    st = model.prompt_cache.stats()
    total = sum(len(p) for p in prompts)
    text = render(metrics, s, model)
    prefilled = _metric(text, "colibri_prefill_tokens_total")
    assert prefilled == total - st.shared_tokens - st.reused_tokens
    # Every request after the first took the shared prefix from another's session: a
    # running one's (shared) or, once one ended, the cache's (reused).
    assert st.shared_tokens + st.reused_tokens >= 7 * shared
    assert prefilled <= total - 7 * shared
    if kv_room == 8:  # all eight start together: the first leads, seven follow
        # Each follows the earlier request sharing the most with it (at least the
        # system prompt and the template's head; two questions both starting "Do you").
        most = sum(max(min(common_prefix(p, q), len(p) - 1) for q in prompts[:i])
                   for i, p in enumerate(prompts) if i)
        assert st.shares == 7 and 7 * shared <= st.shared_tokens <= most, st
        assert _metric(text, "colibri_prompt_shares_total") == 7
    else:
        assert st.shares >= 3, st
        assert metrics.kv_waits_total >= 1
    assert peak[0] <= s.kv_budget
    assert s.kv_reserved == 0 and s.running == 0


def test_sharing_off_prefills_each_prompt(shared_model: co.Model, prompts: list[list[int]],
                                          alone: list[list[int]]) -> None:
    model = shared_model
    model.prompt_cache.clear()
    model.prompt_cache.share_running = False
    s = Scheduler(model, Metrics(), max_running=8, max_queue=8)
    try:
        got = asyncio.run(_gather(s, prompts))
    finally:
        s.close()
        model.prompt_cache.share_running = True
    assert got == alone
    st = model.prompt_cache.stats()
    assert st.shares == 0 and st.shared_tokens == 0


async def _gather(s: Scheduler, prompts: list[list[int]]) -> list[list[int]]:
    return list(await asyncio.gather(*(_request(s, p) for p in prompts)))


def test_a_cancelled_leader_leaves_its_followers_correct(
        shared_model: co.Model, prompts: list[list[int]], alone: list[list[int]]) -> None:
    model = shared_model
    model.prompt_cache.clear()
    s = Scheduler(model, Metrics(), max_running=8, max_queue=8)

    async def run() -> list[list[int]]:
        leader = asyncio.ensure_future(_request(s, prompts[0]))
        await asyncio.sleep(0)  # the leader starts first
        followers = [asyncio.ensure_future(_request(s, p)) for p in prompts[1:4]]
        await asyncio.sleep(0.01)
        leader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leader
        return list(await asyncio.wait_for(asyncio.gather(*followers), 300))
    try:
        got = asyncio.run(run())
    finally:
        s.close()
    assert got == alone[1:4]
    assert s.running == 0 and s.kv_reserved == 0
    assert len(model.prompt_cache.running) == 0


@pytest.mark.parametrize("how", ["fails", "dropped"])
def test_followers_prefill_themselves_when_the_leader_never_holds_the_prefix(
        shared_model: co.Model, prompts: list[list[int]], alone: list[list[int]],
        how: str) -> None:
    """The leader fails after its first 64-token chunk (its progress callback raises), or
    its stream is dropped without ever starting: the followers, already waiting for it,
    prefill the prefix themselves."""
    model = shared_model
    model.prompt_cache.clear()
    batcher = StepBatcher(step_tokens=64, max_rows=8)
    batcher.attach(model)

    def boom(done: int, total: int) -> None:
        raise RuntimeError("leader fails")

    errors: list[BaseException] = []
    try:
        holder = [model.stream(prompts[0], max_tokens=TOKENS, progress=boom)]  # registered
        assert len(model.prompt_cache.running) == 1

        async def follow() -> list[list[int]]:
            async def one(ids: list[int]) -> list[int]:
                return [c.token_id async for c in model._apump(ids, _options())
                        if c.token_id is not None]
            tasks = [asyncio.ensure_future(one(p)) for p in prompts[1:3]]
            await asyncio.sleep(0.2)  # they wait for the leader
            assert not any(t.done() for t in tasks)
            assert len(batcher._copies) == 2
            t.start()  # now the leader fails, or is dropped
            return list(await asyncio.wait_for(asyncio.gather(*tasks), 300))

        def lead() -> None:
            try:
                for _ in holder[0]:
                    pass
            except Exception as exc:
                errors.append(exc)
            holder.clear()

        t = threading.Thread(target=lead if how == "fails" else holder.clear)
        got = asyncio.run(follow())
        t.join()
    finally:
        batcher.detach()
    assert got == alone[1:3]
    if how == "fails":
        assert errors and "leader fails" in str(errors[0])
    st = model.prompt_cache.stats()
    assert st.shares == 0, st
    assert len(model.prompt_cache.running) == 0


def test_a_follower_whose_leader_finished_first_takes_the_prefix_from_the_cache(
        shared_model: co.Model, prompts: list[list[int]], alone: list[list[int]]) -> None:
    """The leader (a one-token generation) ends before its follower's copy could be made,
    or while it is made: either way the follower gets the prefix, from the leader's
    running session or from the cache its session went to, and answers as alone."""
    model = shared_model
    model.prompt_cache.clear()
    batcher = StepBatcher(max_rows=8)
    batcher.attach(model)
    try:
        leader = model.stream(prompts[0], max_tokens=1)  # registered first

        async def follow() -> list[int]:
            task = asyncio.ensure_future(_collect(model, prompts[1]))
            await asyncio.sleep(0.2)  # waiting for the leader
            done = threading.Thread(target=lambda: list(leader))
            done.start()
            got = await asyncio.wait_for(task, 300)
            done.join()
            return got

        got = asyncio.run(follow())
    finally:
        batcher.detach()
    assert got == alone[1]
    st = model.prompt_cache.stats()
    assert st.shared_tokens + st.reused_tokens >= _shared(prompts), st


async def _collect(model: co.Model, ids: list[int]) -> list[int]:
    return [c.token_id async for c in model._apump(ids, _options())
            if c.token_id is not None]
