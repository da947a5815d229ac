"""What used to hold the server's event loop or let a gone client's generation run on
(issue 35): a cancellation lost in the same turn as a result (``asyncio.wait_for`` before
Python 3.12), a token-id prompt validated against every member of its union, and the
cyclic GC's full collections over the whole loaded heap."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from colibri.server.loop_monitor import LoopMonitor
from colibri.server.scheduler import _within
from colibri.server.wire import CompletionRequest


def test_a_cancellation_in_the_same_turn_as_the_result_is_not_lost() -> None:
    async def main() -> None:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(_within(fut, 60.0))
        await asyncio.sleep(0)  # the task waits for `fut`
        fut.set_result(1)
        task.cancel()  # the same turn: asyncio.wait_for returned 1 here on 3.11
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_within_times_out_and_cancels_what_it_waited_for() -> None:
    async def main() -> None:
        slow = asyncio.ensure_future(asyncio.sleep(60))
        with pytest.raises(asyncio.TimeoutError):
            await _within(slow, 0.05)
        assert slow.cancelled()
        assert await _within(asyncio.sleep(0, "x"), None) == "x"

    asyncio.run(main())


def test_a_token_id_prompt_is_validated_in_linear_time() -> None:
    """2.7 million ids (an 8 MiB body) took 0.5-2 s on the loop: pydantic tried the
    union's `list[str]` first, an error per item. The result is the union's."""
    ids = [5] * 2_700_000
    t0 = time.perf_counter()
    r = CompletionRequest.model_validate({"model": "m", "prompt": ids})
    assert time.perf_counter() - t0 < 0.6
    assert r.prompt == ids and type(r.prompt) is list
    # Whatever is not a list of ints goes through the union as before.
    for prompt, want in (([True, 2], [1, 2]), (["1", "2"], ["1", "2"]), ([[1, 2]], [[1, 2]]),
                         ([], []), ("x", "x"), ([1.0], [1])):
        assert CompletionRequest.model_validate({"model": "m", "prompt": prompt}).prompt == want
    with pytest.raises(ValueError, match="integers only"):
        CompletionRequest.model_validate({"model": "m", "prompt": [1, "2"]})


def test_the_heap_is_frozen_while_the_monitor_runs_and_collections_are_timed() -> None:
    m = LoopMonitor()

    async def main() -> int:
        async with m.running():
            frozen = gc.get_freeze_count()
            junk = [[i] for i in range(50_000)]  # noqa: F841 - collected below
            gc.collect()
            return frozen

    frozen = asyncio.run(main())
    assert frozen > 1000  # everything that existed at the start
    assert gc.get_freeze_count() == 0  # given back at the end
    assert m.gc_max_pause > 0.0


def test_long_texts_are_encoded_with_the_gil_released_and_the_same_ids() -> None:
    """Texts from _RELEASE_GIL_FROM characters go through the tokenizers library's
    encode_batch (the GIL released; its encode held it 100 ms for 41k characters): the
    ids are encode's."""
    import colibri as co
    from colibri.tokenizers import core
    from support.realmodel import smollm2_gguf

    with co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=64)) as m:
        d = m.tokenizer._d
        enc = d.hf_plain if d.hf_full is not None else d.fragment_encoder
        text = "Naïve café — 12,345 tokens\n\t<|im_start|>user  ünïcödé 😀 " * 400
        for n in (core._RELEASE_GIL_FROM - 1, core._RELEASE_GIL_FROM, len(text)):
            piece = text[:n]
            want = enc.encode(piece, add_special_tokens=False).ids
            assert core._encode_one(enc, piece, False).ids == want, n
            assert enc.encode_batch([piece], add_special_tokens=False)[0].ids == want, n
