"""Sliding-window layers keep a ring of their last positions, not the whole context
(csrc/model/kv_cache.hpp): a tiny gpt-oss-style model (test_gqa_sinks_window's, window 5 in
layer 0) at a context of 512, where layer 0's ring holds 128 positions and layer 1 all 512.

* Memory: the cache allocates the ring for layer 0 and the context for layer 1, what the
  budget's kv_layers_bytes counts with the windows (and less than without them).
* Exact: one prefill, token-by-token decode, prefill chunks of 7 and 100, one and two
  threads give bit-identical logits at every position, well past the ring (300 tokens);
  they match the numpy forward.
* Rollback within what the ring holds gives the same bits again; beyond it a clear
  InvalidRequestError, and the session is unchanged. A failed long forward (a progress
  callback that raises) leaves the rings as they were.
* The state (export/import, copy_prefix_from) keeps layer 0's last window: a restored or
  copied session continues with the same bits as a fresh prefill; a prefix the ring no
  longer holds is refused (holds_prefix says so beforehand).
* Batched steps (one longer than the ring's slack) equal the sessions alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_gqa_sinks_window import CFG as BASE
from test_gqa_sinks_window import _manifest, _weights, numpy_forward

from colibri import _core
from colibri.engine.budget import kv_layers_bytes, kv_ring_positions
from colibri.engine.core_spec import model_spec, tensor_specs, thread_settings
from colibri.engine.streaming import kv_layer_widths, kv_layer_windows
from colibri.errors import InvalidRequestError
from colibri.settings.config import ThreadConfig
from colibri.sources import Manifest

CONTEXT = 512
CFG = dataclasses.replace(BASE, sliding_window=5, max_position_embeddings=CONTEXT)
RING = kv_ring_positions(5, CONTEXT)
N = 300
IDS = [int(t) for t in np.random.default_rng(3).integers(0, CFG.vocab_size, N)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, np.ndarray], Manifest]:
    w = _weights(CFG, seed=1)
    return w, _manifest(tmp_path_factory.mktemp("ring"), CFG, w)


def _engine(m: Manifest, threads: int = 2) -> _core.Engine:
    return _core.Engine(model_spec(m, CONTEXT), tensor_specs(m, False), [str(f) for f in m.files],
                        thread_settings(ThreadConfig(n=threads)))  # fmt: skip


@pytest.fixture(scope="module")
def engine(built: tuple[dict[str, np.ndarray], Manifest]) -> _core.Engine:
    return _engine(built[1])


@pytest.fixture(scope="module")
def full(engine: _core.Engine) -> np.ndarray:
    """All 300 positions' logits from one prefill."""
    return _prefill(engine, IDS)


def _session(engine: _core.Engine) -> _core.Session:
    return _core.Session(engine, CONTEXT)


def _prefill(engine: _core.Engine, ids: list[int], chunk: int = 0) -> np.ndarray:
    s = _session(engine)
    return np.asarray(s.forward(np.array(ids, np.int32), all_logits=True, chunk=chunk))


def _fwd(s: _core.Session, ids: list[int]) -> np.ndarray:
    return np.asarray(s.forward(np.array(ids, np.int32), all_logits=True))


def test_ring_memory_is_bounded_and_budgeted(engine: _core.Engine) -> None:
    assert RING == 128
    s = _session(engine)
    s.forward(np.zeros(CONTEXT, np.int32))  # the whole context: every buffer at its size
    widths, windows = kv_layer_widths(CFG), kv_layer_windows(CFG)
    assert windows == [5, 0]
    row = 2 * CFG.n_kv_heads * CFG.head_dim * 4  # K and V of one position, f32
    assert s.kv_allocated_bytes == row * (RING + CONTEXT)
    assert kv_layers_bytes(widths, CONTEXT, "f32", windows) == s.kv_allocated_bytes
    assert kv_layers_bytes(widths, CONTEXT, "f32") == row * 2 * CONTEXT  # without the rings
    # The state of n positions: layer 0's last window, layer 1's n.
    assert s.kv_bytes(400) == row * (5 + 400)
    assert kv_ring_positions(5, 128) == 0 and kv_ring_positions(0, 4096) == 0  # no ring


