"""The attack mix of tests/server/test_server_attack.py, run as its own process so that its
threads do not share the measuring client's GIL:

    python tests/support/attackers.py URL API_KEY SECONDS SLOW_CONNECTIONS CUT_STREAMS

It keeps SLOW_CONNECTIONS connections open against the server (a third send nothing, a
third send their headers a byte at a time, a third send complete headers and then their
body a byte at a time), opening a new one whenever the server closes one; it starts
CUT_STREAMS streamed chat completions spread over SECONDS and drops each after its first
event; and it sends hostile requests in a loop (a 20 MB body, 30,000 stop strings, a
1e6-value enum, bodies of the wrong JSON shape). It prints ``ready`` once the slow
connections are open, then after SECONDS one JSON line: how long the server let each kind
of slow connection live, how many of each kind it closed, the cut streams that got their
first event, and the statuses of the hostile requests by case.
"""

from __future__ import annotations

import json
import os
import resource
import select
import socket
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import httpx

_BYTE_INTERVAL = 0.5  # seconds between two bytes of one slow connection
_HOSTILE_PAUSE = 0.2  # seconds between two rounds of hostile requests


class _Slow:
    def __init__(self, kind: str, sock: socket.socket, payload: bytes) -> None:
        self.kind, self.sock, self.payload = kind, sock, payload
        self.opened = time.monotonic()
        self.sent = 0


def _slow_payload(kind: str, key: str) -> tuple[bytes, bytes]:
    """(sent at once, sent a byte at a time) for a slow connection of `kind`."""
    if kind == "silent":
        return b"", b""
    pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"x" * 30) for i in range(100))
    if kind == "headers":
        return b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + pad + b"\r\n"
    body = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "x" * 2000}],
                       "max_tokens": 1}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    return head, body


def slow_connections(addr: tuple[str, int], key: str, count: int, stop: threading.Event,
                     ready: threading.Event, out: dict[str, Any]) -> None:
    kinds = ("silent", "headers", "body")
    lifetimes: dict[str, list[float]] = defaultdict(list)
    open_conns: list[_Slow] = []
    opened = Counter[str]()
    errors = Counter[str]()

    def open_one(kind: str) -> None:
        try:
            s = socket.create_connection(addr, timeout=5)
        except OSError as exc:
            errors[type(exc).__name__] += 1
            return
        first, _ = _slow_payload(kind, key)
        if first:
            s.sendall(first)
        s.setblocking(False)
        open_conns.append(_Slow(kind, s, _slow_payload(kind, key)[1]))
        opened[kind] += 1

    for i in range(count):
        open_one(kinds[i % 3])
    ready.set()
    # A close is seen at the next pass over the sockets: a lifetime is measured up to one
    # pass late, by at most the longest pass (reported, for the test's bound).
    longest_pass = 0.0
    while not stop.is_set():
        t0 = time.monotonic()
        for c in list(open_conns):
            closed = False
            try:
                c.sock.recv(65536)  # b"" (closed) or the 408 that comes before the close
                closed = True
            except BlockingIOError:
                pass
            except OSError:
                closed = True
            if not closed and c.sent < len(c.payload):
                try:
                    c.sock.send(c.payload[c.sent:c.sent + 1])
                    c.sent += 1
                except BlockingIOError:
                    pass
                except OSError:
                    closed = True
            if closed:
                lifetimes[c.kind].append(time.monotonic() - c.opened)
                c.sock.close()
                open_conns.remove(c)
                open_one(c.kind)  # keep `count` of them open
        longest_pass = max(longest_pass, time.monotonic() - t0)
        stop.wait(max(0.0, _BYTE_INTERVAL - (time.monotonic() - t0)))
    for c in open_conns:
        c.sock.close()
    out["slow"] = {k: {"opened": opened[k], "closed_by_server": len(lifetimes[k]),
                       "max_lifetime_s": round(max(lifetimes[k], default=0.0), 3),
                       "still_open_at_end": sum(1 for c in open_conns if c.kind == k)}
                   for k in kinds}
    out["slow_connect_errors"] = dict(errors)
    out["slow_longest_pass_s"] = round(longest_pass + _BYTE_INTERVAL, 3)


def cut_streams(url: str, key: str, count: int, seconds: float, out: dict[str, Any]) -> None:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 200, "stream": True}
    got_first = 0
    for _ in range(count):
        start = time.monotonic()
        try:
            with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {key}"}) as c, \
                    c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        got_first += r.status_code == 200
                        break
        except httpx.HTTPError:
            pass
        time.sleep(max(0.0, seconds / count - (time.monotonic() - start)))
    out["cut_streams"] = {"started": count, "got_first_event": got_first}


