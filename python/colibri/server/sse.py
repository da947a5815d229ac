"""Server-sent events, and responses that notice a client going away.

:class:`EventStream` sends an async iterator of SSE frames while listening for the
client's ``http.disconnect``: when it comes, the iterator's task is cancelled at its
current ``await`` (for a generation: between tokens, colibri.generate.aio.pump_stream),
instead of running on until the next write fails. :class:`DeferredJSON`
does the same for a non-streamed answer: the result is computed while the disconnect is
listened for, and only then is the status chosen (an error raised while computing becomes
its JSON error). Both call ``on_close`` when done, whatever happened (the scheduler's
ticket is released there).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = "data: [DONE]\n\n"


def data(payload: Any) -> str:
    """One ``data:`` frame (OpenAI's streams)."""
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def event(name: str, payload: Any) -> str:
    """One named event (Anthropic's streams: ``event: content_block_delta``...)."""
    return (f"event: {name}\n"
            f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n")


async def _until_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _race(work: Awaitable[None], receive: Receive) -> bool:
    """Runs `work` until it ends or the client disconnects (then `work` is cancelled);
    True if the client disconnected first."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is stopping this request
        task.cancel()
        watch.cancel()
        await asyncio.gather(task, watch, return_exceptions=True)
        raise
    gone = watch.done() and not task.done()
    if gone:
        task.cancel()
    watch.cancel()
    await asyncio.gather(watch, return_exceptions=True)
    try:
        await task
    except asyncio.CancelledError:
        if not gone:
            raise
    return gone


class EventStream(StreamingResponse):
    """``text/event-stream`` from `frames`; cancelled when the client disconnects."""

    def __init__(self, frames: AsyncIterator[str], on_close: Callable[[], None] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(frames, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                  **(headers or {})})
        self.frames = frames
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def pump() -> None:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async for frame in self.frames:
                await send({"type": "http.response.body", "body": frame.encode(),
                            "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            await _race(pump(), receive)
        finally:
            aclose = getattr(self.frames, "aclose", None)
            if aclose is not None:
                await aclose()
            if self.on_close is not None:
                self.on_close()


class DeferredJSON(Response):
    """A JSON answer computed by `compute` (returning (status, body, headers)) while the
    client's disconnect is listened for; nothing is sent if it went away first."""

    def __init__(self, compute: Callable[[], Awaitable[tuple[int, Any, dict[str, str]]]],
                 on_close: Callable[[], None] | None = None) -> None:
        super().__init__(status_code=200)
        self.compute = compute
        self.on_close = on_close
        self.result: tuple[int, Any, dict[str, str]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def work() -> None:
            self.result = await self.compute()

        try:
            gone = await _race(work(), receive)
        finally:
            if self.on_close is not None:
                self.on_close()
        if gone or self.result is None:
            return
        status, body, headers = self.result
        self.status_code = status
        await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)
