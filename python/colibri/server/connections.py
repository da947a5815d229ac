"""Bounds on HTTP connections for ``colibri serve`` (issue 35, item 9: slow clients were
never timed out; 250 connections that never finished their headers stayed open).

uvicorn's HTTP/1.1 protocol (h11) has a keep-alive timer, but it is armed only after a
response and cancelled by the next byte received: a connection that never sends a byte,
or sends its request headers a byte at a time, stays open for ever. `timed_h11_protocol`
returns uvicorn's h11 protocol with two additions, passed to ``uvicorn.Config(http=...)``:

- a header timeout: from the moment a connection opens, or the first byte of a later
  request on a kept-alive connection arrives, its request line and headers must be
  complete within ``header_timeout`` seconds; else it gets a 408 (OpenAI's error shape:
  no route is known yet) and is closed. The body has its own timeout (body_limit.py);
  the time between requests is uvicorn's ``timeout_keep_alive``.
- a cap on open connections: a connection opened while ``max_connections`` are open gets
  a 503 (``Retry-After: 1``) and is closed at once, before it costs more than its socket.
  uvicorn's ``limit_concurrency`` is not used: it counts connections too but answers
  only once the headers arrive (a slow client holds its place until then) and in
  plain text.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import ApiError

__all__ = ["timed_h11_protocol"]


def _raw_response(status: int, reason: str, err: ApiError, extra: str = "") -> bytes:
    """A complete HTTP/1.1 response closing the connection, written without h11 (whose
    state machine sends no response before a request)."""
    body = json.dumps(err.openai_body()).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n")
    return head.encode() + body


def timed_h11_protocol(header_timeout: float | None,
                       max_connections: int | None) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header timeout and a connection cap (None: none)."""

    class TimedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if max_connections is not None and len(self.connections) > max_connections:
                err = ApiError(503, f"the server has {max_connections} connections open, its "
                                    "limit (--max-connections); retry after 1 s",
                               code="too_many_connections")
                self.transport.write(_raw_response(503, "Service Unavailable", err,
                                                   "retry-after: 1\r\n"))
                self.transport.close()
                return
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            # Bytes of a new request on a kept-alive connection: uvicorn's keep-alive timer
            # is cancelled by them (in super()); the header timer takes over.
            if self.conn.their_state is h11.IDLE:
                self._arm_header_timer()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the headers are complete
                self._cancel_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            if header_timeout is not None and self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout,
                                                          self._header_timed_out)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timed_out(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            err = ApiError(408, f"the request headers did not arrive within "
                                f"{header_timeout:g} s (--header-timeout)", code="timeout")
            self.transport.write(_raw_response(408, "Request Timeout", err))
            self.transport.close()

    return TimedH11Protocol

