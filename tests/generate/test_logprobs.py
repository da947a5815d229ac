"""Log-probabilities (Sampling(logprobs=True, top_logprobs=k, prompt_logprobs=k)).

The raw log-probabilities are checked against an oracle nobody here wrote: transformers
loading the same SmolLM2 GGUF in float32 (the reference of test_smollm2.py), whose
logits' log_softmax colibri must reproduce within 1e-4 with float32 activations, for the
generated tokens, their top-5 alternatives and the prompt tokens. Measured: 9e-6
(generated), 3e-5 (prompt), 2e-5 (alternatives).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import colibri as co
from colibri.errors import ConfigError
from colibri.generate.logprobs import log_softmax
from support.realmodel import smollm2_gguf

TOL = 1e-4


@pytest.fixture(scope="module")
def exact() -> co.Model:
    return co.Model.load(smollm2_gguf(), engine=co.EngineConfig(
        context_length=256, activation_precision="float32"))


@pytest.fixture(scope="module")
def model() -> co.Model:
    return co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=256))


def test_raw_logprobs_equal_transformers_log_softmax(
    exact: co.Model, reference: dict[str, np.ndarray],
) -> None:
    prompt = [int(x) for x in reference["prompt"]]
    seq = [int(x) for x in reference["sequence"]]
    ref = log_softmax(reference["logits"])
    n = len(prompt)
    g = exact.generate(prompt, max_tokens=40, sampling=co.Sampling(
        logprobs=True, top_logprobs=5, prompt_logprobs=5))
    assert g.token_ids == seq[n:n + len(g.token_ids)]  # greedy: transformers' answer
    assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids) >= 5
    for i, lp in enumerate(g.logprobs):
        row = ref[n - 1 + i]
        assert lp.token_id == g.token_ids[i]
        assert abs(lp.logprob - row[lp.token_id]) <= TOL
        assert lp.text == exact.tokenizer.token_bytes(lp.token_id).decode("utf-8", "replace")
        assert [a.token_id for a in lp.top] == [int(t) for t in np.argsort(-row)[:5]]
        for a in lp.top:
            assert abs(a.logprob - row[a.token_id]) <= TOL
    assert g.prompt_logprobs is not None and len(g.prompt_logprobs) == n
    assert g.prompt_logprobs[0] is None  # nothing comes before the first token
    for i in range(1, n):
        lp = g.prompt_logprobs[i]
        assert lp is not None and lp.token_id == prompt[i]
        assert abs(lp.logprob - ref[i - 1, prompt[i]]) <= TOL
        assert len(lp.top) == 5 and abs(lp.top[0].logprob - ref[i - 1].max()) <= TOL


def test_raw_logprobs_ignore_the_sampling_settings(model: co.Model) -> None:
    ids = model.encode_prompt("Once upon a time")
    sampling = co.Sampling(temperature=0.9, top_k=8, seed=11, logprobs=True, top_logprobs=2)
    g = model.generate(ids, max_tokens=12, sampling=sampling)
    assert g.logprobs is not None
    # Teacher-forced through a plain session: the same logits, log-softmaxed by NumPy.
    s = model.session()
    logits = s.forward(ids)
    for tok, lp in zip(g.token_ids, g.logprobs, strict=True):
        x = logits.astype(np.float64)
        want = x[tok] - x.max() - math.log(np.exp(x - x.max()).sum())
        assert lp.logprob == pytest.approx(want, abs=1e-9)
        assert lp.top[0].logprob >= lp.top[1].logprob
        logits = s.forward([tok])
    # The stream's chunks carry the same records.
    chunks = [c for c in model.stream(ids, max_tokens=12, sampling=sampling) if c.token_id]
    assert [c.logprobs for c in chunks] == g.logprobs


def test_processed_logprobs_are_the_distribution_drawn_from(model: co.Model) -> None:
    ids = model.encode_prompt("The weather today is")
    t, k = 0.7, 5
    sampling = co.Sampling(temperature=t, top_k=k, seed=2, logprobs=True, top_logprobs=8,
                           logprobs_mode="processed")
    g = model.generate(ids, max_tokens=6, sampling=sampling)
    assert g.logprobs is not None
    s = model.session()
    logits = s.forward(ids)
    for tok, lp in zip(g.token_ids, g.logprobs, strict=True):
        x = logits.astype(np.float64)
        keep = np.argsort(-x, kind="stable")[:k]
        z = x[keep] / t
        lsm = z - z.max() - math.log(np.exp(z - z.max()).sum())
        want = dict(zip(keep.tolist(), lsm, strict=True))
        assert lp.logprob == pytest.approx(want[tok], abs=1e-6)
        # Only the k tokens that could be drawn are listed, most likely first.
        assert sorted(a.token_id for a in lp.top) == sorted(want)
        assert sum(math.exp(a.logprob) for a in lp.top) == pytest.approx(1.0, abs=1e-6)
        logits = s.forward([tok])
    greedy = model.generate(ids, max_tokens=3, sampling=co.Sampling(
        logprobs=True, top_logprobs=3, logprobs_mode="processed"))
    assert greedy.logprobs is not None
    assert all(lp.logprob == 0.0 and len(lp.top) == 1 for lp in greedy.logprobs)


def test_prompt_scores_on_a_session_use_what_it_holds(model: co.Model) -> None:
    ids = model.encode_prompt("The capital of France is Paris")
    whole = model.generate(ids, max_tokens=0, sampling=co.Sampling(prompt_logprobs=0))
    assert whole.prompt_logprobs is not None and whole.prompt_logprobs[0] is None
    s = model.session()
    s.forward(ids[:3])
    part = s.generate(ids[3:], max_tokens=0, sampling=co.Sampling(prompt_logprobs=0))
    assert part.prompt_logprobs is not None and len(part.prompt_logprobs) == len(ids) - 3
    for a, b in zip(part.prompt_logprobs, whole.prompt_logprobs[3:], strict=True):
        assert a is not None and b is not None and a.top == b.top == ()
        assert a.token_id == b.token_id and a.logprob == pytest.approx(b.logprob, abs=1e-5)
    d = whole.prompt_logprobs[1].to_dict()  # type: ignore[union-attr]
    assert set(d) == {"token", "token_id", "logprob"}


def test_logprob_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="top_logprobs: needs logprobs=True"):
        co.Sampling(top_logprobs=3)
    with pytest.raises(ConfigError, match="logprobs_mode"):
        co.Sampling(logprobs=True, logprobs_mode="softmax")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="prompt_logprobs"):
        co.Sampling(prompt_logprobs=-1)
    s = co.Sampling(logprobs=True, top_logprobs=4, prompt_logprobs=2, logprobs_mode="processed")
    assert co.Sampling.from_dict(s.to_dict()) == s
