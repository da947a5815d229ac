"""asyncio: agenerate/astream give what generate/stream give, keep the event loop
running, run side by side on one model, and stop cleanly when cancelled: between tokens,
with the session back where it was (n_tokens unchanged) and usable."""

from __future__ import annotations

import asyncio

import pytest

import colibri as co
from support.realmodel import smollm2_gguf

SAMPLING = co.Sampling(temperature=0.8, seed=9)


@pytest.fixture(scope="module")
def model() -> co.Model:
    return co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=512))


def test_async_results_equal_the_sync_ones(model: co.Model) -> None:
    sync = model.generate("Once upon a time", max_tokens=12, sampling=SAMPLING)
    chunks = list(model.stream("Once upon a time", max_tokens=12, sampling=SAMPLING))

    async def main() -> tuple[co.Generation, list[co.Chunk]]:
        g = await model.agenerate("Once upon a time", max_tokens=12, sampling=SAMPLING)
        return g, [c async for c in model.astream("Once upon a time", max_tokens=12,
                                                  sampling=SAMPLING)]

    g, achunks = asyncio.run(main())
    assert g.token_ids == sync.token_ids and g.text == sync.text
    assert g.finish_reason == sync.finish_reason and g.stats.generated_tokens == 12
    assert achunks == chunks


def test_the_loop_keeps_running_and_generations_overlap(model: co.Model) -> None:
    events: list[str] = []

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            events.append("tick")
            await asyncio.sleep(0.005)

    async def gen(tag: str, prompt: str) -> list[int]:
        out = []
        async for c in model.astream(prompt, max_tokens=10):
            events.append(tag)
            if c.token_id is not None:
                out.append(c.token_id)
        return out

    async def main() -> list[list[int]]:
        stop = asyncio.Event()
        t = asyncio.create_task(ticker(stop))
        results = await asyncio.gather(gen("a", "The sky is"), gen("b", "Water is"))
        stop.set()
        await t
        return list(results)

    a, b = asyncio.run(main())
    assert a == model.generate("The sky is", max_tokens=10).token_ids
    assert b == model.generate("Water is", max_tokens=10).token_ids
    first = min(events.index("a"), events.index("b"))
    last = max(len(events) - 1 - events[::-1].index(x) for x in "ab")
    between = events[first:last]
    assert "tick" in between  # the loop ran while the forwards did
    # The two streams interleaved (their steps take turns on the engine).
    assert between.index("b") < len(between) - 1 - between[::-1].index("a")


def test_cancelling_stops_between_tokens_and_restores_the_session(model: co.Model) -> None:
    s = model.session()
    prefix = model.encode_prompt(messages=[{"role": "user", "content": "Tell a long story."}])
    s.forward(prefix)
    before = s.token_ids
    got: list[co.Chunk] = []

    async def consume() -> None:
        async for c in s.astream([], max_tokens=400):
            got.append(c)

    async def main() -> None:
        task = asyncio.create_task(consume())
        while len(got) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert 3 <= len(got) < 400
    assert s.n_tokens == len(before) and s.token_ids == before
    # Consistent: continuing now gives what a fresh session with the same prefix gives.
    fresh = model.session()
    fresh.forward(prefix)
    assert s.generate([], max_tokens=6).token_ids == fresh.generate([], max_tokens=6).token_ids

    async def cancel_agenerate() -> None:
        task = asyncio.create_task(s.agenerate([7042], max_tokens=400))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    n0 = s.n_tokens
    asyncio.run(cancel_agenerate())
    assert s.n_tokens == n0


def test_leaving_an_async_for_early_keeps_the_tokens(model: co.Model) -> None:
    s = model.session()
    ids = model.encode_prompt("Once upon a time")

    async def main() -> int:
        n = 0
        async for _ in s.astream(ids, max_tokens=50):
            n += 1
            if n == 4:
                break
        return n

    assert asyncio.run(main()) == 4
    assert s.n_tokens == len(s.token_ids) == len(ids) + 3  # the 4th token awaits its forward
