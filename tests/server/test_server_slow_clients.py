"""Slow clients are timed out (issue 35, item 9: 250 connections that never finished
their headers stayed open). Over raw sockets against ``colibri serve`` with one-second
limits: a connection that sends nothing, or its headers a byte at a time, gets 408 and is
closed by --header-timeout, also on a kept-alive connection (whose keep-alive timer the
first byte used to cancel for good); a body that dribbles in gets 408 in the route's API
shape by --body-timeout; an idle connection is closed by --keep-alive-timeout; a
connection past --max-connections gets 503 at once. Clients that keep up are not cut."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from support.cli_run import colibri_cli
from support.realmodel import smollm2_gguf
from support.server_helpers import SERVER_KEY, ServerProcess

LIMIT = 1.0  # --header-timeout, --body-timeout and --keep-alive-timeout, seconds
SLACK = 2.0  # a loaded 2-core host may run a timer late; the old behaviour is "never"
MAX_CONNECTIONS = 24


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    s = ServerProcess(smollm2_gguf(), "-c", "256", "--api-key", SERVER_KEY, "-q",
                      "--served-model-name", "smollm2", "--header-timeout", str(LIMIT),
                      "--body-timeout", str(LIMIT), "--keep-alive-timeout", str(LIMIT),
                      "--max-connections", str(MAX_CONNECTIONS))
    yield s
    assert s.stop() == 0, s.log()


def _connect(server: ServerProcess) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes the connection; fails if it is still
    open after `timeout` seconds."""
    sock.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        except TimeoutError:
            raise AssertionError(f"the server kept the connection open {timeout} s") from None
        if not chunk:
            return data
        data += chunk
        sock.settimeout(max(0.01, deadline - time.monotonic()))


