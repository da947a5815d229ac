"""DeepSeek-V4's compressed layers against transformers on a tiny random float32
checkpoint (support/deepseek_v4_factory.py, COMPRESSED): 4 layers, sliding, compressed
sparse attention (rate 4, the lightning indexer of 8 heads keeping 3 entries), heavily compressed
attention (rate 8), CSA again; a 5-position window; every 1-D parameter and the position
biases random. A 48-token prompt closes 12 CSA and 6 HCA windows, so the indexer chooses
among up to 12 entries, and its choices are clear (the kept and the first dropped score
differ, checked on transformers' own scores).

Every logit at every position within 1e-4 of the largest for one prefill and for prefill +
token-by-token decode (the positions that close a window included); the same greedy 20
tokens; chunked prefill, batched rows, session files, forks and rollbacks bit for bit what
one prefill gives; the compressed state counted where the budget counts it; and each
compressor and indexer weight, changed, moving the logits past the bound.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import colibri
from colibri.convert import write_container
from colibri.engine.streaming import _kv_and_work
from colibri.generate.batching import forward_batch
from support.checkpoint_edits import with_tensor
from support.deepseek_v4_factory import COMPRESSED, VOCAB, build_deepseek_v4, indexer_margins
from support.logit_checks import assert_decode_matches, assert_greedy_matches, assert_within
from support.modelfactory import prompt_ids, reference_greedy, reference_logits

RTOL = 1e-4
N_PROMPT, N_GREEDY, CONTEXT = 48, 20, 128
Tiny = tuple[Path, torch.nn.Module]
IDS = prompt_ids(N_PROMPT, vocab=VOCAB)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    d = tmp_path_factory.mktemp("deepseek-v4-compressed")
    return build_deepseek_v4(d, seed=19, **COMPRESSED)


@pytest.fixture(scope="module")
def ref(tiny: Tiny) -> np.ndarray:
    return reference_logits(tiny[1], IDS)


def _load(d: Path, **engine: object) -> colibri.Model:
    return colibri.Model.load(d, engine=colibri.EngineConfig(**{"context_length": CONTEXT,
                                                                **engine}))  # fmt: skip


def test_the_model_exercises_what_it_should(tiny: Tiny) -> None:
    d, model = tiny
    cfg = _load(d).config
    assert cfg.compress_ratios == (0, 4, 8, 4) and cfg.csa_layers == (False, True, False, True)
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (8, 16, 3)
    assert N_PROMPT >= 2 * max(cfg.compress_ratios) and cfg.sliding_window < N_PROMPT
    # the selection acts (up to 17 closed entries against 3 kept) and is never a tie, on
    # the prompt and its greedy continuation
    margins = indexer_margins(model, IDS + reference_greedy(model, IDS, N_GREEDY)[0][:-1])
    assert len(margins) == 2 and min(margins) > 1e-3, margins


def test_prefill_and_decode_match_transformers(tiny: Tiny, ref: np.ndarray) -> None:
    m = _load(tiny[0])
    assert_within(m.session().forward(IDS, all_logits=True), ref, "prefill", RTOL)
    assert_decode_matches(m.session(), IDS, ref, "hf", RTOL)


def test_greedy_continuation_matches_transformers(tiny: Tiny) -> None:
    d, model = tiny
    ref_tokens, ref_logits = reference_greedy(model, IDS, N_GREEDY)
    assert_greedy_matches(_load(d).session(), IDS, ref_tokens, ref_logits, RTOL)


def test_chunks_threads_and_decode_give_the_same_bits(tiny: Tiny) -> None:
    """A prompt in one forward, in chunks of 5 and of 7 (chunks that end inside and at the
    end of windows), token by token, and with two threads: the same logits bit for bit."""
    m = _load(tiny[0])
    want = m.session().forward(IDS, all_logits=True)
    for chunk in (5, 7):
        s = m.session()
        got = np.concatenate([s.forward(IDS[i:i + chunk], all_logits=True)
                              for i in range(0, N_PROMPT, chunk)])  # fmt: skip
        np.testing.assert_array_equal(got, want, err_msg=f"chunks of {chunk}")
    s = m.session()
    np.testing.assert_array_equal(np.stack([s.forward([t]) for t in IDS]), want)
    two = _load(tiny[0], threads=colibri.ThreadConfig(n=2))
    np.testing.assert_array_equal(two.session().forward(IDS, all_logits=True), want)


def test_batched_rows_equal_alone(tiny: Tiny) -> None:
    m = _load(tiny[0])
    prompts = [prompt_ids(n, seed=n, vocab=VOCAB) for n in (3, 40, 17)]
    want = []
    for p in prompts:
        s = m.session()
        want.append([s.forward(p, all_logits=True).copy(), s.forward([5]).copy()])
    sessions = [m.session() for _ in prompts]
    first = forward_batch(sessions, prompts, all_logits=True)
    second = forward_batch(sessions, [[5]] * len(prompts))
    for i, w in enumerate(want):
        assert np.array_equal(first[i], w[0]) and np.array_equal(second[i], w[1]), i


def test_saved_forked_and_rolled_back_sessions_continue_exactly(tiny: Tiny, tmp_path: Path) -> None:
    """The compressed state through a session file, a fork and rollbacks (to inside a
    window and to where windows close): the next logits bit for bit those of a session fed the
    same tokens from the start."""
    m = _load(tiny[0])
    s = m.session()
    s.forward(IDS[:-1])
    s.save(tmp_path / "v4c.session")
    fork = s.fork()
    want = s.forward(IDS[-1:]).copy()
    np.testing.assert_array_equal(m.load_session(tmp_path / "v4c.session").forward(IDS[-1:]), want)
    np.testing.assert_array_equal(fork.forward(IDS[-1:]), want)
    for back in (3, 10):  # to 47 tokens (inside windows), then to 40 (where they close)
        s.forward([7, 9])
        s.rollback(back)
        n = s.n_tokens
        fresh = m.session()
        fresh.forward([*IDS, 7, 9][:n])
        np.testing.assert_array_equal(s.forward([5]), fresh.forward([5]),
                                      err_msg=f"rollback {back}")  # fmt: skip


def test_the_compressed_state_is_counted(tiny: Tiny) -> None:
    """The session's allocation (the sliding rows plus the compressed layers' F32 state) is
    the budget's KV figure."""
    m = _load(tiny[0])
    c = m.config
    s = m.session()
    s.forward(prompt_ids(CONTEXT, seed=9, vocab=VOCAB))  # the whole context
    rows = c.head_dim * 4 * CONTEXT * c.n_layers  # one K = V row per position, f32
    hd, idim = c.head_dim, c.index_head_dim
    csa = 2 * 4 * 2 * 2 * (hd + idim) + CONTEXT // 4 * (hd + idim)  # pending + entries
    hca = 8 * 2 * hd + CONTEXT // 8 * hd
    assert s.kv_bytes == rows + 4 * (2 * csa + hca)
    kv, _, _ = _kv_and_work(m.manifest, m.engine_config, CONTEXT)
    mem = m.stats().memory
    assert kv == s.kv_bytes and mem is not None and mem.kv_bytes == s.kv_bytes


