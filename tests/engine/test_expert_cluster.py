"""Expert workers (colibri.engine.cluster, docs/cluster.md) without Ray: the core's seam
(csrc/model/remote_experts.hpp) and the coordinator's split and reassembly, with workers in
this process (LocalTransport). Each worker loads the same file and computes only the experts
it is sent; the logits are the same bits as one engine computing every expert, for prefill
and decode, greedy and with speculative drafts (batched verify forwards), with 1, 2 and 3
workers. The same over Ray actors: test_expert_cluster_ray.py (slow)."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.engine.cluster import ExpertCluster, LocalTransport, attach_cluster
from colibri.engine.handle import load_engine
from colibri.errors import ClusterError, ConfigError
from colibri.settings.cluster import ClusterConfig
from colibri.settings.config import EngineConfig, ThreadConfig
from support.cluster_helpers import assert_same_run, forward_run, local_cluster_model
from support.deepseek_factory import build_tiny
from support.gpt_oss_factory import build_gpt_oss
from support.modelfactory import TinyModel

PROMPT = [1, 17, 93, 4, 250, 61, 8, 130, 77, 19, 201, 3, 45, 99, 12, 180]
ENGINE = EngineConfig(threads=ThreadConfig(n=2), context_length=128)


def _cluster(model: colibri.Model) -> ExpertCluster:
    cluster = model.runner.handle.cluster
    assert cluster is not None
    return cluster


@pytest.mark.parametrize("family", ["qwen2_moe", "qwen3_moe", "mixtral"])
@pytest.mark.parametrize("qtype,precision", [("F32", "float32"), ("Q4_0", "int8")])
def test_logits_bit_identical_with_1_2_3_workers(tiny_models: dict[str, TinyModel], family: str,
                                                 qtype: str, precision: str) -> None:
    path = tiny_models[family].gguf[qtype]
    engine = ENGINE.replace(activation_precision=precision)
    with colibri.Model.load(path, engine=engine) as single:
        want = forward_run(single, PROMPT)
        n_experts = single.config.n_experts
        top_k = single.config.n_experts_per_tok
        moe_layers = sum(1 for m in single.runner.handle.core.spec.moe_layers if m)
    for workers in (1, 2, 3):
        with local_cluster_model(path, engine, workers) as model:
            got = forward_run(model, PROMPT)
            assert_same_run(got, want, f"{family} {qtype}, {workers} workers")
            stats = _cluster(model).stats()
            assert [s.experts for s in stats] == [
                ClusterConfig(workers=workers).shard(w, n_experts) for w in range(workers)]
            # Every (token, slot) of every MoE layer went out as exactly one row.
            tokens = len(PROMPT) + len(got[1])
            assert sum(s.rows for s in stats) == tokens * top_k * moe_layers
            assert all(s.requests > 0 and s.bytes_sent == s.bytes_received for s in stats)
            # The coordinator never read an expert: the workers own them all.
            assert model.runner.handle.core.store_stats().reads == 0


def test_greedy_and_speculative_tokens_identical(tiny_models: dict[str, TinyModel]) -> None:
    path = tiny_models["qwen2_moe"].gguf["Q8_0"]
    prompt = PROMPT * 3  # repeats: the lookup drafter finds drafts to verify
    with colibri.Model.load(path, engine=ENGINE) as single:
        want = single.generate(prompt, max_tokens=24).token_ids
    with local_cluster_model(path, ENGINE, 2) as model:
        assert model.generate(prompt, max_tokens=24).token_ids == want
        drafted = model.generate(prompt, max_tokens=24, spec="lookup")
        assert drafted.token_ids == want


def _mtp_run(model: colibri.Model) -> list[np.ndarray]:
    """Prefill, then per step: the MTP layer's two chained drafts' logits, and the trunk's
    logits over the step token and the drafts in one forward (a verify)."""
    s = model.session()
    s._core.enable_mtp()
    out = [s.forward(PROMPT, all_logits=True)]
    logits = out[0][-1]
    for _ in range(3):
        nxt = int(np.argmax(logits))
        drafts, got = s._core.mtp_draft(nxt, 2, True)
        verify = s.forward([nxt, *drafts], all_logits=True)
        out += [got.copy(), verify]
        s.rollback(len(drafts))  # keep the step token only, as a rejected verify does
        logits = verify[0]
    return out


def test_mtp_layer_experts_and_shared_expert() -> None:
    """GLM-4.5's layout: a shared expert, a sigmoid router with its selection bias, and an
    MTP layer whose experts are store layer n_layers (its drafts, then a batched verify)."""
    tiny = build_tiny("glm4_moe", with_gguf=False)
    engine = ENGINE.replace(activation_precision="float32")
    with colibri.Model.load(tiny.hf_dir, engine=engine) as single:
        want = _mtp_run(single)
    with local_cluster_model(tiny.hf_dir, engine, 3) as model:
        got = _mtp_run(model)
        mtp_layer = model.runner.handle.core.spec.n_layers
        assert sum(s.rows for s in _cluster(model).stats()) > 0
        assert model.runner.handle.core.store_stats().reads == 0  # MTP experts too
    assert mtp_layer > 0
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_array_equal(a, b, err_msg=f"glm4_moe with MTP, 3 workers, array {i}")


def test_expert_biases_and_clamped_swiglu(tmp_path: Path) -> None:
    """gpt-oss: per-expert biases (added by the worker, from its own resident copy), the
    router's logit bias, the clamped SwiGLU, sliding-window attention with sinks."""
    d, _ = build_gpt_oss(tmp_path / "hf", swiglu_limit=7.0, expert_scale=10.0)
    engine = ENGINE.replace(activation_precision="float32", context_length=64)
    prompt = [t % 128 for t in PROMPT]  # the factory's vocabulary
    with colibri.Model.load(d, engine=engine) as single:
        want = forward_run(single, prompt)
    for workers in (2, 3):
        with local_cluster_model(d, engine, workers) as model:
            assert_same_run(forward_run(model, prompt), want, f"gpt-oss, {workers} workers")


