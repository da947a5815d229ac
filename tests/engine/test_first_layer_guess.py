"""The first-layer guess (IOConfig.first_layer_guess, issue 14's per-token gap): just
before the first MoE layer's attention the engine guesses that layer's experts from the
residual stream there and prefetches them under its own governor. Checked here: the guess is issued
and counted (first_* counters, a subset of the prefetch_* ones), the layer really routes
to what it read, it is off when switched off (and with the lookahead off), it targets the
first MoE layer after leading dense ones (DeepSeek-V3: dense layer 0, sigmoid grouped
routing with a correction bias), and the logits are the same bits on, off and without
prefetch at all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import colibri as co
from colibri.errors import ConfigError
from support.modelfactory import build_tiny_model, prompt_ids


def _budget(src: Path, slots: int) -> int:
    probe = co.Model.load(src, engine=co.EngineConfig(cache=co.CacheConfig(history=False)))
    mem = probe.stats().memory
    probe.close()
    assert mem is not None and mem.slot_bytes > 0
    return mem.dense_bytes + mem.kv_bytes + mem.work_bytes + slots * mem.slot_bytes


def _decode(src: Path, budget: int, *, prefetch: bool, guess: bool, vocab: int,
            steps: int = 32) -> tuple[np.ndarray, np.ndarray, co.ExpertStats]:
    """Prefill + `steps` single-token forwards: (logits, routing of the decode steps, stats
    of the decode alone)."""
    engine = co.EngineConfig(
        ram_budget=budget, io=co.IOConfig(workers=2, prefetch=prefetch, first_layer_guess=guess),
        cache=co.CacheConfig(history=False),
    )  # fmt: skip
    with co.Model.load(src, engine=engine) as m:
        s = m.session()
        rows = [s.forward(prompt_ids(12, vocab=vocab)).copy()]
        before = m.stats().experts
        routing = []
        for t in prompt_ids(steps, seed=5, vocab=vocab):
            rows.append(s.forward([t]).copy())
            routing.append(s.last_routing().copy())
        return np.stack(rows), np.stack(routing), m.stats().experts.minus(before)


def _first_moe(routing: np.ndarray) -> int:
    """The first layer whose routing is not all -1 (dense layers write -1)."""
    layers = routing.shape[-2]
    return next(li for li in range(layers) if (routing[..., li, :] >= 0).all())


def _check(src: Path, vocab: int, slots: int) -> tuple[co.ExpertStats, np.ndarray]:
    budget = _budget(src, slots)
    on, r_on, e_on = _decode(src, budget, prefetch=True, guess=True, vocab=vocab)
    off, r_off, e_off = _decode(src, budget, prefetch=True, guess=False, vocab=vocab)
    none, _, e_none = _decode(src, budget, prefetch=False, guess=True, vocab=vocab)
    # A prefetch only: the same bits with the guess, without it, and without prefetch.
    assert np.array_equal(on, off) and np.array_equal(on, none)
    assert np.array_equal(r_on, r_off)
    # Switched off (or the lookahead off): no guess at all, the lookahead still counted.
    for e in (e_off, e_none):
        assert (e.first_candidates, e.first_issued, e.first_used, e.first_wasted) == (0, 0, 0, 0)
    assert e_off.prefetch_issued > 0 and e_none.prefetch_issued == 0
    # On: the guess is issued and counted as a subset of the prefetch figures.
    e = e_on
    assert e.first_candidates > 0 and e.first_issued > 0
    assert e.first_issued <= e.first_candidates <= e.prefetch_candidates
    assert e.first_candidates_used <= e.first_candidates
    assert e.first_issued <= e.prefetch_issued and e.first_used <= e.prefetch_used
    assert e.first_wasted <= e.prefetch_wasted
    return e, r_on


def test_guess_is_issued_used_and_switchable_bit_identical() -> None:
    """Tiny Qwen3-MoE (every layer MoE, softmax top-k), 6 cache slots: layer 0 misses on
    most tokens, so the guess has something to read."""
    src = build_tiny_model("qwen3_moe").hf_dir
    cfg = co.Model.load(src).config
    e, routing = _check(src, int(cfg.vocab_size), slots=6)
    assert _first_moe(routing) == 0
    # Really used: reads the guess started that the first layer then routed to, and a
    # guess better than chance (k of n experts) among the uncached candidates.
    assert e.first_used > 0
    chance = cfg.n_experts_per_tok / cfg.n_experts
    assert e.first_guess_accuracy > chance, (e.first_guess_accuracy, chance)


def test_guess_targets_first_moe_layer_after_dense_ones_deepseek() -> None:
    """Tiny DeepSeek-V3 (layer 0 dense; sigmoid scores, correction bias, 4 groups of
    which 2 are kept): the guess goes to layer 1 through that layer's full rule."""
    from support.deepseek_factory import build_tiny

    src = build_tiny("deepseek_v3", with_gguf=False).hf_dir
    cfg = co.Model.load(src).config
    e, routing = _check(src, int(cfg.vocab_size), slots=6)
    assert _first_moe(routing) == 1
    assert e.first_used > 0
    assert e.first_guess_accuracy > cfg.n_experts_per_tok / cfg.n_experts


def test_config_round_trips_and_defaults_on() -> None:
    io = co.IOConfig()
    assert io.first_layer_guess is True
    off = co.IOConfig(first_layer_guess=False)
    assert co.IOConfig.from_dict(off.to_dict()) == off != io
    with pytest.raises(ConfigError, match="IOConfig.first_layer_guess"):
        co.IOConfig(first_layer_guess=None)  # type: ignore[arg-type]


def test_demand_miss_waits_for_guessed_reads_holding_every_slot() -> None:
    """A cache of exactly top_k slots and slow reads: the guess, made before any expert of
    the forward is held, can take every slot with reads still running when the layer's
    router asks for an expert it did not guess. The demand read must wait for those reads
    and take a slot (before the fix it failed: "the expert cache has no free slot"), and
    the logits stay those of the run without the guess."""
    src = build_tiny_model("qwen3_moe").hf_dir
    cfg = co.Model.load(src).config
    budget = _budget(src, int(cfg.n_experts_per_tok))
    runs = []
    for guess in (True, False):
        engine = co.EngineConfig(
            ram_budget=budget, io=co.IOConfig(workers=2, first_layer_guess=guess),
            cache=co.CacheConfig(history=False),
        )  # fmt: skip
        with co.Model.load(src, engine=engine) as m:
            m.set_io_fault("slow_read")
            s = m.session()
            rows = [s.forward(prompt_ids(6)).copy()]
            rows += [s.forward([t]).copy() for t in prompt_ids(12, seed=9)]
            runs.append((np.stack(rows), m.stats().experts))
    (on, e_on), (off, _) = runs
    assert np.array_equal(on, off)
    assert e_on.first_issued > 0 and e_on.first_wasted > 0  # guesses that took a slot in vain
