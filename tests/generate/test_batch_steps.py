"""Sampling inside the step loop (colibri.generate.batching.StepBatcher with
colibri.generate.aio.pump_stream, the server's path): each generation samples its row
right after the batched forward and
the next step waits for it, so N generations decoding together share EVERY step (a count
of rows per step, never a timing), and each one's greedy tokens are those it gets alone."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import colibri as co
from colibri.generate.batching import StepBatcher, StepCancelled
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


def test_a_cancelled_generations_waiting_forward_is_dropped(smollm2: co.Model) -> None:
    """StepBatcher.cancel: the forward a cancelled generation has waiting for a step never
    runs (StepCancelled, the session as before), nor does any it submits until its exit;
    after the exit its session forwards again. Here the step waits (patience) for another
    entered generation that sampled and submits nothing, so the row stays pending."""
    batcher = StepBatcher(max_rows=4, patience=600.0)
    batcher.attach(smollm2)
    waited_for, victim = smollm2.session(), smollm2.session()
    try:
        batcher.enter(waited_for)
        waited_for.forward([1, 2, 3])  # from now on every step waits for its next row
        batcher.enter(victim)
        errors: list[BaseException] = []

        def forward() -> None:
            try:
                victim.forward([4, 5, 6])
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=forward)
        t.start()
        time.sleep(0.3)
        assert t.is_alive()  # pending: the step waits for `waited_for`
        batcher.cancel(victim)
        t.join(10)
        assert not t.is_alive() and len(errors) == 1
        assert isinstance(errors[0], StepCancelled), errors
        assert victim.n_tokens == 0
        with pytest.raises(StepCancelled):  # until its exit, every forward is refused
            victim.forward([4])
        batcher.exit(victim)
        batcher.exit(waited_for)
        assert victim.forward([4, 5, 6]).shape == (smollm2.config.vocab_size,)
        assert victim.n_tokens == 3
        batcher.cancel(victim)  # not entered: nothing to cancel
        victim.forward([7])
        assert victim.n_tokens == 4
    finally:
        batcher.detach()
