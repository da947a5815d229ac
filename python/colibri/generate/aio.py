"""asyncio: ``await model.agenerate(...)`` and ``async for chunk in model.astream(...)``
(and the same on a Session), with the native work off the event loop.

Each step of the generation (the prefill, then one decode step per token) runs on a
worker thread; the core releases the GIL, so the loop stays responsive. Several
generations may run at once on one model: their forwards take turns on the engine, as
with threads.

Cancelling the task that awaits ``agenerate`` (or iterates ``astream``) stops the
generation between tokens: the step already running (a forward cannot be interrupted;
for a long prompt that is the whole prefill) finishes on its thread, then no further step
starts, and the session is rolled back to where it was before the call, so
``Session.n_tokens`` and ``token_ids`` are unchanged and the session is ready for the
next call (its last logits are recomputed by forwarding its last token once more). The
cancellation then propagates (``asyncio.CancelledError``). Leaving an ``async for``
early (``break``) is not a cancellation: like closing a sync stream, the tokens
generated so far stay in the session.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import AsyncGenerator, Generator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRequestError
from .generation import Chunk, Generation

if TYPE_CHECKING:
    from .request import Request
    from .runner import Runner
    from .session import Session

__all__ = ["agenerate_ids", "agenerate_stream", "apump_ids", "astream_ids", "astream_stream",
           "pump_stream"]

# One thread per generation in flight: under continuous batching (colibri.generate.batching)
# each waits in its forward for the shared step, so the pool must not cap the batch size.
_STEPS = concurrent.futures.ThreadPoolExecutor(
    max_workers=max(64, (os.cpu_count() or 1) + 4), thread_name_prefix="colibri-async"
)
_END = object()


def _step(gen: Generator[Chunk, None, None]) -> object:
    return next(gen, _END)


async def _settle(cf: concurrent.futures.Future[Any]) -> None:
    """Waits, without blocking the loop, for a step that is already running to end (its
    result or error is dropped), even if this task is cancelled again meanwhile."""
    while not cf.done():
        try:
            await asyncio.wrap_future(cf)
        except BaseException:
            continue


def _has_logits(session: Session) -> bool:
    try:
        session.last_logits()
    except InvalidRequestError:
        return False
    return True


def _restore(session: Session, n0: int, had_logits: bool) -> None:
    """Rolls `session` back to `n0` tokens; when it had logits then, recomputes them by
    forwarding its last token again (the KV entry is rewritten with the same values), so
    the next call can continue from them as before."""
    if had_logits and n0 > 0:
        last = session.token_ids[n0 - 1]
        session.rollback(session.n_tokens - n0 + 1)
        session.forward([last])
    else:
        session.rollback(session.n_tokens - n0)


async def astream_stream(gen: Generator[Chunk, None, None],
                         session: Session) -> AsyncGenerator[Chunk, None]:
    """Drives the sync stream `gen` (on `session`) from the event loop, one step per
    worker-thread call. On cancellation: the running step ends, the stream is closed,
    the session is rolled back to its length at the start, the cancellation re-raised."""
    n0 = session.n_tokens
    had_logits = _has_logits(session)
    finished = False
    try:
        while True:
            cf = _STEPS.submit(_step, gen)
            try:
                chunk = await asyncio.wrap_future(cf)
            except asyncio.CancelledError as cancelled:
                await _settle(cf)
                gen.close()  # its bookkeeping (stats) runs now
                finished = True
                if session.n_tokens > n0:
                    restore = _STEPS.submit(_restore, session, n0, had_logits)
                    await _settle(restore)
                    if restore.exception() is not None:  # the session could not be restored
                        raise restore.exception() from cancelled  # type: ignore[misc]
                raise
            if chunk is _END:
                finished = True
                return
            assert isinstance(chunk, Chunk)
            yield chunk
    finally:
        if not finished:
            gen.close()  # left early (break / aclose) between steps


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def pump_stream(gen: Generator[Chunk, None, None], session: Session,
                      restore: bool = True) -> AsyncGenerator[Chunk, None]:
    """:func:`astream_stream` with the generation running ahead of its consumer: ONE
    worker-thread call drives `gen` to its end, handing each chunk to the event loop
    through a queue, so the generation samples and submits its next forward right after
    each one (it never waits for the loop or the client). Under a model's
    :class:`~colibri.generate.batching.StepBatcher` it is registered (``enter``), so every step
    waits for its row: the server's path. Cancellation as :func:`astream_stream` (the
    generation stops after the token in flight, the session is rolled back); leaving
    early stops it too, keeping its tokens. Under the batcher a forward still waiting
    for its step when the generation is cancelled or left is dropped
    (:meth:`~colibri.generate.batching.StepBatcher.cancel`): it stops before that step.
    ``restore=False`` skips the roll-back (which for a session with logits is one more
    forward): for a session nobody uses after the generation."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[object] = asyncio.Queue()
    stop = threading.Event()
    n0 = session.n_tokens
    had_logits = _has_logits(session)
    batcher = session._runner.batcher

    def put(item: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            stop.set()

    def produce() -> None:
        if batcher is not None:
            batcher.enter(session)
            if stop.is_set():  # cancelled before it entered: the loop's cancel missed it
                batcher.cancel(session)
        try:
            for chunk in gen:
                put(chunk)
                if stop.is_set():
                    break
            else:
                put(_END)
        except BaseException as exc:
            put(_Failed(exc))
        finally:
            if batcher is not None:
                batcher.exit(session)
            gen.close()  # its bookkeeping (stats, the prompt cache) runs now

    cf = _STEPS.submit(produce)
    finished = False
    try:
        while True:
            item = await queue.get()
            if item is _END:
                finished = True
                return
            if isinstance(item, _Failed):
                finished = True
                raise item.exc
            assert isinstance(item, Chunk)
            yield item
    except asyncio.CancelledError as cancelled:
        stop.set()
        if batcher is not None:
            batcher.cancel(session)
        await _settle(cf)
        finished = True
        if restore and session.n_tokens > n0:
            undo = _STEPS.submit(_restore, session, n0, had_logits)
            await _settle(undo)
            if undo.exception() is not None:  # the session could not be restored
                raise undo.exception() from cancelled  # type: ignore[misc]
        raise
    finally:
        if not finished:  # left early (break / aclose)
            stop.set()
            if batcher is not None:
                batcher.cancel(session)
            await _settle(cf)


async def agenerate_stream(gen: Generator[Chunk, None, None], session: Session,
                           result: Mapping[str, Any], prompt_ids: list[int]) -> Generation:
    """:func:`astream_stream` to its end, as a Generation (see generation.collect)."""
    pieces = [c.text async for c in astream_stream(gen, session)]
    return Generation("".join(pieces), result["generated"], result["finish"], result["stats"],
                      prompt_ids, result.get("logprobs"), result.get("prompt_logprobs"))


async def agenerate_ids(runner: Runner, ids: list[int], request: Request) -> Generation:
    """``Model.agenerate`` of prompt `ids` (already fitted to the context)."""
    result: dict[str, Any] = {}
    session, gen = runner.start(ids, request, result)
    return await agenerate_stream(gen, session, result, ids)


def astream_ids(runner: Runner, ids: list[int], request: Request) -> AsyncGenerator[Chunk, None]:
    """``Model.astream`` of prompt `ids` (already fitted to the context)."""
    session, gen = runner.start(ids, request, {})
    return astream_stream(gen, session)


def apump_ids(runner: Runner, ids: list[int], request: Request) -> AsyncGenerator[Chunk, None]:
    """:func:`astream_ids` with the generation running ahead of its consumer
    (:func:`pump_stream`): the server's path. The session is this generation's own (new,
    or taken out of the prompt cache) and a cancelled generation's is not cached, so it is
    not rolled back on cancellation."""
    session, gen = runner.start(ids, request, {})
    return pump_stream(gen, session, restore=False)
