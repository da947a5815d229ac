"""max_time (issue 34, item 5: a per-request time limit): no token is computed once the
limit has passed (finish "length", as at max_tokens); tokens before it are unchanged. On
the real SmolLM2, greedy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import colibri as co
from support.realmodel import smollm2_gguf

PROMPT = "The capital of France is"
OPTS = {"sampling": co.Sampling(temperature=0.0), "min_tokens": 12, "max_tokens": 12}


@pytest.fixture(scope="module")
def model() -> Iterator[co.Model]:
    m = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(
        threads=co.ThreadConfig(n=2), context_length=128))
    yield m
    m.close()


def test_a_spent_limit_stops_after_the_token_under_way(model: co.Model) -> None:
    free = model.generate(PROMPT, **OPTS)
    assert len(free.token_ids) == 12 and free.finish_reason == "length"
    # The first token comes from the prefill, which always runs; the limit is then spent.
    g = model.generate(PROMPT, max_time=1e-9, **OPTS)
    assert g.token_ids == free.token_ids[:1] and g.finish_reason == "length"
    chunks = list(model.stream(PROMPT, max_time=1e-9, **OPTS))
    assert [c.token_id for c in chunks if c.token_id is not None] == free.token_ids[:1]
    assert chunks[-1].finish_reason == "length"


def test_a_generous_limit_changes_nothing(model: co.Model) -> None:
    free = model.generate(PROMPT, **OPTS)
    assert model.generate(PROMPT, max_time=3600, **OPTS).token_ids == free.token_ids


def test_the_session_continues_after_a_limit(model: co.Model) -> None:
    """A generation cut by its limit leaves the session holding exactly its tokens."""
    s = model.session()
    ids = model.tokenizer.encode(PROMPT)
    g = s.generate(ids, max_time=1e-9, **OPTS)
    # As after any generation, the last token's KV entry is written by the next forward.
    assert len(g.token_ids) == 1 and s.n_tokens == len(ids)
    rest = s.generate(g.token_ids, max_tokens=3, sampling=OPTS["sampling"], min_tokens=3)
    assert g.token_ids + rest.token_ids == model.generate(PROMPT, **OPTS).token_ids[:4]
    with pytest.raises(co.errors.InvalidRequestError, match="not text"):
        s.generate(PROMPT)  # text where ids belong: a clear error, not a ValueError


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "1s"])
def test_bad_limits_are_refused(model: co.Model, bad: object) -> None:
    with pytest.raises(co.errors.InvalidRequestError, match="max_time"):
        model.generate(PROMPT, max_time=bad, max_tokens=2)
