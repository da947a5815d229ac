"""The request-body size limit (``create_app(max_body_bytes=...)``, ``colibri serve
--max-body-bytes``): a body larger than the limit is answered 413 in the route's API
shape before it is parsed or tokenized. A declared ``Content-Length`` over the limit is
refused at once; a chunked body is counted as it arrives and refused at the first chunk
past the limit (the middleware reads the body, at most the limit, then hands it on).
Issue 35: a 20 MB message blocked the event loop for 20 s and a 100 MB one aborted the
server.

The body must also arrive within ``timeout`` seconds of the request's headers
(``create_app(body_timeout=...)``, ``colibri serve --body-timeout``), else the request is
answered 408 in the same shape and its connection closed: a client sending its body a
byte at a time holds a connection no longer than that (issue 35, item 9)."""

from __future__ import annotations

import asyncio
import json
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..sizes import format_bytes
from .errors import ApiError

__all__ = ["DEFAULT_BODY_TIMEOUT", "DEFAULT_MAX_BODY_BYTES", "LimitBody"]

DEFAULT_MAX_BODY_BYTES = 8 << 20
"""8 MiB: a 128k-token prompt is about 0.5 MB of text; the rest is headroom for tools,
schemas and JSON escapes."""

DEFAULT_BODY_TIMEOUT = 30.0
"""Seconds: 8 MiB at about 2.2 Mbit/s; a client slower than that is refused."""


DRAIN_BYTES = 64 << 20
DRAIN_SECONDS = 2.0


async def _drain(receive: Receive) -> None:
    """Read and drop what the client is still sending, at most DRAIN_BYTES for at most
    DRAIN_SECONDS, before a refusal closes the connection. Closing a socket with unread
    bytes makes the kernel reset the connection, and a client still uploading then often
    sees the reset before the 413 (tests/fuzz/http_campaign.py found it); a client that
    sends more than this, or slower, may still see a reset."""
    deadline = time.monotonic() + DRAIN_SECONDS
    seen = 0
    while seen < DRAIN_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            message = await asyncio.wait_for(receive(), left)
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request":
            return
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class LimitBody:
    """ASGI middleware refusing bodies over `max_bytes` with a 413, and bodies that take
    longer than `timeout` seconds (None: no limit) to arrive with a 408."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 timeout: float | None = DEFAULT_BODY_TIMEOUT) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _drain(receive)
                await self._refuse(scope, send, self._too_large())
                return
        # Read the whole body here, counting, before the app sees any of it (the app's
        # own body parsing would turn an exception into its own 400); then replay it.
        chunks: list[bytes] = []
        seen = 0
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            try:
                message = await asyncio.wait_for(
                    receive(), None if deadline is None else max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                await self._refuse(scope, send, ApiError(
                    408, f"the request body did not arrive within {self.timeout:g} s "
                         f"(--body-timeout)", code="timeout"))
                return
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                if message.get("more_body", False):
                    await _drain(receive)
                await self._refuse(scope, send, self._too_large())
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # then the disconnect, for streamed answers

        await self.app(scope, replay, send)

    def _too_large(self) -> ApiError:
        return ApiError(413, f"the request body is larger than the server's limit of "
                             f"{format_bytes(self.max_bytes)} (--max-body-bytes)",
                        code="request_too_large")

    @staticmethod
    async def _refuse(scope: Scope, send: Send, err: ApiError) -> None:
        """`err` in the route's API shape, closing the connection (the rest of the body is
        not read)."""
        anthropic = str(scope.get("path", "")).startswith("/v1/messages")
        body = json.dumps(err.anthropic_body() if anthropic else err.openai_body()).encode()
        await send({"type": "http.response.start", "status": err.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
