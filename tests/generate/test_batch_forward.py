"""Continuous batching in the core (colibri.generate.batching.forward_batch): several sessions in
one forward give each session the same logits, bit for bit, as running it alone
(docs/serving.md), on the real SmolLM2 (resident) and on a MoE whose experts are
streamed through a tiny cache (the step reads the union of the rows' experts)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import colibri as co
from colibri import errors
from colibri.generate.batching import StepBatcher, forward_batch
from support.realmodel import smollm2_gguf
from support.streaming_helpers import budget_for_slots, engine

# Eight requests of mixed prompt lengths (real-looking ids; any in-vocabulary ids would do).
BASE = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
        411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2]
PROMPTS = [BASE[: 3 + 4 * i] for i in range(8)]
DECODE = 5


def alone(model: co.Model, prompt: list[int], n: int = DECODE) -> list[np.ndarray]:
    """Prefill logits (all positions), then greedy decode steps' logits."""
    s = model.session()
    out = [s.forward(prompt, all_logits=True).copy()]
    logits = out[0][-1]
    for _ in range(n):
        logits = s.forward([int(np.argmax(logits))]).copy()
        out.append(logits)
    return out


def batched(model: co.Model, prompts: list[list[int]], n: int = DECODE) -> list[list[np.ndarray]]:
    """The same requests advanced together: one forward_batch for all prefills, then one per
    decode step (each row its own greedy token)."""
    sessions = [model.session() for _ in prompts]
    first = forward_batch(sessions, prompts, all_logits=True)
    outs = [[f.copy()] for f in first]
    for _ in range(n):
        step = forward_batch(sessions, [[int(np.argmax(o[-1] if o[-1].ndim == 1 else o[-1][-1]))]
                                        for o in outs])
        for o, logits in zip(outs, step, strict=True):
            o.append(logits.copy())
    for s, p in zip(sessions, prompts, strict=True):
        assert s.n_tokens == len(p) + n
    return outs


def assert_identical(model: co.Model, prompts: list[list[int]], what: str) -> None:
    want = [alone(model, p) for p in prompts]
    for size in (2, 8):  # a request with one other, and with seven others
        got = batched(model, prompts[:size])
        for i, (g, w) in enumerate(zip(got, want, strict=False)):
            for step, (a, b) in enumerate(zip(g, w, strict=True)):
                assert np.array_equal(a, b), (what, size, i, step, float(np.abs(a - b).max()))


@pytest.fixture(scope="module")
def smollm2() -> co.Model:
    return co.Model.load(smollm2_gguf(), engine=co.EngineConfig(
        threads=co.ThreadConfig(n=2), context_length=128))


def test_smollm2_batched_equals_alone(smollm2: co.Model) -> None:
    assert_identical(smollm2, PROMPTS, "smollm2")


def test_mixed_step_decode_rows_and_a_prefill_chunk(smollm2: co.Model) -> None:
    """A step may hold decode tokens of some sessions and a prompt of another."""
    want = alone(smollm2, PROMPTS[7], 0)[0][-1]
    a, b = smollm2.session(), smollm2.session()
    first = forward_batch([a], [PROMPTS[0]])[0]
    got = forward_batch([a, b], [[int(np.argmax(first))], PROMPTS[7]])
    assert np.array_equal(got[1], want)
    assert np.array_equal(got[0], alone(smollm2, PROMPTS[0], 1)[1])


def test_all_or_nothing_and_clear_errors(smollm2: co.Model) -> None:
    a, b = smollm2.session(), smollm2.session()
    forward_batch([a, b], [[1, 2], [3]])
    with pytest.raises(errors.TokenOutOfRangeError):
        forward_batch([a, b], [[5], [10**6]])
    with pytest.raises(errors.ContextOverflowError):
        forward_batch([a, b], [[5], [7] * 200])
    assert (a.n_tokens, b.n_tokens) == (2, 1)  # neither session changed
    with pytest.raises(errors.InvalidRequestError, match="twice"):
        forward_batch([a, a], [[1], [2]])
    other = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=64))
    try:
        with pytest.raises(errors.InvalidRequestError, match="different models"):
            forward_batch([a, other.session()], [[1], [2]])
    finally:
        other.close()


