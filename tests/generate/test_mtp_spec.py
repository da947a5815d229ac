"""Speculative decoding with MTP drafts (SpecConfig(drafter="mtp")) never changes the tokens,
and the MTP layer's KV cache stays in step with the session's tokens.

Oracles: plain greedy decoding of the same tiny DeepSeek-V3 / GLM-4.5 model (token for
token, >= 200 tokens, resident and streamed through an expert cache of top_k + 1 slots),
and for the MTP cache a fresh session that forwarded the same tokens in one prefill:
batched and one-by-one forwards give the same bits (tests/oracle/test_determinism.py), so after any
sequence of verifies and rollbacks the drafts' logits must be bit-identical to the fresh
session's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.errors import ConfigError
from fuzz.seeds import _byte_level_tokenizer
from support.deepseek_factory import TinyDeepseek, prompt_ids
from support.modelfactory import TinyModel
from support.streaming_helpers import budget_for_slots, engine

N_TOKENS = 210
CONTEXT = 256
VARIANTS = ["deepseek_v3", "glm4_moe"]


@pytest.fixture(scope="module")
def checkpoints(deepseek_models: dict[str, TinyDeepseek],
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny checkpoints with a byte-level tokenizer.json (one token per id 0..255: the
    factory's checkpoints have none, and llama.cpp's converter drops DeepSeek's MTP layer)."""
    out = {}
    for v in VARIANTS:
        d = tmp_path_factory.mktemp(v)
        for f in Path(deepseek_models[v].hf_dir).iterdir():
            shutil.copy(f, d / f.name)
        _byte_level_tokenizer(d / "tokenizer.json")
        out[v] = d
    return out


def load(path: Path, budget: int | None = None) -> colibri.Model:
    return colibri.Model.load(path, engine=engine(budget=budget, context_length=CONTEXT))


def fresh_drafts(m: colibri.Model, tokens: list[int], nxt: int, k: int) -> np.ndarray:
    s = m.session()
    s._core.enable_mtp()
    s.forward(tokens)
    _, logits = s._core.mtp_draft(nxt, k, True)
    assert logits is not None
    return np.asarray(logits)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("streamed", [False, True], ids=["resident", "streamed"])
def test_greedy_with_mtp_drafts_equals_plain_greedy(checkpoints: dict[str, Path], variant: str,
                                                    streamed: bool) -> None:
    path = checkpoints[variant]
    budget = None
    if streamed:
        top_k = int(colibri.Model.load(path).config.n_experts_per_tok)
        budget = budget_for_slots(path, top_k + 1, context_length=CONTEXT)
    m = load(path, budget)
    for seed in range(10):  # the first prompt whose plain run does not stop (EOS) early
        ids = prompt_ids(16, seed=seed)
        plain = m.generate(ids, max_tokens=N_TOKENS)
        if len(plain.token_ids) >= 200:
            break
    assert len(plain.token_ids) >= 200
    for k in (1, 4):
        g = m.generate(ids, max_tokens=N_TOKENS, spec=colibri.SpecConfig(drafter="mtp",
                                                                         max_draft=k))
        assert g.token_ids == plain.token_ids, f"max_draft={k}"
        sp = g.stats.spec
        assert sp is not None and sp.drafter == "mtp" and sp.drafted > 0
        assert sp.verify_forwards > 0 and sp.tokens_per_forward >= 1.0
    if streamed:
        assert m.stats().experts.misses > 0  # the expert cache really streamed


@pytest.mark.parametrize("variant", VARIANTS)
def test_mtp_cache_follows_verifies_and_rollbacks(checkpoints: dict[str, Path],
                                                  variant: str) -> None:
    m = load(checkpoints[variant])
    ids = prompt_ids(16)
    s = m.session()
    g = s.generate(ids, max_tokens=60, spec=colibri.SpecConfig(drafter="mtp", max_draft=3))
    assert g.stats.spec is not None and g.stats.spec.verify_forwards > 0
    assert s.token_ids == ids + g.token_ids[:-1]  # the last token is chosen, not forwarded
    core = s._core
    last = g.token_ids[-1]
    _, got = core.mtp_draft(last, 3, True)
    np.testing.assert_array_equal(got, fresh_drafts(m, s.token_ids, last, 3))
    # Session.rollback after speculative steps: the MTP cache follows
    s.rollback(7)
    held = s.token_ids
    _, got = core.mtp_draft(held[-1], 2, True)  # as if held[-1] were chosen next again
    np.testing.assert_array_equal(got, fresh_drafts(m, held, held[-1], 2))
    # ... a speculative generation continues from it as a plain one from the same tokens,
    # and the drafts again equal a fresh session's
    g2 = s.generate([5], max_tokens=20, spec="mtp")
    assert g2.token_ids == m.session().generate([*held, 5], max_tokens=20).token_ids
    _, got = core.mtp_draft(g2.token_ids[-1], 2, True)
    np.testing.assert_array_equal(got, fresh_drafts(m, s.token_ids, g2.token_ids[-1], 2))
    # a rollback deeper than the states kept restarts the MTP context at that point
    s.rollback(s.n_tokens - 4)
    assert core.mtp_origin == 4 and core.mtp_committed == 0
    drafts, _ = core.mtp_draft(5, 2)
    assert drafts == []  # no trunk state recorded yet after a restart
    s.forward([5])
    drafts, _ = core.mtp_draft(6, 2)
    assert len(drafts) == 2


