"""The recurrent state of Qwen3-Next's linear-attention layers in the features built for
a KV cache. A KV cache can be cut at any position; the state cannot (it is the sum of every
token so far), so the core brings it up to the session's tokens by running them again
from position 0 whenever it holds another count (model/linear_attn_gdn.hpp,
Session::replay_state). Each feature is checked against a fresh session fed the same
tokens: rollback, a partial and a whole fork (prefix sharing / prompt cache), save and
load, continuous batching, and a failed forward. Bad state input is refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.generate.batching import forward_batch
from support.modelfactory import prompt_ids
from support.qwen3_next_factory import VOCAB, build_qwen3_next

IDS = prompt_ids(120, seed=7, vocab=VOCAB)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> colibri.Model:
    d, _ = build_qwen3_next(tmp_path_factory.mktemp("qwen3-next-state"), seed=1)
    return colibri.Model.load(d, engine=colibri.EngineConfig(context_length=256))


def fresh(model: colibri.Model, ids: list[int]) -> np.ndarray:
    return model.session().forward(ids)


def same(got: np.ndarray, ref: np.ndarray) -> None:
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * float(np.abs(ref).max()))


def test_rollback_equals_a_fresh_session(model: colibri.Model) -> None:
    s = model.session()
    s.forward(IDS[:100])
    s.rollback(30)
    same(s.forward(IDS[70:80]), fresh(model, IDS[:80]))
    s.rollback(80)  # to empty: the state starts from zeros again
    same(s.forward(IDS[:5]), fresh(model, IDS[:5]))


def test_forks_equal_fresh_sessions(model: colibri.Model) -> None:
    s = model.session()
    s.forward(IDS[:90])
    whole, part = s.fork(), s.fork(40)  # the whole state copied; a prefix replayed
    same(whole.forward(IDS[90:95]), fresh(model, IDS[:95]))
    same(part.forward(IDS[40:50]), fresh(model, IDS[:50]))
    same(s.forward(IDS[90:95]), fresh(model, IDS[:95]))  # the source is unchanged


def test_save_and_load_equal_a_fresh_session(model: colibri.Model, tmp_path: Path) -> None:
    s = model.session()
    s.forward(IDS[:60])
    s.save(tmp_path / "s.colibri")
    loaded = model.load_session(tmp_path / "s.colibri")
    same(loaded.forward(IDS[60:64]), fresh(model, IDS[:64]))


def test_continuous_batching_equals_fresh_sessions(model: colibri.Model) -> None:
    a, b = model.session(), model.session()
    a.forward(IDS[:30])
    b.forward(IDS[50:70])
    b.rollback(5)  # b's state must be replayed inside the batch
    out = forward_batch([a, b], [IDS[30:33], IDS[65:66]])
    same(out[0], fresh(model, IDS[:33]))
    same(out[1], fresh(model, IDS[50:66]))


def test_a_failed_forward_leaves_the_state_usable(model: colibri.Model) -> None:
    s = model.session()
    s.forward(IDS[:20])
    with pytest.raises(colibri.errors.ColibriError):
        s.forward([5, VOCAB + 3])  # refused before anything runs
    same(s.forward(IDS[20:25]), fresh(model, IDS[:25]))


def test_a_forward_stopped_midway_leaves_the_session_as_before(tmp_path: Path) -> None:
    """A progress callback that raises after the first chunk: the linear layers' state has
    consumed that chunk, the session has not; the next forward replays and is exact."""
    d, _ = build_qwen3_next(tmp_path / "m", seed=1)
    m = colibri.Model.load(d, engine=colibri.EngineConfig(context_length=256, prefill_chunk=16))
    s = m.session()
    s.forward(IDS[:10])

    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s.forward(IDS[10:60], progress=stop)
    assert s.n_tokens == 10
    same(s.forward(IDS[10:14]), fresh(m, IDS[:14]))


def test_the_state_is_counted_in_the_memory_figures(model: colibri.Model) -> None:
    """The budget's KV figure and a session's allocation both hold the state: per linear
    layer the convolution's last 3 inputs of 2 * 16 + 32 channels and 4 heads' 8 x 8
    matrices, F32, beside the attention layers' rows (2 layers, 2 x 32 floats a position)."""
    state = 4 * 2 * (3 * 64 + 4 * 8 * 8)
    rows = 4 * 2 * 2 * 32  # bytes a position at f32
    assert model.stats().memory.kv_bytes == 256 * rows + state
    s = model.session()
    s.forward(IDS[:10])  # the rows grow in steps of at least 64 positions; the state is whole
    assert s.kv_bytes == 64 * rows + state
