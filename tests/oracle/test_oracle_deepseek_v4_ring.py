"""DeepSeek-V4's sliding-window layers keep a ring of their last positions
(csrc/model/kv_cache.hpp, csrc/model/attn_v4.cpp), on the tiny V4 of
support/deepseek_v4_factory.py (every layer sliding, window 5) at a context of 512, where
each layer keeps 128 positions instead of 512:

* a 300-token prompt (60 windows, past the ring twice) matches transformers at every
  position (1e-4 of the largest logit), and so does its greedy continuation;
* one prefill, prefill chunks of 7 and 100, token-by-token decode, one and two threads and
  a batched step (one row longer than the ring's slack) give bit-identical logits;
* the cache allocates the rings, the budget's figure (kv_layers_bytes with
  kv_layer_windows) and the memory stats say the same;
* rollback within the ring gives the same bits again, beyond it InvalidRequestError and
  nothing changed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import colibri
from colibri.engine.budget import kv_layers_bytes, kv_ring_positions
from colibri.engine.streaming import kv_layer_widths, kv_layer_windows
from colibri.errors import InvalidRequestError
from colibri.generate.batching import forward_batch
from support.deepseek_v4_factory import N_LAYERS, VOCAB, build_deepseek_v4
from support.logit_checks import assert_greedy_matches, assert_within
from support.modelfactory import prompt_ids, reference_greedy, reference_logits

CONTEXT = 512
WINDOW = 5
RING = kv_ring_positions(WINDOW, CONTEXT)
N = 300
IDS = prompt_ids(N, seed=7, vocab=VOCAB)
Tiny = tuple[Path, torch.nn.Module]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    return build_deepseek_v4(tmp_path_factory.mktemp("deepseek-v4-ring"), seed=3,
                             max_position_embeddings=CONTEXT)  # fmt: skip


def _load(d: Path, **engine: object) -> colibri.Model:
    return colibri.Model.load(d, engine=colibri.EngineConfig(
        context_length=CONTEXT, kv_cache_type="f32", **engine))  # fmt: skip


@pytest.fixture(scope="module")
def model(tiny: Tiny) -> colibri.Model:
    return _load(tiny[0], threads={"n": 2})


@pytest.fixture(scope="module")
def full(model: colibri.Model) -> np.ndarray:
    """All 300 positions' logits from one prefill."""
    return model.session().forward(IDS, all_logits=True)


def test_long_prompt_and_greedy_match_transformers(tiny: Tiny, full: np.ndarray,
                                                   model: colibri.Model) -> None:  # fmt: skip
    assert RING == 128 and N > 2 * RING
    assert model.config.sliding_window == WINDOW
    assert_within(full, reference_logits(tiny[1], IDS), "300-token prefill", 1e-4)
    ref_tokens, ref_logits = reference_greedy(tiny[1], IDS, 8)
    assert_greedy_matches(model.session(), IDS, ref_tokens, ref_logits)


def test_prefill_decode_chunks_threads_same_bits(tiny: Tiny, model: colibri.Model,
                                                 full: np.ndarray) -> None:  # fmt: skip
    for chunk in (7, 100):
        got = _load(tiny[0], threads={"n": 2}, prefill_chunk=chunk).session()
        np.testing.assert_array_equal(got.forward(IDS, all_logits=True), full, err_msg=f"{chunk}")
    s = model.session()
    s.forward(IDS[:3])
    for t in range(3, N):
        np.testing.assert_array_equal(s.forward([IDS[t]]), full[t], err_msg=f"position {t}")
    one = _load(tiny[0], threads={"n": 1}).session()
    np.testing.assert_array_equal(one.forward(IDS, all_logits=True), full)


def test_batched_rows_match_alone(model: colibri.Model, full: np.ndarray) -> None:
    other = prompt_ids(200, seed=8, vocab=VOCAB)
    other_full = model.session().forward(other, all_logits=True)
    a, b = model.session(), model.session()
    a.forward(IDS[:200])
    b.forward(other[:20])
    out = forward_batch([a, b], [IDS[200:201], other[20:]], all_logits=True)
    np.testing.assert_array_equal(out[0], full[200:201])
    np.testing.assert_array_equal(out[1], other_full[20:])


def test_the_rings_are_allocated_and_budgeted(model: colibri.Model) -> None:
    c = model.config
    widths, windows = kv_layer_widths(c), kv_layer_windows(c)
    assert windows == [WINDOW] * N_LAYERS
    assert model._require_core().kv_layouts == [(1, c.head_dim, 0, 0)] * N_LAYERS
    s = model.session()
    s.forward(prompt_ids(CONTEXT, seed=9, vocab=VOCAB))  # the whole context: every buffer
    row = c.head_dim * 4  # one K = V row, f32
    assert s.kv_bytes == row * RING * N_LAYERS
    assert kv_layers_bytes(widths, CONTEXT, "f32", windows) == s.kv_bytes
    assert kv_layers_bytes(widths, CONTEXT, "f32") == row * CONTEXT * N_LAYERS  # no rings
    mem = model.stats().memory
    assert mem is not None and mem.kv_bytes == s.kv_bytes


def test_rollback_within_the_ring_only(model: colibri.Model, full: np.ndarray) -> None:
    s = model.session()
    s.forward(IDS)
    # The rings hold positions [300 - 128, 300): going back to L needs [L - 4, L).
    limit = N - (N - RING + WINDOW - 1)
    s.rollback(limit)
    np.testing.assert_array_equal(s.forward(IDS[N - limit:], all_logits=True), full[N - limit:])
    with pytest.raises(InvalidRequestError, match="sliding-window layers keep only"):
        s.rollback(limit + 1)
    assert s.n_tokens == N  # refused: unchanged
    np.testing.assert_array_equal(s.forward([7]), model.session().forward([*IDS, 7]))