def test_mtp_needs_the_layer_and_auto_takes_it(checkpoints: dict[str, Path],
                                               tiny_models: dict[str, TinyModel]) -> None:
    llama = colibri.Model.load(tiny_models["llama"].gguf["F32"])
    with pytest.raises(ConfigError, match="no multi-token-prediction layers"):
        llama.generate([1, 5, 6], max_tokens=3, spec="mtp")
    g = llama.generate([1, 5, 6, 5, 6, 5], max_tokens=8, spec="auto")
    assert g.stats.spec is not None and g.stats.spec.drafter == "auto (lookup)"
    m = load(checkpoints["deepseek_v3"])
    g = m.generate(prompt_ids(8), max_tokens=8, spec="auto")
    assert g.stats.spec is not None and g.stats.spec.drafter == "auto (mtp)"
    assert g.token_ids == m.generate(prompt_ids(8), max_tokens=8).token_ids


def test_model_stats_sum_the_spec_figures_and_cli_runs_mtp(
    checkpoints: dict[str, Path], capsys: pytest.CaptureFixture[str],
) -> None:
    m = load(checkpoints["deepseek_v3"])
    assert m.stats().spec is None
    a = m.generate(prompt_ids(8), max_tokens=30, spec="mtp")
    m.generate(prompt_ids(8), max_tokens=5)  # no drafting: not counted
    b = m.generate(prompt_ids(9), max_tokens=30, spec=colibri.SpecConfig("mtp", max_draft=2))
    total = m.stats().spec
    assert a.stats.spec is not None and b.stats.spec is not None and total is not None
    assert total.drafted == a.stats.spec.drafted + b.stats.spec.drafted
    assert total.accepted == a.stats.spec.accepted + b.stats.spec.accepted
    assert total.verify_forwards == a.stats.spec.verify_forwards + b.stats.spec.verify_forwards
    assert total.proposed_at[:2] == tuple(
        x + y for x, y in zip(a.stats.spec.proposed_at[:2], b.stats.spec.proposed_at, strict=False))
    assert total.drafter == "mtp" and "speculative" in str(m.stats())

    from colibri import cli

    base = ["run", "-m", str(checkpoints["deepseek_v3"]), "-n", "24", "--raw", "abcdefgh"]
    assert cli.main(base) == 0
    plain_out, _ = capsys.readouterr()
    assert cli.main([*base, "--spec", "mtp", "--max-draft", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == plain_out
    assert "colibri: speculative (mtp):" in err and "tokens per forward" in err


class OracleOverMtp:
    """Runs the MTP drafter (its cache follows every step) but proposes the tokens plain
    greedy decoding produces, so verifies accept drafts and the MTP layer then catches up
    over several accepted positions at once (random MTP weights accept nothing)."""

    def __init__(self, session: object, plain: list[int], n_prompt: int) -> None:
        from colibri.speculative import MtpDrafter

        self.mtp = MtpDrafter(session)  # type: ignore[arg-type]
        self.plain, self.n_prompt = plain, n_prompt

    def propose(self, history: list[int], k: int) -> list[int]:
        self.mtp.propose(history, k)
        at = len(history) - self.n_prompt
        return self.plain[at:at + k]


@pytest.mark.parametrize("variant", VARIANTS)
def test_mtp_cache_after_accepted_drafts(checkpoints: dict[str, Path], variant: str) -> None:
    from colibri.generate.generation import stream_tokens
    from colibri.speculative import SpecConfig, Speculator

    m = load(checkpoints[variant])
    ids = prompt_ids(16)
    plain = m.generate(ids, max_tokens=40).token_ids
    s = m.session()
    drafter = OracleOverMtp(s._core, plain, len(ids))
    spec = Speculator(SpecConfig(drafter="lookup", max_draft=3), drafter)
    got = [c.token_id for c in stream_tokens(s, m.tokenizer, ids, max_tokens=40,
                                             sampling=colibri.Sampling(), stop=(),
                                             speculator=spec) if c.token_id is not None]
    assert got == plain and spec.accepted > 10
    _, logits = s._core.mtp_draft(got[-1], 3, True)
    np.testing.assert_array_equal(logits, fresh_drafts(m, s.token_ids, got[-1], 3))