_MUTATIONS = {  # the release's names (transformers' save_pretrained writes them)
    "compressor wkv": "layers.2.attn.compressor.wkv.weight",
    "compressor wgate": "layers.2.attn.compressor.wgate.weight",
    "compressor ape": "layers.1.attn.compressor.ape",
    "compressor norm": "layers.3.attn.compressor.norm.weight",
    "indexer wq_b": "layers.1.attn.indexer.wq_b.weight",
    "indexer weights_proj": "layers.3.attn.indexer.weights_proj.weight",
    "indexer compressor wkv": "layers.1.attn.indexer.compressor.wkv.weight",
    "indexer compressor ape": "layers.3.attn.indexer.compressor.ape",
}


@pytest.mark.parametrize("what", sorted(_MUTATIONS))
def test_a_changed_weight_misses_the_bound(tiny: Tiny, tmp_path: Path, ref: np.ndarray,
                                          what: str) -> None:
    d = tiny[0]
    name = _MUTATIONS[what]
    sd = load_file(d / "model.safetensors")
    name = name if name in sd else "model." + name
    value = sd[name].clone()
    value = value + 0.5 * torch.randn(value.shape, generator=torch.Generator().manual_seed(1))
    changed = _load(with_tensor(d, tmp_path / "changed", name, value))
    got = changed.session().forward(IDS, all_logits=True)
    err, tol = float(np.abs(got - ref).max()), RTOL * float(np.abs(ref).max())
    assert err > tol, f"{what}: changing it moved no logit past the bound ({err:.3g})"


def test_the_container_runs_it(tiny: Tiny, tmp_path: Path) -> None:
    """``colibri convert``: kept, the same logits bit for bit; in Q8_0 the compressors'
    position biases stay F32 (the core reads them so) and the model runs."""
    d = tiny[0]
    want = _load(d).session().forward(IDS, all_logits=True)
    write_container(d, tmp_path / "keep")
    np.testing.assert_array_equal(_load(tmp_path / "keep").session().forward(IDS, all_logits=True),
                                  want)  # fmt: skip
    write_container(d, tmp_path / "q8", quant="q8_0")
    m = _load(tmp_path / "q8")
    types = {n: t.dtype for n, t in m.manifest.tensors.items()}
    assert types["blk.1.attn_compressor_kv"] == "Q8_0"
    assert {types[n] for n in ("blk.1.attn_compressor_ape", "blk.1.indexer_compressor_ape",
                               "blk.2.attn_compressor_ape")} == {"F32"}  # fmt: skip
    got = m.session().forward(IDS, all_logits=True)
    assert np.isfinite(got).all() and got.shape == want.shape


def test_the_sliding_ring_with_compressed_layers(tiny: Tiny) -> None:
    """At a context of 256 every layer keeps a ring of 128 window rows, so a 200-token
    prompt runs in passes of 124 queries and the ring wraps while the compressed entries
    cover the whole past: within the bound of transformers at every position (the
    indexer's choices clear), chunks of 7 and token by token bit-identical, the allocation
    the budget's figure."""
    d, model = tiny
    ids = prompt_ids(200, seed=8, vocab=VOCAB)
    assert min(indexer_margins(model, ids)) > 1e-4
    m = _load(d, context_length=256)
    want = m.session().forward(ids, all_logits=True)
    assert_within(want, reference_logits(model, ids), "ring prefill", RTOL)
    s = m.session()
    got = np.concatenate([s.forward(ids[i:i + 7], all_logits=True) for i in range(0, 200, 7)])
    np.testing.assert_array_equal(got, want)
    s = m.session()
    np.testing.assert_array_equal(np.stack([s.forward([t]) for t in ids]), want)
    kv, _, _ = _kv_and_work(m.manifest, m.engine_config, 256)
    assert s.kv_bytes == kv
    from colibri.server.scheduler import Scheduler

    sched = Scheduler(m)  # the server reserves what such a session allocates, state included
    try:
        assert sched.request_kv_bytes(256) == kv
        short = m.session()
        short.forward(ids[:10])
        assert sched.request_kv_bytes(64) == short.kv_bytes  # rows grow in steps of 64
    finally:
        sched.close()
