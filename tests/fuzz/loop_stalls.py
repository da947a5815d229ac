"""Which requests stall the server's event loop, and for how long (issue 35: the loop
must answer a health probe within 100 ms whatever one request sends).

Serves SmolLM2 in this process (uvicorn on this asyncio loop, ``create_app`` as ``colibri
serve`` builds it) and sends heavy requests one at a time from a client thread (their
bodies built beforehand). For each, prints the status, the time, the loop's worst
wake-up lag (a 1 ms timer) and the longest cyclic-GC pause while it was served. Work run
on the loop, and C code that holds the GIL on any thread, both show as lag. From
``tests/``::

    PYTHONPATH=.:../python:../build/dev/NAME ../.venv/bin/python -m fuzz.loop_stalls \\
        [--only prompt_ids_8MiB,enum_5000] [--rounds 2]

The first round includes first-request costs; the host's own load shows in ``idle``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from typing import Any

import httpx

_PORT = 8765
_worst: dict[str, float] = {}
_gc: dict[str, float] = {}
_label = ["idle"]
_gc_started = [0.0]


def _on_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    else:
        pause = time.perf_counter() - _gc_started[0]
        _gc[_label[0]] = max(_gc.get(_label[0], 0.0), pause)


async def _monitor() -> None:
    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        lag = time.perf_counter() - t0 - 0.001
        _worst[_label[0]] = max(_worst.get(_label[0], 0.0), lag)


def cases() -> dict[str, tuple[str, Any]]:
    """name -> (path, body): each a request issue 35's limits let through or refuse late."""
    hi = [{"role": "user", "content": "Hi"}]
    chat = "/v1/chat/completions"
    props = {f"p{i}": {"type": "string"} for i in range(2000)}

    def enum(n: int) -> dict[str, Any]:
        return {"type": "json_schema", "json_schema": {"name": "e", "schema": {
            "type": "string", "enum": [f"v{i}" for i in range(n)]}}}

    return {
        "chat_one_token": (chat, {"messages": hi, "max_tokens": 1}),
        "message_600k_chars": (chat, {"max_tokens": 1, "messages": [
            {"role": "user", "content": "The quick brown fox jumps. " * 22000}]}),
        "prompt_ids_8MiB": ("/v1/completions", {"max_tokens": 1, "prompt": [1] * 2_700_000}),
        "ints_8MiB_unknown_field": (chat, {"messages": hi, "x": [1] * 2_700_000}),
        "string_8MB_unknown_field": (chat, {"messages": hi, "max_tokens": 1,
                                            "x": "a" * 8_000_000}),
        "stop_19000_strings": (chat, {"messages": hi, "stop": [f"s{i}" for i in range(19000)]}),
        "stop_19000_ints": (chat, {"messages": hi, "stop": list(range(19000))}),
        "nested_20000": (chat, b'{"model":"m","messages":' + b"[" * 20000 + b"]" * 20000
                         + b"}"),
        "messages_5000": (chat, {"max_tokens": 1, "messages": [
            {"role": "user", "content": "hi there"}] * 5000}),
        "enum_5000": (chat, {"messages": hi, "max_tokens": 1, "response_format": enum(5000)}),
        "enum_19000": (chat, {"messages": hi, "max_tokens": 1, "response_format": enum(19000)}),
        "tools_4x2000_params": (chat, {"messages": hi, "max_tokens": 1, "tool_choice": "required",
                                       "tools": [{"type": "function", "function": {
                                           "name": f"f{j}", "parameters": {
                                               "type": "object", "properties": props}}}
                                                 for j in range(4)]}),
        "regex_pattern": (chat, {"messages": hi, "max_tokens": 1, "response_format": {
            "type": "json_schema", "json_schema": {"name": "e", "schema": {
                "type": "string", "pattern": "(a|b|c|d)*" * 200}}}}),
        "anthropic_500k_chars": ("/v1/messages", {"max_tokens": 1, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "word " * 100000}]}]}),
        "stream_50_tokens": (chat, {"messages": hi, "max_tokens": 50, "stream": True}),
    }


def _client(url: str, only: set[str], rounds: int) -> None:
    bodies = {}
    for name, (path, body) in cases().items():
        if only and name not in only:
            continue
        if isinstance(body, dict):
            body = json.dumps({"model": "m", **body}).encode()
        bodies[name] = (path, body)
    with httpx.Client(timeout=300) as c:
        for _ in range(rounds):
            for name, (path, body) in bodies.items():
                _label[0] = "idle"
                time.sleep(0.3)
                _label[0] = name
                t0 = time.perf_counter()
                r = c.post(url + path, content=body,
                           headers={"content-type": "application/json"})
                seconds = time.perf_counter() - t0
                _label[0] = "idle"
                lag, pause = _worst.pop(name, 0.0), _gc.pop(name, 0.0)
                print(f"{name:26s} {r.status_code} {seconds * 1000:7.0f} ms   loop lag "
                      f"{lag * 1000:6.1f} ms   GC {pause * 1000:5.1f} ms   {r.text[:70]!r}",
                      flush=True)
    print(f"{'idle':26s} loop lag {_worst.get('idle', 0.0) * 1000:.1f} ms, GC "
          f"{_gc.get('idle', 0.0) * 1000:.1f} ms")


async def _main(only: set[str], rounds: int, context: int) -> None:
    import uvicorn

    import colibri as co
    from colibri.server.app import create_app
    from support.realmodel import smollm2_gguf

    model = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=context))
    app = create_app(model, model_name="m", max_running=4)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=_PORT,
                                           log_level="warning"))
    loop = asyncio.get_running_loop()
    monitor = loop.create_task(_monitor())
    serving = loop.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    await asyncio.to_thread(_client, f"http://127.0.0.1:{_PORT}", only, rounds)
    server.should_exit = True
    await serving
    monitor.cancel()
    model.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--context", type=int, default=512)
    args = ap.parse_args()
    gc.callbacks.append(_on_gc)
    only = {x for x in args.only.split(",") if x}
    asyncio.run(_main(only, args.rounds, args.context))


if __name__ == "__main__":
    main()