def test_step_batcher_threads_get_their_own_logits(smollm2: co.Model) -> None:
    """Concurrent threads' forwards go through shared steps and each gets what it gets
    alone, prompts chunked (step_tokens=7) between other sessions' decode rows."""
    want = {i: alone(smollm2, p) for i, p in enumerate(PROMPTS)}
    batcher = StepBatcher(step_tokens=7, window=0.05)
    batcher.attach(smollm2)
    got: dict[int, list[np.ndarray]] = {}
    failures: list[BaseException] = []

    def run(i: int) -> None:
        batcher.join()
        try:
            got[i] = alone(smollm2, PROMPTS[i])
        except BaseException as exc:
            failures.append(exc)
        finally:
            batcher.leave()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        batcher.detach()
    assert not failures, failures
    assert smollm2.runner.batcher is None
    for i in range(8):
        for a, b in zip(got[i], want[i], strict=True):
            assert np.array_equal(a, b), i
    assert batcher.rows > batcher.steps  # some steps held several rows


def test_step_batcher_failed_prompt_leaves_the_session_as_before(smollm2: co.Model) -> None:
    """A prompt that overflows the context in its third chunk: the chunks that went in are
    rolled back, the session keeps its tokens and last logits; another session's forward
    in the same steps is unaffected."""
    s, other = smollm2.session(), smollm2.session()
    before = s.forward(PROMPTS[2]).copy()
    batcher = StepBatcher(step_tokens=40, window=0.01)
    batcher.attach(smollm2)
    try:
        with pytest.raises(errors.ContextOverflowError):
            s.forward([7] * 120)  # 11 + 120 > 128: the third chunk overflows
        assert s.token_ids == PROMPTS[2]
        assert np.array_equal(s.last_logits(), before)
        got = other.forward(PROMPTS[7])
    finally:
        batcher.detach()
    assert np.array_equal(got, alone(smollm2, PROMPTS[7], 0)[0][-1])
    assert np.array_equal(s.forward([5]), alone_after(smollm2, PROMPTS[2], 5))


def alone_after(model: co.Model, prompt: list[int], token: int) -> np.ndarray:
    s = model.session()
    s.forward(prompt)
    return s.forward([token])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from colibri.models.demo_moe import make_demo_moe

    path: Path = make_demo_moe(smollm2_gguf(), tmp_path_factory.mktemp("demo") / "demo4.gguf",
                               n_experts=4, top_k=2, seed=3, experts="halves")
    return path


def test_streamed_moe_batched_equals_resident_alone(demo: Path) -> None:
    """The demo MoE (30 layers x 4 experts, every expert different) streamed through a
    5-slot cache: a step's union of experts goes in waves; each row still gets the bits
    the resident model gives it alone."""
    resident = co.Model.load(demo, engine=engine(precision="int8", threads=2, workers=0,
                                                 prefetch=False, preload=True,
                                                 context_length=128))
    want = [alone(resident, p, 3) for p in PROMPTS]
    resident.close()
    budget = budget_for_slots(demo, 5, threads=2, precision="int8", context_length=128)
    m = co.Model.load(demo, engine=engine(budget=budget, precision="int8", threads=2,
                                          workers=4, context_length=128))
    try:
        m.reset_stats()
        got = batched(m, PROMPTS, 3)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            for step, (a, b) in enumerate(zip(g, w, strict=True)):
                assert np.array_equal(a, b), (i, step, float(np.abs(a - b).max()))
        ex = m.stats().experts
        assert ex.misses > 0 and ex.read_errors == 0
    finally:
        m.close()