def test_prefill_decode_chunks_threads_same_bits(
        built: tuple[dict[str, np.ndarray], Manifest], engine: _core.Engine,
        full: np.ndarray) -> None:  # fmt: skip
    ref = numpy_forward(CFG, built[0], IDS)
    np.testing.assert_allclose(full, ref, rtol=0, atol=2e-4 * float(np.abs(ref).max()))
    for chunk in (7, 100):
        np.testing.assert_array_equal(_prefill(engine, IDS, chunk=chunk), full, err_msg=f"{chunk}")
    s = _session(engine)
    _fwd(s, IDS[:3])
    for t in range(3, N):
        np.testing.assert_array_equal(_fwd(s, [IDS[t]])[0], full[t], err_msg=f"position {t}")
    np.testing.assert_array_equal(_prefill(_engine(built[1], threads=1), IDS), full)


def test_rollback_within_the_ring(engine: _core.Engine, full: np.ndarray) -> None:
    s = _session(engine)
    _fwd(s, IDS)
    # Layer 0 holds positions [300 - 128, 300): going back to L needs [L - 4, L).
    limit = N - (N - RING + 4)
    assert s.holds_prefix(N - 1) and not s.holds_prefix(N - limit - 1)
    s.rollback(limit)  # the most this ring allows: 124 tokens (a speculative draft is less)
    np.testing.assert_array_equal(_fwd(s, IDS[N - limit:]), full[N - limit:])
    with pytest.raises(InvalidRequestError, match="sliding-window layers keep only"):
        s.rollback(limit + 1)
    assert s.n_tokens == N  # refused: unchanged
    np.testing.assert_array_equal(_fwd(s, [7]), _prefill(engine, [*IDS, 7])[-1:])
    s.reset()  # a fresh start needs nothing from the ring
    np.testing.assert_array_equal(_fwd(s, IDS[:50]), full[:50])


def test_failed_long_forward_leaves_the_rings(engine: _core.Engine, full: np.ndarray) -> None:
    s = _session(engine)
    _fwd(s, IDS[:150])

    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt

    # 150 new positions, stopped after a chunk of 140: that chunk overwrote the window
    # before position 150 in layer 0's ring; the session puts the ring back.
    with pytest.raises(KeyboardInterrupt):
        s.forward(np.array(IDS[150:], np.int32), chunk=140, progress=stop)
    assert s.n_tokens == 150
    np.testing.assert_array_equal(_fwd(s, IDS[150:]), full[150:])


def test_state_and_prefix_copy(engine: _core.Engine, full: np.ndarray) -> None:
    s = _session(engine)
    _fwd(s, IDS[:250])
    blob = s.export_kv()
    assert len(blob) == s.kv_bytes(250)
    t = _session(engine)
    t.import_kv(blob, IDS[:250])
    np.testing.assert_array_equal(_fwd(t, IDS[250:]), full[250:])
    t.rollback(N - 249)  # back to 249: the restored window still covers it (a refresh)
    np.testing.assert_array_equal(_fwd(t, IDS[249:]), full[249:])
    # Copying a prefix: fine while the ring holds its window, refused after.
    _fwd(s, IDS[250:])
    u = _session(engine)
    u.copy_prefix_from(s, 240)
    np.testing.assert_array_equal(_fwd(u, IDS[240:]), full[240:])
    assert not s.holds_prefix(150)
    with pytest.raises(InvalidRequestError, match="no longer in the sliding-window"):
        _session(engine).copy_prefix_from(s, 150)
    with pytest.raises(InvalidRequestError, match="no longer in the sliding-window"):
        s.export_kv(150)


def test_batched_rings_match_alone(engine: _core.Engine, full: np.ndarray) -> None:
    other = [int(t) for t in np.random.default_rng(4).integers(0, CFG.vocab_size, 200)]
    other_full = _prefill(engine, other)
    a, b = _session(engine), _session(engine)
    _fwd(a, IDS[:200])
    _fwd(b, other[:20])
    out = _core.forward_batch([a, b], [np.array(IDS[200:201], np.int32),
                                       np.array(other[20:], np.int32)], [True, True])  # fmt: skip
    np.testing.assert_array_equal(out[0], full[200:201])
    np.testing.assert_array_equal(out[1], other_full[20:])
