"""The recurrent state of Kimi-Linear's Kimi Delta Attention layers in the features built
for a KV cache, through the machinery Qwen3-Next's Gated DeltaNet uses (KvCache state
beside the MLA layer's latent rows; Session::replay_state brings the state up to the
session's tokens when it holds another count). Each feature is checked against a fresh
session fed the same tokens: rollback, a partial and a whole fork, save and load,
continuous batching, and the memory figures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.generate.batching import forward_batch
from support.kimi_linear_factory import VOCAB, build_kimi_linear
from support.modelfactory import prompt_ids

IDS = prompt_ids(120, seed=7, vocab=VOCAB)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> colibri.Model:
    d, _ = build_kimi_linear(tmp_path_factory.mktemp("kimi-linear-state"), seed=1)
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


def test_the_state_is_counted_in_the_memory_figures(model: colibri.Model) -> None:
    """The budget's KV figure and a session's allocation both hold the state: per KDA
    layer (3 of them) the convolution's last 3 inputs of 3 * 16 channels and 2 heads' 8 x 8
    matrices, F32, beside the MLA layer's latent rows (16 + 4 floats a position)."""
    state = 4 * 3 * (3 * 48 + 2 * 8 * 8)
    rows = 4 * (16 + 4)  # bytes a position at f32
    assert model.stats().memory.kv_bytes == 256 * rows + state
    s = model.session()
    s.forward(IDS[:10])  # the rows grow in steps of at least 64 positions; the state is whole
    assert s.kv_bytes == 64 * rows + state
