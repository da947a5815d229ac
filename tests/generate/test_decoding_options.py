"""Options of the decode loop on the real SmolLM2: logits processors (in order, with the
sequence so far, in generate, stream and sessions), logit_bias, min_tokens,
stop_token_ids, and n > 1 samples sharing the prompt's prefill (seeded, reproducible,
each equal to the single generation with its seed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import colibri as co
from colibri.errors import InvalidRequestError
from colibri.generate.samples import sample_seeds
from support.realmodel import smollm2_gguf


@pytest.fixture(scope="module")
def model() -> co.Model:
    return co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=256))


def test_processors_run_in_order_on_the_sequence_so_far(model: co.Model) -> None:
    ids = model.encode_prompt("The capital of France is")
    plain = model.generate(ids, max_tokens=6)
    banned = plain.token_ids[0]
    seen: list[tuple[str, int, int]] = []

    def ban(token_ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        seen.append(("ban", len(token_ids), int(token_ids[-1])))
        logits[banned] = -np.inf
        return logits

    def check(token_ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        assert logits[banned] == -np.inf  # the first processor ran before
        seen.append(("check", len(token_ids), int(token_ids[-1])))
        return logits

    g = model.generate(ids, max_tokens=6, logits_processors=[ban, check])
    assert banned not in g.token_ids and g.token_ids != plain.token_ids
    # Called once per token, in order, with prompt + generated ids (int32).
    assert [s[0] for s in seen] == ["ban", "check"] * len(g.token_ids)
    lengths = [s[1] for s in seen[::2]]
    assert lengths == list(range(len(ids), len(ids) + len(g.token_ids)))
    assert [s[2] for s in seen[::2]] == [ids[-1], *g.token_ids[:-1]]
    # The same through stream and a session; logit_bias bans the same way.
    streamed = [c.token_id for c in model.stream(ids, max_tokens=6, logits_processors=[ban])
                if c.token_id is not None]
    assert streamed == g.token_ids
    s = model.session()
    assert s.generate(ids, max_tokens=6, logits_processors=[ban]).token_ids == g.token_ids
    biased = model.generate(ids, max_tokens=6, sampling=co.Sampling(logit_bias={banned: -np.inf}))
    assert biased.token_ids == g.token_ids


def test_a_bad_processor_is_a_clear_error(model: co.Model) -> None:
    def short(token_ids: Any, logits: np.ndarray) -> np.ndarray:
        return logits[:10]

    with pytest.raises(InvalidRequestError, match="returned float32 .10,."):
        model.generate("Hi", max_tokens=2, logits_processors=[short])
    with pytest.raises(InvalidRequestError, match="callables"):
        model.generate("Hi", max_tokens=2, logits_processors=[3])  # type: ignore[list-item]
    with pytest.raises(InvalidRequestError, match=r"unknown option 'max_token' \(did you mean "
                                                  r"'max_tokens'\?\)"):
        model.generate("Hi", max_token=2)  # type: ignore[call-arg]


def test_unknown_option_lists_each_option_once() -> None:
    """The unknown-option error names every option once, progress where the call takes it
    (issue 38, item 2: five names were listed twice and progress not at all)."""
    from colibri.generate.request import parse_request

    with pytest.raises(InvalidRequestError) as info:
        parse_request({"progres": print}, where="generate")
    msg = str(info.value)
    assert "did you mean 'progress'" in msg
    listed = msg.split("the options are: ")[1].split(", ")
    assert len(listed) == len(set(listed)) == 12 and listed[0] == "max_tokens"
    assert "progress" in listed and "spec" in listed
    with pytest.raises(InvalidRequestError) as info:
        parse_request({"progress": print}, where="agenerate")  # async calls take no progress
    assert "progress" not in str(info.value).split("the options are: ")[1]


def test_min_tokens_holds_off_eos(model: co.Model) -> None:
    # As a raw completion this question ends at once: EOS is the most likely first token.
    prompt = "Why is the sky blue?"
    first = model.generate(prompt, max_tokens=8)
    assert len(first.token_ids) == 1 and first.token_ids[0] in model.tokenizer.eos_ids
    g = model.generate(prompt, max_tokens=12, min_tokens=5)
    assert len(g.token_ids) >= 5 and g.text
    assert not set(g.token_ids[:5]) & model.tokenizer.eos_ids


def test_stop_token_ids_end_the_text(model: co.Model) -> None:
    ids = model.encode_prompt("The capital of France is")
    plain = model.generate(ids, max_tokens=12)
    stop = plain.token_ids[2]
    g = model.generate(ids, max_tokens=12, stop_token_ids=[stop])
    assert g.finish_reason == "stop" and g.token_ids == plain.token_ids[:3]
    # A plain token's text stays in the text (vLLM's rule); it ends it.
    assert g.text == model.tokenizer.decode(plain.token_ids[:3])
    # min_tokens holds stop ids off too.
    later = model.generate(ids, max_tokens=12, stop_token_ids=[stop], min_tokens=4)
    assert stop not in later.token_ids[:4]
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        model.generate(ids, max_tokens=2, stop_token_ids=[10**6])


def test_n_samples_share_the_prefill_and_are_reproducible(model: co.Model) -> None:
    prompt = "Once upon a time"
    sampling = co.Sampling(temperature=1.0, top_p=0.95, seed=42)
    a = model.generate_n(prompt, n=4, max_tokens=10, sampling=sampling)
    b = model.generate_n(prompt, n=4, max_tokens=10, sampling=sampling)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert len({tuple(g.token_ids) for g in a}) > 1  # independent streams differ
    # Sample i does not depend on n, and is the single generation with its seed.
    two = model.generate_n(prompt, n=2, max_tokens=10, sampling=sampling)
    assert [g.token_ids for g in two] == [g.token_ids for g in a[:2]]
    for g, seed in zip(a, sample_seeds(42, 4), strict=True):
        alone = model.generate(prompt, max_tokens=10, sampling=sampling.replace(seed=seed))
        assert g.token_ids == alone.token_ids and g.text == alone.text
        assert g.prompt_ids == alone.prompt_ids and g.stats.prompt_tokens == 1
    greedy = model.generate_n(messages=[{"role": "user", "content": "Hi"}], n=3, max_tokens=6)
    assert len({tuple(g.token_ids) for g in greedy}) == 1
    assert greedy[0].token_ids == model.chat("Hi", max_tokens=6).token_ids
    scored = model.generate_n(prompt, n=2, max_tokens=2, sampling=co.Sampling(prompt_logprobs=1))
    single = model.generate(prompt, max_tokens=0, sampling=co.Sampling(prompt_logprobs=1))
    assert scored[0].prompt_logprobs == scored[1].prompt_logprobs
    assert single.prompt_logprobs is not None and scored[0].prompt_logprobs is not None
    for x, y in zip(scored[0].prompt_logprobs[1:], single.prompt_logprobs[1:], strict=True):
        assert x is not None and y is not None
        assert x.token_id == y.token_id and abs(x.logprob - y.logprob) < 1e-5
    with pytest.raises(InvalidRequestError, match="n must be"):
        model.generate_n(prompt, n=0)