def _dribble(sock: socket.socket, payload: bytes, interval: float) -> float:
    """Sends `payload` a byte every `interval` s until the server closes the connection
    (then the seconds it took), failing if the whole payload went out first."""
    t0 = time.monotonic()
    for b in payload:
        try:
            sock.sendall(bytes([b]))
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - t0
        time.sleep(interval)
        sock.setblocking(False)
        try:
            if sock.recv(65536, socket.MSG_PEEK) == b"":
                return time.monotonic() - t0
        except BlockingIOError:
            pass
        except ConnectionResetError:
            return time.monotonic() - t0
        finally:
            sock.setblocking(True)
    raise AssertionError("the server took the whole slow payload without closing")


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (with a Content-Length) from a kept-alive connection."""
    sock.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def _json_body(response: bytes) -> dict[str, object]:
    body: dict[str, object] = json.loads(response.split(b"\r\n\r\n", 1)[1])
    return body


SLOW_HEADERS = (b"GET /health HTTP/1.1\r\nHost: localhost\r\n"
                + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"x" * 20) for i in range(20)) + b"\r\n")


def test_a_connection_that_sends_nothing_gets_408_and_is_closed(server: ServerProcess) -> None:
    with _connect(server) as sock:
        t0 = time.monotonic()
        response = _read_until_closed(sock, LIMIT + SLACK)
        assert time.monotonic() - t0 >= LIMIT * 0.9
    assert _status(response) == 408, response
    assert _json_body(response)["error"]["code"] == "timeout"  # type: ignore[index]


def test_headers_sent_a_byte_at_a_time_are_cut_off(server: ServerProcess) -> None:
    with _connect(server) as sock:
        took = _dribble(sock, SLOW_HEADERS, 0.05)
    assert LIMIT * 0.9 <= took <= LIMIT + SLACK


def test_the_next_request_on_a_kept_alive_connection_is_timed_too(
        server: ServerProcess) -> None:
    # uvicorn's keep-alive timer is cancelled by the first byte of the next request and
    # re-armed only by a response: before, a byte every few seconds held it for ever.
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        first = _read_response(sock)
        assert _status(first) == 200, first
        took = _dribble(sock, SLOW_HEADERS, 0.05)
    assert LIMIT * 0.9 <= took <= LIMIT + SLACK


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_a_body_that_dribbles_in_gets_408_in_the_route_shape(
        server: ServerProcess, path: str) -> None:
    body = json.dumps({"model": "smollm2", "max_tokens": 1,
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {SERVER_KEY}\r\nContent-Length: {len(body)}\r\n\r\n")
    with _connect(server) as sock:
        sock.sendall(head.encode() + body[:5])  # the headers in time, the body never
        t0 = time.monotonic()
        response = _read_until_closed(sock, LIMIT + SLACK)
        assert time.monotonic() - t0 >= LIMIT * 0.9
    assert _status(response) == 408, response
    err = _json_body(response)
    if path == "/v1/messages":
        assert err["type"] == "error" and err["error"]["type"] == "timeout_error"  # type: ignore[index]
    else:
        assert err["error"]["code"] == "timeout"  # type: ignore[index]


def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(
        server: ServerProcess) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _status(_read_response(sock)) == 200
        t0 = time.monotonic()
        assert _read_until_closed(sock, LIMIT + SLACK) == b""  # closed, nothing sent
        assert time.monotonic() - t0 >= LIMIT * 0.9


def test_clients_that_keep_up_are_not_cut(server: ServerProcess) -> None:
    # One connection for longer than the three limits together: requests spaced under the
    # keep-alive timeout, a body sent in two halves within the body timeout, and a
    # generation that may outlast the header timeout.
    body = json.dumps({"model": "smollm2", "max_tokens": 16, "temperature": 0,
                       "messages": [{"role": "user", "content": "Tell a story."}]}).encode()
    head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            f"Authorization: Bearer {SERVER_KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with _connect(server) as sock:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2 * LIMIT:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert _status(_read_response(sock)) == 200
            time.sleep(LIMIT / 4)
        sock.sendall(head + body[:10])
        time.sleep(LIMIT / 4)
        sock.sendall(body[10:])
        answer = _read_response(sock)
        assert _status(answer) == 200, answer
        assert _json_body(answer)["usage"]["completion_tokens"] > 0  # type: ignore[index]
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _status(_read_response(sock)) == 200


def test_a_connection_past_the_cap_gets_503_at_once(server: ServerProcess) -> None:
    held = [_connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.1)  # the server has accepted them all (they live 1 s)
        with _connect(server) as extra:
            response = _read_until_closed(extra, SLACK)
        assert _status(response) == 503, response
        assert b"retry-after: 1" in response.lower()
        assert _json_body(response)["error"]["code"] == "too_many_connections"  # type: ignore[index]
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)  # the server sees them closed
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_kept_alive_responses_are_not_held_for_the_delayed_ack(server: ServerProcess) -> None:
    # The listening socket was made with proto 0, so asyncio did not set TCP_NODELAY on
    # its connections: uvicorn writes a response's headers and body separately, and
    # Nagle held the body until the client's delayed ACK, 40 ms on Linux, on every
    # response but a connection's first. The median over 20 keeps host noise out.
    with _connect(server) as sock:
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert _status(_read_response(sock)) == 200
            times.append(time.perf_counter() - t0)
    assert sorted(times)[10] < 0.02, times


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--header-timeout", "-1", "must be a number of seconds >= 0"),
    ("--body-timeout", "nan", "must be a number of seconds >= 0"),
    ("--keep-alive-timeout", "inf", "must be a number of seconds >= 0"),
    ("--max-connections", "-2", "must be >= 0"),
    ("--max-body-bytes", "0", "must be at least 1 byte"),
    ("--kv-budget", "lots", "--kv-budget"),
    ("--max-messages", "0", "must be at least 1"),
])
def test_bad_limits_are_usage_errors_before_the_model_loads(
        flag: str, value: str, message: str) -> None:
    r = colibri_cli("serve", "no-such-model", flag, value)
    assert r.returncode == 2, r.stderr
    assert f"argument {flag}: " in r.stderr and message in r.stderr, r.stderr
