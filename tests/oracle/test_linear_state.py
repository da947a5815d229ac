"""The recurrent state of the linear-attention layers (Qwen3-Next's Gated DeltaNet,
Kimi-Linear's Kimi Delta Attention) in the features built for a KV cache. A KV cache can be
cut at any position; the state cannot (it is the sum of every token so far), so the core
brings it up to the session's tokens by running them again from position 0 whenever it
holds another count (model/linear_attn_common.hpp, Session::replay_state). Each feature is
checked against a fresh session fed the same tokens, for both families: rollback, a
partial and a whole fork (prefix sharing / prompt cache), save and load, continuous
batching, a failed and an interrupted forward, and the memory figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import colibri
from colibri.generate.batching import forward_batch
from support import kimi_linear_factory, qwen3_next_factory
from support.modelfactory import prompt_ids


@dataclass(frozen=True)
class Family:
    build: Callable[..., tuple[Path, Any]]
    vocab: int
    state_bytes: int  # every linear layer's state, F32
    row_bytes: int  # the attention layers' KV bytes a position, F32


FAMILIES = {
    # Per linear layer (2): the convolution's last 3 inputs of 2 * 16 + 32 channels and
    # 4 heads' 8 x 8 matrices; 2 attention layers of 2 x 32 floats a position.
    "qwen3_next": Family(qwen3_next_factory.build_qwen3_next, qwen3_next_factory.VOCAB,
                         4 * 2 * (3 * 64 + 4 * 8 * 8), 4 * 2 * 2 * 32),
    # Per KDA layer (3): the last 3 inputs of 3 * 16 channels and 2 heads' 8 x 8 matrices;
    # the MLA layer's latent rows, 16 + 4 floats a position.
    "kimi_linear": Family(kimi_linear_factory.build_kimi_linear, kimi_linear_factory.VOCAB,
                          4 * 3 * (3 * 48 + 2 * 8 * 8), 4 * (16 + 4)),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[str, Family]:
    return request.param, FAMILIES[request.param]


@pytest.fixture(scope="module")
def model(family: tuple[str, Family], tmp_path_factory: pytest.TempPathFactory) -> colibri.Model:
    name, fam = family
    d, _ = fam.build(tmp_path_factory.mktemp(f"{name}-state"), seed=1)
    return colibri.Model.load(d, engine=colibri.EngineConfig(context_length=256))


@pytest.fixture(scope="module")
def ids(family: tuple[str, Family]) -> list[int]:
    return prompt_ids(120, seed=7, vocab=family[1].vocab)


def fresh(model: colibri.Model, ids: list[int]) -> np.ndarray:
    return model.session().forward(ids)


def same(got: np.ndarray, ref: np.ndarray) -> None:
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * float(np.abs(ref).max()))


def test_rollback_equals_a_fresh_session(model: colibri.Model, ids: list[int]) -> None:
    s = model.session()
    s.forward(ids[:100])
    s.rollback(30)
    same(s.forward(ids[70:80]), fresh(model, ids[:80]))
    s.rollback(80)  # to empty: the state starts from zeros again
    same(s.forward(ids[:5]), fresh(model, ids[:5]))


def test_forks_equal_fresh_sessions(model: colibri.Model, ids: list[int]) -> None:
    s = model.session()
    s.forward(ids[:90])
    whole, part = s.fork(), s.fork(40)  # the whole state copied; a prefix replayed
    same(whole.forward(ids[90:95]), fresh(model, ids[:95]))
    same(part.forward(ids[40:50]), fresh(model, ids[:50]))
    same(s.forward(ids[90:95]), fresh(model, ids[:95]))  # the source is unchanged


def test_save_and_load_equal_a_fresh_session(model: colibri.Model, ids: list[int],
                                             tmp_path: Path) -> None:  # fmt: skip
    s = model.session()
    s.forward(ids[:60])
    s.save(tmp_path / "s.colibri")
    loaded = model.load_session(tmp_path / "s.colibri")
    same(loaded.forward(ids[60:64]), fresh(model, ids[:64]))


def test_continuous_batching_equals_fresh_sessions(model: colibri.Model, ids: list[int]) -> None:
    a, b = model.session(), model.session()
    a.forward(ids[:30])
    b.forward(ids[50:70])
    b.rollback(5)  # b's state must be replayed inside the batch
    out = forward_batch([a, b], [ids[30:33], ids[65:66]])
    same(out[0], fresh(model, ids[:33]))
    same(out[1], fresh(model, ids[50:66]))


def test_a_failed_forward_leaves_the_state_usable(
    model: colibri.Model, ids: list[int], family: tuple[str, Family]
) -> None:
    s = model.session()
    s.forward(ids[:20])
    with pytest.raises(colibri.errors.ColibriError):
        s.forward([5, family[1].vocab + 3])  # refused before anything runs
    same(s.forward(ids[20:25]), fresh(model, ids[:25]))


def test_a_forward_stopped_midway_leaves_the_session_as_before(
    family: tuple[str, Family], ids: list[int], tmp_path: Path
) -> None:
    """A progress callback that raises after the first chunk: the linear layers' state has
    consumed that chunk, the session has not; the next forward replays and is exact."""
    d, _ = family[1].build(tmp_path / "m", seed=1)
    m = colibri.Model.load(d, engine=colibri.EngineConfig(context_length=256, prefill_chunk=16))
    s = m.session()
    s.forward(ids[:10])

    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s.forward(ids[10:60], progress=stop)
    assert s.n_tokens == 10
    same(s.forward(ids[10:14]), fresh(m, ids[:14]))


def test_the_state_is_counted_in_the_memory_figures(
    model: colibri.Model, ids: list[int], family: tuple[str, Family]
) -> None:
    """The budget's KV figure and a session's allocation both hold the state beside the
    attention layers' rows."""
    fam = family[1]
    assert model.stats().memory.kv_bytes == 256 * fam.row_bytes + fam.state_bytes
    s = model.session()
    s.forward(ids[:10])  # the rows grow in steps of at least 64 positions; the state is whole
    assert s.kv_bytes == 64 * fam.row_bytes + fam.state_bytes


def test_the_server_reserves_the_state_whatever_the_request_length(
    model: colibri.Model, ids: list[int], family: tuple[str, Family]
) -> None:
    """The server's scheduler reserves what a request's session allocates: the state in
    full even for a short request (averaging it over the context's positions, as it once
    did, reserved a 10-token request a 25th of it)."""
    from colibri.server.scheduler import Scheduler

    fam = family[1]
    sched = Scheduler(model, max_running=2)
    try:
        assert sched.kv_fixed_bytes == fam.state_bytes
        assert sched.kv_position_bytes == fam.row_bytes
        s = model.session()
        s.forward(ids[:10])
        assert sched.request_kv_bytes(64) == s.kv_bytes  # rows grow in steps of 64
        assert sched.kv_budget == 2 * model.stats().memory.kv_bytes
    finally:
        sched.close()

