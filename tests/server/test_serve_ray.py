"""Scale-out on Ray Serve (colibri.server.ray), slow: a one-node Ray cluster on 127.0.0.1
(``ray start --head --block`` in a subprocess, its files in a temporary directory), two
replicas of SmolLM2 behind the ingress, driven by the official ``openai`` client. The
oracle is the Python API on the same GGUF in this process: every greedy answer through
Ray equals ``Model.chat`` / ``Model.generate``; the ``x-colibri-replica`` header says
which replica answered, so the test sees both serve, and a chat's next turn go back to
the replica that served its first (Ray's PrefixCacheAffinityRouter)."""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

import colibri as co

pytestmark = pytest.mark.slow

KEY = "ray-test-key"
CTX = 512
# Distinct first words: Ray's prefix router matches on the messages' text, so prompts
# sharing a long start would (rightly) be sent to the same replica.
QUESTIONS = ["What is the capital of France?", "Name three colours.", "Tell me a joke.",
             "Hi!", "Count to five.", "Why is the sky blue?", "List two planets.",
             "Give me a word that rhymes with cat."]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _colibri_path() -> str:
    """PYTHONPATH for the Ray workers: where this process found colibri and its core."""
    dirs = {str(Path(p).resolve().parent) for p in co.__path__}
    return os.pathsep.join(sorted(dirs))


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed (pip install 'colibri[ray]')")
    import ray

    tmp = tempfile.mkdtemp(prefix="colibri-ray-")  # short: Ray's socket paths live in it
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": _colibri_path(), "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}
    # Fixed agent ports: with port 0 the raylet waits a fixed time for the agents to
    # report theirs, which a loaded 2-core machine can exceed.
    cmd = [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
           "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "4",
           "--include-dashboard", "false", "--temp-dir", tmp, "--disable-usage-stats",
           "--object-store-memory", str(100 * 2**20),
           "--dashboard-agent-grpc-port", str(_free_port()),
           "--dashboard-agent-listen-port", str(_free_port()),
           "--metrics-export-port", str(_free_port()),
           "--runtime-env-agent-port", str(_free_port())]
    head = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RAY_AUTH_MODE", "disabled")
            while True:
                if head.poll() is not None:
                    raise RuntimeError(f"ray start exited {head.returncode}; logs in {tmp}")
                try:
                    ray.init(address=address, log_to_driver=False)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(2)
            yield address
    finally:
        from ray import serve

        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        # --block: SIGTERM makes `ray start` stop the node's processes it started.
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def ray_base(ray_cluster: str, smollm2_gguf_path: Path) -> str:
    from ray import serve

    from colibri.server.ray import RayServeConfig, ReplicaSpec, build_app

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    spec = ReplicaSpec(str(smollm2_gguf_path), co.EngineConfig(context_length=CTX),
                       server={"model_name": "smollm2", "api_key": KEY, "max_running": 2,
                               "max_queue": 8})
    # placement "any": both replicas on this one node (the default, "node", puts at most
    # one on each machine).
    serve.run(build_app(spec, RayServeConfig(num_replicas=2, placement="any")),
              name="colibri", route_prefix="/")
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def smollm2_gguf_path() -> Path:
    from support.realmodel import smollm2_gguf

    return smollm2_gguf()


@pytest.fixture(scope="module")
def oracle(smollm2_gguf_path: Path) -> Iterator[co.Model]:
    with co.Model.load(smollm2_gguf_path, engine=co.EngineConfig(context_length=CTX)) as m:
        yield m


@pytest.fixture(scope="module")
def client(ray_base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=ray_base, api_key=KEY, max_retries=0, timeout=180)


def _chat(client: openai.OpenAI, messages: list[dict[str, str]]) -> tuple[str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model="smollm2", messages=messages, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    replica = raw.headers.get("x-colibri-replica")
    assert replica, "the answer has no x-colibri-replica header"
    return replica, raw.parse().choices[0].message.content or ""


def test_concurrent_chats_through_two_replicas(client: openai.OpenAI, oracle: co.Model) -> None:
    convs = [[{"role": "user", "content": q}] for q in QUESTIONS]
    with cf.ThreadPoolExecutor(len(convs)) as pool:
        answers = list(pool.map(lambda m: _chat(client, m), convs))
    for msgs, (_, text) in zip(convs, answers, strict=True):
        assert text == oracle.chat(msgs, max_tokens=16).text, msgs
    replicas = {r for r, _ in answers}
    assert len(replicas) == 2, f"one replica served everything: {answers}"

    # A chat's next turn repeats its first: Ray's prefix router sends it back.
    for msgs, (first, text) in list(zip(convs, answers, strict=True))[:3]:
        turn2 = [*msgs, {"role": "assistant", "content": text},
                 {"role": "user", "content": "Say that again, shorter."}]
        again, text2 = _chat(client, turn2)
        assert again == first, f"turn 2 of {msgs} went to {again}, turn 1 to {first}"
        assert text2 == oracle.chat(turn2, max_tokens=16).text


def test_stream_and_completion_through_ray(client: openai.OpenAI, oracle: co.Model) -> None:
    msgs = [{"role": "user", "content": "Hi"}]
    pieces, finish = [], None
    for chunk in client.chat.completions.create(model="smollm2", messages=msgs,  # type: ignore[arg-type]
                                                max_tokens=12, temperature=0, stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    g = oracle.chat(msgs, max_tokens=12)
    assert "".join(pieces) == g.text
    assert finish == g.finish_reason
    r = client.completions.create(model="smollm2", prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    assert r.choices[0].text == oracle.generate("The capital of France is", max_tokens=8).text


def test_errors_come_back_from_the_replica(ray_base: str, client: openai.OpenAI) -> None:
    bad_key = openai.OpenAI(base_url=ray_base, api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=2)
    assert exc.value.code == "model_not_found"
    assert [m.id for m in client.models.list()] == ["smollm2"]


def test_cli_serve_ray(ray_cluster: str, ray_base: str, oracle: co.Model,
                       monkeypatch: pytest.MonkeyPatch, smollm2_gguf_path: Path) -> None:
    """``colibri serve MODEL --ray`` on the same cluster (after the fixture's app is
    removed: one Serve instance per cluster): it deploys, serves, and at SIGTERM deletes
    its application and exits 0. Last in the module: it shuts the fixture's Serve down."""
    import ray
    from ray import serve

    from support import server_helpers
    serve.shutdown()
    # Wait for the controller to be gone: a `serve.start` meeting it while it shuts down
    # loses its proxy.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        except ValueError:
            break
        time.sleep(1)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setattr(server_helpers, "START_TIMEOUT", 300.0)
    s = server_helpers.ServerProcess(smollm2_gguf_path, "--ray", "--ray-address", ray_cluster,
                                     "--num-replicas", "1", "--placement", "any",
                                     "-c", str(CTX), "--api-key", KEY,
                                     "--served-model-name", "smollm2", "-q")
    try:
        c = openai.OpenAI(base_url=s.base, api_key=KEY, max_retries=0, timeout=180)
        _, text = _chat(c, [{"role": "user", "content": QUESTIONS[0]}])
        assert text == oracle.chat([{"role": "user", "content": QUESTIONS[0]}],
                                   max_tokens=16).text
    finally:
        assert s.stop(180) == 0, s.log()
    assert "colibri" not in serve.status().applications
