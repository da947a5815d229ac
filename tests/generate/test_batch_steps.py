"""Sampling inside the step loop (colibri.generate.batching.StepBatcher with
colibri.generate.aio.pump_stream, the server's path): each generation samples its row
right after the batched forward and
the next step waits for it, so N generations decoding together share EVERY step (a count
of rows per step, never a timing), and each one's greedy tokens are those it gets alone."""

from __future__ import annotations

import asyncio

import pytest

import colibri as co
from colibri.generate.batching import StepBatcher
from support.realmodel import smollm2_gguf

PROMPTS = ["What is the capital of France?", "Name three planets.", "Say hello.",
           "Explain why the sky is blue.", "List five colours.", "What is 2+2?",
           "Write a haiku about the sea.", "Who wrote Hamlet?"]
TOKENS = 24


@pytest.fixture(scope="module")
def smollm2() -> co.Model:
    m = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=256))
    yield m
    m.close()


def _ids(model: co.Model, i: int) -> list[int]:
    return model.encode_prompt(messages=[{"role": "user", "content": PROMPTS[i]}])


async def _generate(model: co.Model, ids: list[int], tokens: int = TOKENS) -> list[int]:
    out = []
    async for chunk in model._apump(ids, {"max_tokens": tokens, "min_tokens": tokens,
                                          "sampling": {"temperature": 0}}):
        if chunk.token_id is not None:
            out.append(chunk.token_id)
    return out


async def _together(model: co.Model, prompts: list[list[int]]) -> list[list[int]]:
    return list(await asyncio.gather(*(_generate(model, p) for p in prompts)))


@pytest.mark.parametrize("n", [4, 8])
def test_every_step_carries_every_decoding_generation(smollm2: co.Model, n: int) -> None:
    prompts = [_ids(smollm2, i) for i in range(n)]
    want = [smollm2.generate(p, max_tokens=TOKENS, min_tokens=TOKENS).token_ids
            for p in prompts]
    # The default window (4 ms): only the step loop's waiting for sampled rows keeps the
    # generations together. A patience far above any step keeps the count exact.
    batcher = StepBatcher(max_rows=n + 1, patience=60.0, record=True)
    batcher.attach(smollm2)
    try:
        got = asyncio.run(_together(smollm2, prompts))
    finally:
        batcher.detach()
    assert got == want  # greedy: the same tokens as alone
    history = batcher.history
    assert history is not None
    # Every generation made one prefill forward and TOKENS - 1 decode forwards, each in a
    # step of its own, and it is in every step from its first to its last: none missed.
    sessions = {key for step in history for key in step}
    assert len(sessions) == n
    for key in sessions:
        at = [k for k, step in enumerate(history) if key in step]
        assert len(at) == TOKENS
        assert at == list(range(at[0], at[0] + TOKENS)), at
    # So while all n were decoding, every step carried n rows.
    assert batcher.row_counts[n] >= 1
    assert max(batcher.row_counts) == n
    assert batcher.rows == n * TOKENS


def test_a_cancelled_generation_stops_being_waited_for(smollm2: co.Model) -> None:
    """A generation cancelled mid-stream leaves the step loop: the others carry on (no
    step waits out its patience for it) and keep their tokens."""
    prompts = [_ids(smollm2, i) for i in range(3)]  # the first one runs for 200 tokens
    want = [smollm2.generate(p, max_tokens=TOKENS, min_tokens=TOKENS).token_ids
            for p in prompts[1:]]
    batcher = StepBatcher(max_rows=4, patience=600.0)
    batcher.attach(smollm2)

    async def main() -> list[list[int]]:
        victim = asyncio.ensure_future(_generate(smollm2, prompts[0], 200))
        others = asyncio.gather(*(_generate(smollm2, p) for p in prompts[1:]))
        await asyncio.sleep(0.3)
        victim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await victim
        return list(await asyncio.wait_for(others, 300))

    try:
        got = asyncio.run(main())
    finally:
        batcher.detach()
    assert got == want