def test_worker_with_another_model_file_is_refused(tiny_models: dict[str, TinyModel]) -> None:
    path = tiny_models["qwen3_moe"].gguf["Q8_0"]
    other = tiny_models["qwen3_moe"].gguf["Q4_0"]  # same shapes, other weights
    with pytest.raises(ClusterError, match="expert worker 0 .* another model file: fingerprint"):
        local_cluster_model(path, ENGINE, 2, worker_path=other).close()


class _FailingTransport(LocalTransport):
    """In-process workers whose `fail_on_call`-th layer fails the way `mode` says."""

    def __init__(self, inner: LocalTransport, fail_on_call: int, mode: str) -> None:
        super().__init__([])
        self._inner = inner
        self._calls = 0
        self._fail_on = fail_on_call
        self._mode = mode

    def hello(self, timeout: float):  # type: ignore[no-untyped-def]
        return self._inner.hello(timeout)

    def gather(self, pending, layer, timeout):  # type: ignore[no-untyped-def]
        self._calls += 1
        out = self._inner.gather(pending, layer, timeout)
        if self._calls == self._fail_on:
            if self._mode == "shape":
                return [(a[:-1], t) for a, t in out]
            if self._mode == "interrupt":
                raise KeyboardInterrupt
            raise ClusterError(f"expert worker 0 failed on layer {layer}: it broke")
        return out


@pytest.mark.parametrize("mode,error", [("error", ClusterError), ("shape", ClusterError),
                                        ("interrupt", KeyboardInterrupt)])
def test_worker_failure_raises_and_session_keeps_serving(tiny_models: dict[str, TinyModel],
                                                         mode: str, error: type) -> None:
    """A worker failing (or answering with the wrong shape, or Ctrl-C while waiting for it)
    mid-forward: ClusterError (KeyboardInterrupt), the session unchanged, and the next
    forward computes the same bits as before."""
    path = tiny_models["mixtral"].gguf["Q8_0"]
    with colibri.Model.load(path, engine=ENGINE) as single:
        want = single.session().forward(PROMPT)
    handle = load_engine(path, ENGINE)
    cfg = handle.engine_config.replace(cluster=ClusterConfig(workers=1))
    from colibri.engine.cluster import ExpertWorker

    inner = LocalTransport([ExpertWorker(str(path), cfg, 0)])
    handle.cluster = attach_cluster(_FailingTransport(inner, fail_on_call=2, mode=mode),
                                    handle.manifest, cfg, handle.core)
    with colibri.Model(handle) as model:
        s = model.session()
        with pytest.raises(error):
            s.forward(PROMPT)
        assert s.n_tokens == 0
        np.testing.assert_array_equal(s.forward(PROMPT), want)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_address_is_a_cluster_error(tiny_models: dict[str, TinyModel]) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    engine = ENGINE.replace(cluster=ClusterConfig(address=address, connect_timeout=5))
    with pytest.raises(ClusterError, match=f"the Ray cluster at {address} does not answer"):
        colibri.Model.load(tiny_models["qwen3_moe"].gguf["Q8_0"], engine=engine)


def test_dense_model_is_refused(tiny_models: dict[str, TinyModel]) -> None:
    engine = ENGINE.replace(cluster=ClusterConfig(address="local"))
    with pytest.raises(ConfigError, match="has no routed experts"):
        colibri.Model.load(tiny_models["llama"].gguf["Q8_0"], engine=engine)


def test_cluster_config_is_validated() -> None:
    assert EngineConfig().cluster is None
    cfg = EngineConfig(cluster={"address": "10.0.0.2:6379", "workers": 3})
    assert cfg.cluster == ClusterConfig(address="10.0.0.2:6379", workers=3)
    assert EngineConfig.from_dict(cfg.to_dict()) == cfg
    assert [list(cfg.cluster.shard(w, 8)) for w in range(3)] == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert [cfg.cluster.owner(e, 8) for e in range(8)] == [0, 0, 1, 1, 1, 2, 2, 2]
    for bad, match in [({"address": ""}, "expected a Ray address"),
                       ({"address": "somehost"}, "is not an address"),
                       ({"address": "h:99999"}, "is not an address"),
                       ({"workers": 0}, "out of range"),
                       ({"call_timeout": float("nan")}, "out of range"),
                       ({"connect_timeout": 0}, "out of range"),
                       ({"worker_ram_budget": "lots"}, "worker_ram_budget"),
                       ({"wrokers": 2}, "workers")]:
        with pytest.raises(ConfigError, match=match):
            ClusterConfig(**bad)
    with pytest.raises(ConfigError, match="cluster: expected a colibri.ClusterConfig"):
        EngineConfig(cluster="10.0.0.2:6379")  # type: ignore[arg-type]