def _raw_status(addr: tuple[str, int], head: bytes, body: bytes) -> int:
    """The status of a request sent over a raw socket, the body in 64 KiB pieces until a
    response arrives (the server answers 413 without reading the rest, then closes: a
    client still writing, as httpx does, sees a reset instead of the answer)."""
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(head)
        for i in range(0, len(body), 1 << 16):
            if select.select([s], [], [], 0)[0]:
                break
            try:
                s.sendall(body[i:i + (1 << 16)])
            except OSError:
                break
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


def _post_head(key: str, length: int) -> bytes:
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def hostile(url: str, addr: tuple[str, int], key: str, stop: threading.Event,
            out: dict[str, Any]) -> None:
    auth = {"Authorization": f"Bearer {key}"}
    msgs = [{"role": "user", "content": "Hi"}]
    body_20mb = b"x" * (20 * 1000 * 1000)
    enum = {"type": "json_schema", "json_schema": {"name": "e", "schema": {
        "type": "string", "enum": [f"v{i}" for i in range(1_000_000)]}}}
    enum_body = json.dumps({"model": "smollm2", "messages": msgs, "max_tokens": 1,
                            "response_format": enum}).encode()
    cases: dict[str, Any] = {
        "stop_30000": {"model": "smollm2", "messages": msgs, "max_tokens": 1,
                       "stop": [f"s{i}" for i in range(30_000)]},
        "messages_not_a_list": {"model": "smollm2", "messages": "hi"},
        "content_an_object": {"model": "smollm2", "messages": [{"role": "user",
                                                                 "content": {"a": 1}}]},
        "max_tokens_true": {"model": "smollm2", "messages": msgs, "max_tokens": True},
        "tool_call_function_a_string": {"model": "smollm2", "messages": [
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                  "function": "f"}]}]},
    }
    encoded = {name: json.dumps(b).encode() for name, b in cases.items()}
    encoded["not_json"] = b'{"model": "smollm2", "messages": ['
    encoded["a_json_list"] = b"[1, 2, 3]"
    statuses: dict[str, Counter[int]] = defaultdict(Counter)
    with httpx.Client(timeout=120, headers={**auth, "Content-Type": "application/json"}) as c:
        while not stop.is_set():
            statuses["body_20MB"][_raw_status(addr, _post_head(key, len(body_20mb)),
                                              body_20mb)] += 1
            statuses["enum_1e6"][_raw_status(addr, _post_head(key, len(enum_body)),
                                             enum_body)] += 1
            for name, data in encoded.items():
                if stop.is_set():
                    break
                try:
                    statuses[name][c.post(url + "/v1/chat/completions", content=data)
                                   .status_code] += 1
                except httpx.HTTPError as exc:
                    statuses[name][type(exc).__name__] += 1  # type: ignore[index]
            stop.wait(_HOSTILE_PAUSE)
    out["hostile"] = {name: {str(k): v for k, v in s.items()} for name, s in statuses.items()}


def main(argv: list[str]) -> int:
    # Lowest CPU priority: a real attacker's own CPU is on other machines; on the 2 cores
    # of a test host it would otherwise compete with the server's, which measures the
    # host, not the server. The server's work for the attack is at its normal priority.
    os.nice(19)
    url, key, seconds, slow, cuts = argv[0], argv[1], float(argv[2]), int(argv[3]), int(argv[4])
    # An optional sixth argument picks parts of the mix (to see which one costs what).
    mix = set(argv[5].split(",")) if len(argv) > 5 else {"slow", "cuts", "hostile"}
    slow = slow if "slow" in mix else 0
    cuts = cuts if "cuts" in mix else 0
    host, port = url.removeprefix("http://").split(":")
    addr = (host, int(port))
    out: dict[str, Any] = {}
    stop, ready = threading.Event(), threading.Event()
    threads = [threading.Thread(target=slow_connections, args=(addr, key, slow, stop, ready, out))]
    threads[0].start()
    ready.wait()
    print("ready", flush=True)
    threads.append(threading.Thread(target=cut_streams, args=(url, key, cuts, seconds, out)))
    if "hostile" in mix:
        threads.append(threading.Thread(target=hostile, args=(url, addr, key, stop, out)))
    for t in threads[1:]:
        t.start()
    time.sleep(seconds)
    threads[1].join()  # the cut streams, all of them
    stop.set()
    for t in threads:
        t.join()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["attacker_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
