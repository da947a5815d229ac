"""Sliding-window rings through the public API, on the tiny gpt-oss of
support/gpt_oss_factory.py (window 4 on layers 0 and 2) at a context of 512, where the
sliding layers keep a ring of 128 positions (csrc/model/kv_cache.hpp):

* every position's logits of a 300-token prompt, and a greedy continuation, match
  transformers (the prompt is longer than the ring; 1e-4 of the largest logit);
* Session.rollback and fork beyond what the ring holds: InvalidRequestError, nothing
  changed; Session.holds_prefix says so first;
* generate_n's greedy samples all equal one generate, even when a sample outruns the ring
  (the prompt is prefilled again);
* speculative drafts of up to 64 tokens, verified and rolled back through the ring: the
  same greedy tokens as without drafting;
* Session.save / load past the rings continue with the same bits;
* the server scheduler reserves the rings' KV exactly;
* the prompt cache reuses an entry only for a prefix its ring still holds: a prompt that
  shares an older prefix is a miss, and generates what an uncached model does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import colibri as co
from colibri.errors import InvalidRequestError
from colibri.settings.spec import SpecConfig
from support.gpt_oss_factory import VOCAB, build_gpt_oss
from support.logit_checks import assert_greedy_matches, assert_within
from support.modelfactory import prompt_ids, reference_greedy, reference_logits
from support.tokenizer_vectors import hf_tokenizer_dir, smollm2_gguf

CONTEXT = 512
IDS = prompt_ids(300, seed=5, vocab=VOCAB)


@pytest.fixture(autouse=True)
def _side_files_in_tmp(tmp_path_factory: pytest.TempPathFactory,
                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    d, model = build_gpt_oss(tmp_path_factory.mktemp("gpt-oss-ring"),
                             max_position_embeddings=CONTEXT)  # fmt: skip
    # generate() needs a tokenizer: SmolLM2's (the ids here are the model's, < 128).
    shutil.copy(hf_tokenizer_dir("smollm2", smollm2_gguf()) / "tokenizer.json", d)
    return d, model


def _load(d: Path, **engine: object) -> co.Model:
    return co.Model.load(d, engine=co.EngineConfig(context_length=CONTEXT, **engine))


def test_long_prompt_and_greedy_match_transformers(tiny: tuple[Path, torch.nn.Module]) -> None:
    d, model = tiny
    assert model.config.sliding_window == 4
    m = _load(d)
    assert_within(m.session().forward(IDS, all_logits=True), reference_logits(model, IDS),
                  "prefill")  # fmt: skip
    ref_tokens, ref_logits = reference_greedy(model, IDS[:200], 12)
    assert_greedy_matches(m.session(), IDS[:200], ref_tokens, ref_logits)


def test_rollback_and_fork_past_the_ring_are_refused(tiny: tuple[Path, torch.nn.Module]) -> None:
    m = _load(tiny[0])
    s = m.session()
    s.forward(IDS)
    assert s.holds_prefix(300 - 64) and not s.holds_prefix(100)
    with pytest.raises(InvalidRequestError, match="sliding-window layers keep only"):
        s.rollback(200)
    with pytest.raises(InvalidRequestError, match="no longer in the sliding-window"):
        s.fork(100)
    assert s.n_tokens == 300
    s.rollback(64)  # a speculative draft's worth: fine
    np.testing.assert_array_equal(s.forward(IDS[236:], all_logits=True),
                                  m.session().forward(IDS, all_logits=True)[236:])


def test_generate_n_samples_outrunning_the_ring(tiny: tuple[Path, torch.nn.Module]) -> None:
    m = _load(tiny[0])
    prompt = IDS[:20]
    one = m.generate(prompt, max_tokens=200, min_tokens=200)
    many = m.generate_n(prompt, n=2, max_tokens=200, min_tokens=200)
    assert len(one.token_ids) == 200  # past the ring: the second sample needs a new prefill
    assert [g.token_ids for g in many] == [one.token_ids] * 2


def test_prompt_cache_misses_a_prefix_the_ring_lost(tiny: tuple[Path, torch.nn.Module]) -> None:
    cached, plain = _load(tiny[0], prompt_cache="64MiB"), _load(tiny[0])
    first = cached.generate(IDS[:250], max_tokens=8)
    assert first.token_ids == plain.generate(IDS[:250], max_tokens=8).token_ids
    other = IDS[:100] + prompt_ids(50, seed=9, vocab=VOCAB)  # shares 100 old tokens only
    a, b = cached.generate(other, max_tokens=8), plain.generate(other, max_tokens=8)
    assert a.token_ids == b.token_ids and a.stats.cached_tokens == 0
    near = IDS[:245] + prompt_ids(5, seed=10, vocab=VOCAB)  # within the ring: a hit
    a, b = cached.generate(near, max_tokens=8), plain.generate(near, max_tokens=8)
    assert a.token_ids == b.token_ids and a.stats.cached_tokens == 245


def test_speculative_drafts_rolled_back_through_the_ring(
        tiny: tuple[Path, torch.nn.Module]) -> None:  # fmt: skip
    """Prompt-lookup drafts of up to 64 tokens (MAX_DRAFT, what the ring's slack covers),
    verified in one forward and the rejected ones rolled back: the same 200 greedy tokens
    as without drafting, and the session holds the same state (its next logits)."""
    m = _load(tiny[0])
    prompt = IDS[:40] * 3  # repeats: the drafter finds n-gram matches to propose
    plain = m.generate(prompt, max_tokens=200, min_tokens=200)
    spec = m.generate(prompt, max_tokens=200, min_tokens=200,
                      spec=SpecConfig(drafter="lookup", max_draft=64, ngram_sizes=(2, 1)))
    assert spec.token_ids == plain.token_ids and len(plain.token_ids) == 200
    st = spec.stats.spec
    assert st is not None and sum(st.proposed_at) > 64, st  # drafts were made


def test_server_reserves_the_rings_kv(tiny: tuple[Path, torch.nn.Module]) -> None:
    """The server's scheduler reserves what a request's session really allocates: the
    rings hold at most 128 positions, the full layers every one."""
    from colibri.server.scheduler import Scheduler

    m = _load(tiny[0])
    sched = Scheduler(m, max_running=2)
    for n in (64, CONTEXT):  # whole allocation steps (the cache grows 64, 128, 256, 512)
        s = m.session()
        s.forward(IDS[:1] * n)
        assert sched.request_kv_bytes(n) == s._core.kv_allocated_bytes
    assert sched.kv_budget == 2 * sched.request_kv_bytes(CONTEXT) == 2 * m.stats().memory.kv_bytes
    ticket = sched.admit(positions=64)
    assert ticket.kv == sched.request_kv_bytes(64) > 64 * sched.kv_position_bytes
    sched.close()


def test_save_and_load_keep_the_window(tiny: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    """Session.save / Session.load of a session past its rings: the file holds the sliding
    layers' last window only, and the loaded session continues with the same bits."""
    m = _load(tiny[0])
    s = m.session()
    s.forward(IDS[:280])
    s.save(tmp_path / "s.colibri")
    t = co.Session.load(tmp_path / "s.colibri", m)
    assert t.token_ids == IDS[:280]
    np.testing.assert_array_equal(t.forward(IDS[280:], all_logits=True),
                                  s.forward(IDS[280:], all_logits=True))
