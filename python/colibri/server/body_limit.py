"""The request-body size limit (``create_app(max_body_bytes=...)``, ``colibri serve
--max-body-bytes``): a body larger than the limit is answered 413 in the route's API
shape before it is parsed or tokenized. A declared ``Content-Length`` over the limit is
refused at once; a chunked body is counted as it arrives and refused at the first chunk
past the limit (the middleware reads the body, at most the limit, then hands it on).
Issue 35: a 20 MB message blocked the event loop for 20 s and a 100 MB one aborted the
server."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..sizes import format_bytes
from .errors import ApiError

__all__ = ["DEFAULT_MAX_BODY_BYTES", "LimitBody"]

DEFAULT_MAX_BODY_BYTES = 8 << 20
"""8 MiB: a 128k-token prompt is about 0.5 MB of text; the rest is headroom for tools,
schemas and JSON escapes."""


class LimitBody:
    """ASGI middleware refusing bodies over `max_bytes` with a 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._refuse(scope, send)
                return
        # Read the whole body here, counting, before the app sees any of it (the app's
        # own body parsing would turn an exception into its own 400); then replay it.
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await self._refuse(scope, send)
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

    async def _refuse(self, scope: Scope, send: Send) -> None:
        err = ApiError(413, f"the request body is larger than the server's limit of "
                            f"{format_bytes(self.max_bytes)} (--max-body-bytes)",
                       code="request_too_large")
        anthropic = str(scope.get("path", "")).startswith("/v1/messages")
        body = json.dumps(err.anthropic_body() if anthropic else err.openai_body()).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
