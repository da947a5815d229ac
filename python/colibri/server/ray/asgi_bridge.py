"""Running colibri's ASGI app (``create_app``) inside a Ray Serve replica without a socket
(no Ray import): ``call`` sends one request through the app and yields the response as it
comes (its start, then body pieces, so an SSE stream stays a stream across the
DeploymentHandle); ``Lifespan`` runs the app's lifespan protocol, whose shutdown drains
the running requests and closes the model, exactly as under uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import ASGIApp, Message

from .routing import ForwardedRequest


@dataclasses.dataclass
class ResponseStart:
    """The first item ``call`` yields: the status and headers (names lower-case)."""

    status: int
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


_DONE = object()


async def call(app: ASGIApp, req: ForwardedRequest) -> AsyncIterator[ResponseStart | bytes]:
    """Yields a ResponseStart, then the body's non-empty pieces. Closing the iterator
    early (the client went away) tells the app the client disconnected, which cancels the
    generation, as a dropped connection does under uvicorn."""
    path, _, _ = req.path.partition("?")
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1", "method": req.method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": req.query_string, "headers": req.headers,
        "client": ("ray-serve", 0), "server": ("colibri-replica", 0),
    }
    sent: asyncio.Queue[Message | object] = asyncio.Queue()
    disconnected = asyncio.Event()
    body_given = False

    async def receive() -> Message:
        nonlocal body_given
        if not body_given:
            body_given = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await sent.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await sent.put(_DONE)

    task = asyncio.create_task(run())
    started = False
    try:
        while True:
            message = await sent.get()
            if message is _DONE:
                break
            assert isinstance(message, dict)
            if message["type"] == "http.response.start":
                started = True
                yield ResponseStart(int(message["status"]),
                                    [(k.decode("latin-1").lower(), v.decode("latin-1"))
                                     for k, v in message.get("headers", [])])
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
        await task  # raises what the app raised
        if not started:
            raise RuntimeError(f"the app sent no response to {req.method} {path}")
    finally:
        disconnected.set()
        if not task.done():
            # Give the app its disconnect, then stop it if it does not end by itself.
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(task), 5.0)
            task.cancel()


class Lifespan:
    """The ASGI lifespan protocol for one app: ``startup()`` before the first request,
    ``shutdown()`` at the end (colibri's drains running requests, then closes the model
    when the app was made with ``close_model=True``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def _expect(self, what: str) -> None:
        assert self._task is not None
        message = await self._outbox.get()
        if message["type"] != f"lifespan.{what}.complete":
            raise RuntimeError(f"the app's lifespan {what} failed: {message.get('message', '')}")

    async def startup(self) -> None:
        async def receive() -> Message:
            return await self._inbox.get()

        async def send(message: Message) -> None:
            await self._outbox.put(message)

        async def run() -> None:
            await self.app({"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                            "state": {}}, receive, send)

        self._task = asyncio.create_task(run())
        await self._inbox.put({"type": "lifespan.startup"})
        await self._expect("startup")

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._expect("shutdown")
        await self._task
