"""The parts of colibri.server.ray that need no Ray (every run): the routing text Ray's
prefix router matches, the in-process ASGI bridge a replica drives its server through
(against the Python API on the same GGUF), the NUMA claim on a fake sysfs tree, the
configuration checks and the missing-Ray error. The deployment itself:
tests/server/test_serve_ray.py (slow, needs the ray extra)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import colibri as co
from colibri.errors import ConfigError, UnsupportedError
from colibri.server.ray import RayServeConfig, ReplicaSpec, autoscaling_from_flags, require_ray
from colibri.server.ray.numa import claim_numa_node, numa_nodes, parse_cpulist
from colibri.server.ray.routing import ForwardedRequest, routing_text


def _body(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_routing_text_extends_with_the_conversation() -> None:
    turn1 = {"model": "m", "system": "Be terse.",
             "messages": [{"role": "user", "content": "Hello there"}]}
    turn2 = {**turn1, "messages": [*turn1["messages"],
                                   {"role": "assistant", "content": [{"type": "text",
                                                                      "text": "Hi."}]},
                                   {"role": "user", "content": "And now?"}]}
    t1 = routing_text("POST", "/v1/messages", _body(turn1))
    t2 = routing_text("POST", "/v1/messages", _body(turn2))
    assert t1 == "Be terse.Hello there"
    assert t2.startswith(t1) and t2 == t1 + "Hi.And now?"
    # Role names are left out: two different chats share no prefix.
    other = routing_text("POST", "/v1/chat/completions",
                         _body({"messages": [{"role": "user", "content": "Zebra"}]}))
    assert other == "Zebra"


def test_routing_text_of_prompts_and_textless_requests() -> None:
    assert routing_text("POST", "/v1/completions", _body({"prompt": "abc"})) == "abc"
    assert routing_text("POST", "/v1/completions", _body({"prompt": ["abc"]})) == "abc"
    assert routing_text("POST", "/v1/completions", _body({"prompt": [1, 22, 3]})) == "1 22 3"
    # Never empty (Ray's router divides by the length), never a prompt's start.
    for method, path, body in [("GET", "/v1/models", b""), ("POST", "/v1/chat/completions",
                                                            b"{not json"),
                               ("POST", "/v1/chat/completions", _body({"messages": []}))]:
        text = routing_text(method, path, body)
        assert text.startswith("\x00") and len(text) > 1


@pytest.fixture(scope="module")
def model() -> Iterator[co.Model]:
    from support.realmodel import smollm2_gguf

    with co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=256)) as m:
        yield m


def _request(path: str, body: dict[str, object]) -> ForwardedRequest:
    raw = _body(body)
    return ForwardedRequest("POST", path, b"", [(b"content-type", b"application/json"),
                                                (b"authorization", b"Bearer k")],
                            raw, routing_text("POST", path, raw))


def test_asgi_bridge_serves_create_app_in_process(model: co.Model) -> None:
    from colibri.server import create_app
    from colibri.server.ray.asgi_bridge import Lifespan, ResponseStart, call

    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    oracle = model.chat(msgs, max_tokens=10)

    async def run() -> tuple[list[object], list[object], list[object]]:
        app = create_app(model, model_name="m", api_key="k", max_running=2)
        life = Lifespan(app)
        await life.startup()
        plain = [x async for x in call(app, _request("/v1/chat/completions", {
            "model": "m", "messages": msgs, "max_tokens": 10, "temperature": 0}))]
        streamed = [x async for x in call(app, _request("/v1/chat/completions", {
            "model": "m", "messages": msgs, "max_tokens": 10, "temperature": 0,
            "stream": True}))]
        bad = [x async for x in call(app, _request("/v1/chat/completions", {
            "model": "nope", "messages": msgs}))]
        await life.shutdown()
        return plain, streamed, bad

    plain, streamed, bad = asyncio.run(run())
    head = plain[0]
    assert isinstance(head, ResponseStart) and head.status == 200
    body = json.loads(b"".join(x for x in plain[1:] if isinstance(x, bytes)))
    assert body["choices"][0]["message"]["content"] == oracle.text
    shead = streamed[0]
    assert isinstance(shead, ResponseStart)
    assert (shead.header("content-type") or "").startswith("text/event-stream")
    assert len(streamed) > 3  # the SSE frames arrive as separate pieces
    frames = b"".join(x for x in streamed[1:] if isinstance(x, bytes)).decode().split("\n\n")
    datas = [f.removeprefix("data: ") for f in frames if f.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or ""
                   for d in datas[:-1] if json.loads(d)["choices"])
    assert text == oracle.text
    bhead = bad[0]
    assert isinstance(bhead, ResponseStart) and bhead.status == 404


def test_numa_claim_takes_free_nodes_then_refuses(tmp_path: Path) -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    cpu = sorted(os.sched_getaffinity(0))[0]
    for n in (0, 1):
        (tmp_path / "sys" / f"node{n}").mkdir(parents=True)
        (tmp_path / "sys" / f"node{n}" / "cpulist").write_text(f"{cpu}\n")
    (tmp_path / "locks").mkdir()
    assert numa_nodes(tmp_path / "sys") == {0: [cpu], 1: [cpu]}
    before = os.sched_getaffinity(0)
    try:
        a = claim_numa_node(tmp_path / "sys", str(tmp_path / "locks"))
        b = claim_numa_node(tmp_path / "sys", str(tmp_path / "locks"))
        assert (a.node, b.node) == (0, 1)
        assert os.sched_getaffinity(0) == {cpu}
        with pytest.raises(ConfigError, match="already hold a replica"):
            claim_numa_node(tmp_path / "sys", str(tmp_path / "locks"))
        a._lock.close()  # a replica ending frees its node
        assert claim_numa_node(tmp_path / "sys", str(tmp_path / "locks")).node == 0
    finally:
        os.sched_setaffinity(0, before)
    with pytest.raises(ConfigError, match="no NUMA nodes"):
        claim_numa_node(tmp_path / "none")


def test_config_checks() -> None:
    with pytest.raises(ConfigError, match="placement"):
        RayServeConfig(placement="rack")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="router"):
        RayServeConfig(router="random")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not both"):
        RayServeConfig(num_replicas=2, autoscaling_config={"max_replicas": 3})
    with pytest.raises(ConfigError, match="num_replicas"):
        RayServeConfig(num_replicas=0)
    with pytest.raises(ConfigError, match="close_model"):
        ReplicaSpec("m", server={"close_model": False})
    assert autoscaling_from_flags(None, None, None) is None
    assert autoscaling_from_flags(1, 4, 8.0) == {"min_replicas": 1, "max_replicas": 4,
                                                 "target_ongoing_requests": 8.0}
    with pytest.raises(ConfigError, match="max-replicas"):
        autoscaling_from_flags(3, 2, None)


def test_missing_ray_says_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(UnsupportedError, match=r"pip install 'colibri\[ray\]'"):
        require_ray()


def test_serve_ray_passes_download_to_the_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    # `colibri serve --ray --download ID`: every replica loads with download=True (each
    # machine fetches into its own cache). Ray is faked: the deployment stops at serve.run,
    # after the replicas' spec is built.
    import types

    import colibri.server.ray as ray_pkg
    from colibri.cli import main

    built: list[ReplicaSpec] = []

    class Deployed(Exception):
        pass

    def fake_run(*_a: object, **_k: object) -> None:
        raise Deployed

    fake_serve = types.SimpleNamespace(start=lambda **_k: None, run=fake_run)
    monkeypatch.setattr(ray_pkg, "require_ray", lambda: fake_serve)
    monkeypatch.setattr(ray_pkg, "build_app", lambda spec, config: built.append(spec))
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
    for flags, want in (([], False), (["--download"], True)):
        # main() reports the fake's exception as an internal error (rc 1) once it has built.
        assert main(["serve", "--ray", "--port", "1", "org/some-model", *flags]) != 0
        assert built[-1].model == "org/some-model" and built[-1].download is want
