"""colibri.sampling: settings, each sampler stage, the chain, seeds, and stop conditions.

The statistical tests compare many seeded draws with the exact distribution by Pearson's
chi-square test. scipy is not a dependency, so the survival function of the chi-square
distribution is computed here in closed form (exact for integer degrees of freedom) and
checked against tabulated critical values. With fixed seeds the tests are deterministic;
the significance level (1e-3) says how unlucky a seed would have to be for a correct
sampler to fail, and a negative control shows the test does reject a wrong distribution.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from colibri.errors import ConfigError, InvalidRequestError, TokenOutOfRangeError
from colibri.sampling import (
    LogitBias,
    Sampler,
    Sampling,
    StopChecker,
    apply_logit_bias,
    apply_penalties,
    apply_temperature,
    draw,
    min_p_filter,
    probabilities,
    sample,
    softmax,
    top_k_filter,
    top_p_filter,
)

NEG_INF = -np.inf
F32 = npt.NDArray[np.float32]


def logits_of(probs: list[float]) -> F32:
    """Logits whose softmax is `probs` (0 -> -inf)."""
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


def kept(a: npt.NDArray[Any]) -> set[int]:
    return {int(i) for i in np.flatnonzero(np.isfinite(a))}


# --- chi-square without scipy -------------------------------------------------------------


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df), exact for integer df >= 1.

    Even df = 2m: exp(-x/2) * sum_{i<m} (x/2)^i / i!  (Poisson tail).
    Odd df = 2m+1: erfc(sqrt(x/2)) + sqrt(2x/pi) exp(-x/2) sum_{i<m} x^i / (1*3*...*(2i+1)).
    """
    if x <= 0:
        return 1.0
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for i in range(1, df // 2):
            term *= (x / 2) / i
            total += term
        return math.exp(-x / 2) * total
    term, total = 1.0, 0.0
    for i in range(df // 2):
        if i:
            term *= x / (2 * i + 1)
        total += term
    return math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2) * total


@pytest.mark.parametrize(
    ("df", "critical_05", "critical_001"),
    # Tabulated upper critical values (NIST/SEMATECH e-Handbook, table 1.3.6.7.4).
    [(1, 3.841, 10.828), (2, 5.991, 13.816), (3, 7.815, 16.266), (5, 11.070, 20.515),
     (9, 16.919, 27.877), (10, 18.307, 29.588)],
)
def test_chi2_sf_matches_tables(df: int, critical_05: float, critical_001: float) -> None:
    assert chi2_sf(critical_05, df) == pytest.approx(0.05, abs=2e-4)
    assert chi2_sf(critical_001, df) == pytest.approx(0.001, abs=2e-5)


def chi2_pvalue(draws: list[int], expected_p: npt.NDArray[np.float64]) -> float:
    """Pearson's test of the draws against `expected_p`. Tokens with p = 0 must never
    appear (asserted); the others are the categories, except that the rarest ones are
    pooled into one bin until every bin expects >= 5 draws (the usual validity rule)."""
    counts = np.bincount(np.asarray(draws), minlength=expected_p.size)
    assert counts[expected_p == 0].sum() == 0, "a filtered token was drawn"
    n = len(draws)
    order = [int(i) for i in np.argsort(-expected_p) if expected_p[i] > 0]
    obs = [float(counts[i]) for i in order]
    exp = [n * float(expected_p[i]) for i in order]
    while len(exp) > 2 and exp[-1] < 5:  # pool the two rarest
        exp[-2] += exp.pop()
        obs[-2] += obs.pop()
    assert exp[-1] >= 5, "too few draws for the chi-square approximation"
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    return chi2_sf(stat, len(exp) - 1)


ALPHA = 1e-3

BASE = np.array([2.0, 1.5, 1.0, 0.7, 0.5, 0.0, -0.3, -0.8, -1.2, -2.0, -2.5], dtype=np.float32)


def softmax_ref(x: npt.NDArray[Any], t: float = 1.0) -> npt.NDArray[np.float64]:
    z = np.asarray(x, dtype=np.float64) / t
    e = np.exp(z - z.max())
    return np.asarray(e / e.sum(), dtype=np.float64)


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.8])
def test_temperature_sampling_matches_softmax(temperature: float) -> None:
    sampler = Sampler(Sampling(temperature=temperature, seed=1234))
    draws = [sampler(BASE) for _ in range(8000)]
    assert chi2_pvalue(draws, softmax_ref(BASE, temperature)) > ALPHA


def test_chi_square_rejects_a_wrong_distribution() -> None:
    """Negative control: draws at T=1 are clearly not softmax(logits/0.8)."""
    sampler = Sampler(Sampling(temperature=1.0, seed=1234))
    draws = [sampler(BASE) for _ in range(8000)]
    assert chi2_pvalue(draws, softmax_ref(BASE, 0.8)) < 1e-6


def test_filtered_sampling_matches_renormalized_distribution() -> None:
    """top-k 8, then top-p 0.9 of what is left, then min-p 0.2, then T = 0.7: each filter
    removes something (top-k ids 8-10, top-p ids 6-7, min-p id 5)."""
    s = Sampling(temperature=0.7, top_k=8, top_p=0.9, min_p=0.2, seed=7)
    # By hand: top-k keeps ids 0..7. Their renormalized softmax (T=1) in order; top-p 0.9
    # keeps the shortest prefix reaching 0.9; min-p drops p < 0.1 * p_max.
    p8 = softmax_ref(BASE[:8])
    n_top_p = int(np.searchsorted(np.cumsum(p8), 0.9)) + 1
    assert n_top_p == 6
    survivors = [i for i in range(n_top_p) if p8[i] >= 0.2 * p8[0]]
    assert survivors == [0, 1, 2, 3, 4]  # the hand-made distribution was chosen for this
    expected = np.zeros(BASE.size)
    expected[survivors] = softmax_ref(BASE[survivors], 0.7)
    np.testing.assert_allclose(probabilities(BASE, s), expected, rtol=1e-6, atol=1e-12)
    sampler = Sampler(s)
    draws = [sampler(BASE) for _ in range(6000)]
    assert chi2_pvalue(draws, expected) > ALPHA


# --- seeds --------------------------------------------------------------------------------


def test_same_seed_same_tokens_and_reset() -> None:
    s = Sampling(temperature=1.0, top_p=0.95, seed=42)
    a, b = Sampler(s), Sampler(s)
    seq_a = [a(BASE) for _ in range(200)]
    seq_b = [b(BASE) for _ in range(200)]
    assert seq_a == seq_b
    assert len(set(seq_a)) > 3  # it really samples
    a.reset()
    assert [a(BASE) for _ in range(200)] == seq_a
    c = Sampler(s.replace(seed=43))
    assert [c(BASE) for _ in range(200)] != seq_a


def test_sample_without_rng_uses_the_seed() -> None:
    s = Sampling(temperature=1.5, seed=9)
    first = sample(BASE, s)
    assert all(sample(BASE, s) == first for _ in range(20))
    rng = np.random.default_rng(9)
    assert sample(BASE, s, rng=rng) == first


def test_unseeded_samplers_differ() -> None:
    s = Sampling(temperature=1.0)
    a, b = Sampler(s), Sampler(s)
    assert [a(BASE) for _ in range(100)] != [b(BASE) for _ in range(100)]


# --- greedy -------------------------------------------------------------------------------


def test_greedy_is_argmax_with_ties_to_lowest_id() -> None:
    x = np.array([0.5, 3.0, -1.0, 3.0, 3.0], dtype=np.float32)
    assert sample(x) == 1
    assert sample(x, Sampling(top_k=1, temperature=0.9)) == 1
    np.testing.assert_array_equal(probabilities(x), [0, 1, 0, 0, 0])
    # Filters never remove the greedy token, so they do not change the choice.
    assert sample(x, Sampling(top_k=2, top_p=0.1, min_p=0.9)) == 1


def test_greedy_draws_no_randomness() -> None:
    sampler = Sampler(Sampling(seed=3))
    state = sampler.rng.bit_generator.state
    assert sampler(BASE) == 0
    assert sampler.rng.bit_generator.state == state


def test_greedy_sees_bias_and_penalties() -> None:
    x = np.array([1.0, 2.0, 1.5], dtype=np.float32)
    assert sample(x, Sampling(logit_bias={1: -1.0})) == 2
    assert sample(x, Sampling(repetition_penalty=2.0), history=[1]) == 2  # 2/2 = 1 < 1.5


# --- each stage on a hand-made distribution -----------------------------------------------

P = [0.05, 0.4, 0.1, 0.25, 0.2]  # sorted: 1 (0.4), 3 (0.25), 4 (0.2), 2 (0.1), 0 (0.05)


@pytest.mark.parametrize(
    ("k", "expected"),
    [(0, {0, 1, 2, 3, 4}), (1, {1}), (2, {1, 3}), (3, {1, 3, 4}), (4, {1, 2, 3, 4}),
     (5, {0, 1, 2, 3, 4}), (99, {0, 1, 2, 3, 4})],
)
def test_top_k(k: int, expected: set[int]) -> None:
    x = logits_of(P)
    out = top_k_filter(x, k)
    assert kept(out) == expected
    np.testing.assert_array_equal(out[sorted(expected)], x[sorted(expected)])


def test_top_k_ties_go_to_lowest_ids() -> None:
    x = np.array([1.0, 2.0, 1.0, 1.0, 0.0, 1.0], dtype=np.float32)
    assert kept(top_k_filter(x, 3)) == {0, 1, 2}
    assert kept(top_k_filter(x, 4)) == {0, 1, 2, 3}


@pytest.mark.parametrize(
    ("p", "expected"),
    [(1.0, {0, 1, 2, 3, 4}), (0.1, {1}), (0.4, {1}), (0.41, {1, 3}), (0.65, {1, 3}),
     (0.66, {1, 3, 4}), (0.85, {1, 3, 4}), (0.9, {1, 2, 3, 4}), (0.95, {1, 2, 3, 4}),
     (0.96, {0, 1, 2, 3, 4})],
)
def test_top_p(p: float, expected: set[int]) -> None:
    assert kept(top_p_filter(logits_of(P), p)) == expected


def top_p_reference(x: npt.NDArray[Any], p: float) -> set[int]:
    """Top-p by a full sort, most likely first, ties to the lowest id."""
    order = sorted(range(x.size), key=lambda i: (-float(x[i]), i))
    probs = softmax_ref(x)
    total, out = 0.0, set()
    for i in order:
        out.add(i)
        total += probs[i]
        if total >= p - 1e-6:
            break
    return out


@pytest.mark.parametrize("shape", ["peaked", "flat", "ties"])
def test_top_p_large_vocab_matches_a_full_sort(shape: str) -> None:
    """Vocabularies over 1024 tokens take the partial-sort path; with a flat distribution
    it falls back to sorting everything. Either way the set is a full sort's."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(5000).astype(np.float32)
    if shape == "peaked":
        x[rng.choice(5000, 30, replace=False)] += 9.0
    elif shape == "ties":
        x = np.round(x * 2).astype(np.float32)  # ~15 distinct values, thousands of ties
    x[:5] = NEG_INF
    for p in (0.05, 0.5, 0.9, 0.99):
        assert kept(top_p_filter(x, p)) == top_p_reference(x, p), p


def test_top_p_counts_only_what_is_left() -> None:
    x = top_k_filter(logits_of(P), 2)  # {1: 0.4, 3: 0.25} -> renormalized 0.615, 0.385
    assert kept(top_p_filter(x, 0.6)) == {1}
    assert kept(top_p_filter(x, 0.62)) == {1, 3}


@pytest.mark.parametrize(
    ("min_p", "expected"),
    [(0.0, {0, 1, 2, 3, 4}), (0.1, {0, 1, 2, 3, 4}), (0.125, {0, 1, 2, 3, 4}),
     (0.13, {1, 2, 3, 4}), (0.25, {1, 2, 3, 4}), (0.26, {1, 3, 4}), (0.5, {1, 3, 4}),
     (0.51, {1, 3}), (0.625, {1, 3}), (0.63, {1}), (1.0, {1})],
)
def test_min_p(min_p: float, expected: set[int]) -> None:
    # p / p_max: 0 -> 0.125, 2 -> 0.25, 4 -> 0.5, 3 -> 0.625; boundaries are inclusive.
    assert kept(min_p_filter(logits_of(P), min_p)) == expected


def test_temperature_and_softmax() -> None:
    x = np.array([1.0, -2.0, 0.5, NEG_INF], dtype=np.float32)
    t = apply_temperature(x, 0.5)
    assert t.dtype == np.float32
    np.testing.assert_array_equal(t, [2.0, -4.0, 1.0, NEG_INF])
    p = softmax(x)
    assert p.dtype == np.float64
    np.testing.assert_allclose(p[:3], softmax_ref(x[:3]), rtol=1e-12)
    assert p[3] == 0.0
    np.testing.assert_allclose(softmax(logits_of(P)), P, rtol=1e-6)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(InvalidRequestError, match="temperature"):
            apply_temperature(x, bad)


def test_penalties_match_hand_computation() -> None:
    x = np.array([2.0, -1.0, 0.5, 3.0, -0.5, 1.0], dtype=np.float32)
    history = [5, 0, 1, 0, 3, 0, 2]  # counts in the last 5: 0 x2, 1, 3, 2
    out = apply_penalties(x, history, repetition_penalty=1.25, presence_penalty=0.5,
                          frequency_penalty=0.1, last_n=5)
    expected = x.astype(np.float64).copy()
    for tok, count in {0: 2, 1: 1, 3: 1, 2: 1}.items():
        v = expected[tok]
        v = v / 1.25 if v > 0 else v * 1.25
        expected[tok] = v - count * 0.1 - 0.5
    # token 5 is outside the window; token 4 never occurred
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert out[4] == x[4] and out[5] == x[5]

    whole = apply_penalties(x, history, frequency_penalty=1.0, last_n=-1)
    np.testing.assert_allclose(whole, x - np.bincount(history, minlength=6), rtol=1e-6)
    np.testing.assert_array_equal(
        apply_penalties(x, history, repetition_penalty=2.0, last_n=0), x)
    np.testing.assert_array_equal(apply_penalties(x, [], repetition_penalty=2.0), x)
    # a window longer than the history is the whole history
    np.testing.assert_array_equal(apply_penalties(x, history, presence_penalty=1.0, last_n=100),
                                  x - (np.bincount(history, minlength=6) > 0))


def test_penalties_in_the_chain_use_the_window() -> None:
    x = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    s = Sampling(repetition_penalty=1.5, penalty_last_n=2)
    assert sample(x, s, history=[0, 2, 2]) == 0  # 0 is outside the window
    assert sample(x, s, history=[2, 0]) == 1  # 2 / 1.5 < 1.9
    assert sample(x, s.replace(penalty_last_n=0), history=[0, 0]) == 0
    with pytest.raises(TokenOutOfRangeError, match="history"):
        sample(x, s, history=[3])
    with pytest.raises(TokenOutOfRangeError, match="history"):
        sample(x, s, history=[-1])


def test_logit_bias() -> None:
    x = np.array([1.0, 0.0, -1.0], dtype=np.float32)
    out = apply_logit_bias(x, {1: 2.5, 2: NEG_INF})
    np.testing.assert_array_equal(out, [1.0, 2.5, NEG_INF])
    s = Sampling(temperature=5.0, logit_bias={0: NEG_INF}, seed=0)
    sampler = Sampler(s)
    draws = {sampler(x) for _ in range(300)}
    assert draws == {1, 2}
    with pytest.raises(TokenOutOfRangeError, match="logit_bias: token id 3"):
        apply_logit_bias(x, {3: 1.0})


def test_filtered_tokens_are_never_drawn() -> None:
    sampler = Sampler(Sampling(temperature=3.0, top_k=3, seed=5))
    assert {sampler(BASE) for _ in range(500)} == {0, 1, 2}
    sampler = Sampler(Sampling(temperature=3.0, min_p=0.3, seed=5))
    allowed = {int(i) for i in np.flatnonzero(softmax_ref(BASE) >= 0.3 * softmax_ref(BASE)[0])}
    assert {sampler(BASE) for _ in range(500)} == allowed


def test_draw_never_returns_a_zero_probability_token() -> None:
    p = np.array([0.0, 0.3, 0.0, 0.7, 0.0])
    assert draw(p, 0.0) == 1
    assert draw(p, 0.2999) == 1
    assert draw(p, 0.3) == 3
    assert draw(p, np.nextafter(1.0, 0.0)) == 3
    # probabilities that do not sum to 1 (rounding) still never reach a trailing zero
    assert draw(np.array([0.1, 0.1, 0.0]), np.nextafter(1.0, 0.0)) == 1
    with pytest.raises(InvalidRequestError):
        draw(np.zeros(3), 0.5)
    with pytest.raises(InvalidRequestError):
        draw(p, 1.0)


def test_every_logit_banned_is_a_clear_error() -> None:
    x = np.array([1.0, 2.0], dtype=np.float32)
    for s in (Sampling(), Sampling(temperature=1.0)):
        with pytest.raises(InvalidRequestError, match="every logit is -inf"):
            sample(x, s.replace(logit_bias={0: NEG_INF, 1: NEG_INF}))
        with pytest.raises(InvalidRequestError, match="every logit is -inf"):
            sample(np.full(4, NEG_INF, dtype=np.float32), s)
    with pytest.raises(InvalidRequestError, match="every logit is -inf"):
        softmax(np.full(2, NEG_INF))


@pytest.mark.parametrize(
    ("logits", "match"),
    [(np.array([1.0, np.nan], dtype=np.float32), "NaN"),
     (np.array([1.0, np.inf], dtype=np.float32), r"\+inf"),
     (np.zeros((2, 3), dtype=np.float32), "1-D"),
     (np.zeros(0, dtype=np.float32), "1-D"),
     (np.array([1, 2]), "floating-point")],
)
def test_bad_logits(logits: npt.NDArray[Any], match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        sample(logits, Sampling(temperature=1.0))


def test_inputs_are_never_mutated() -> None:
    x = BASE.copy()
    frozen = x.copy()
    x.setflags(write=False)  # any in-place write would raise
    history = np.array([0, 1, 1, 4])
    full = Sampling(temperature=0.9, top_k=6, top_p=0.8, min_p=0.05, repetition_penalty=1.3,
                    presence_penalty=0.2, frequency_penalty=0.1, logit_bias={2: 1.0}, seed=1)
    for fn in (lambda: apply_logit_bias(x, {0: 1.0}),
               lambda: apply_penalties(x, history, repetition_penalty=2.0),
               lambda: apply_temperature(x, 0.5),
               lambda: top_k_filter(x, 3), lambda: top_k_filter(x, 0),
               lambda: top_p_filter(x, 0.5), lambda: top_p_filter(x, 1.0),
               lambda: min_p_filter(x, 0.2), lambda: min_p_filter(x, 0.0),
               lambda: softmax(x), lambda: sample(x, full, history),
               lambda: sample(x, history=history),
               lambda: probabilities(x, full, history)):
        out = fn()
        if isinstance(out, np.ndarray):
            assert not np.shares_memory(out, x)
            out[...] = 0  # results are writable copies
    np.testing.assert_array_equal(x, frozen)
    np.testing.assert_array_equal(history, [0, 1, 1, 4])


def test_dtype_is_preserved() -> None:
    for dt in (np.float16, np.float32, np.float64):
        x: npt.NDArray[np.floating[Any]] = BASE.astype(dt)
        for out in (top_k_filter(x, 2), top_p_filter(x, 0.5), min_p_filter(x, 0.5),
                    apply_logit_bias(x, {1: 1.0}), apply_penalties(x, [1], presence_penalty=1),
                    apply_temperature(x, 2.0)):
            assert out.dtype == dt
        assert sample(x, Sampling(temperature=1.0, top_k=3, seed=0)) in (0, 1, 2)


def test_large_vocab_is_fast_enough() -> None:
    """A realistic vocabulary with every stage on runs (correctness smoke test, no timing)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(151_936).astype(np.float32) * 3
    s = Sampling(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1,
                 seed=0)
    sampler = Sampler(s)
    top40 = set(np.argsort(-x)[:40].tolist())
    history = list(range(100))
    for _ in range(20):
        assert sampler(x, history) in top40


# --- the Sampling settings ----------------------------------------------------------------


def test_sampling_defaults_and_immutability() -> None:
    s = Sampling()
    assert (s.temperature, s.top_k, s.top_p, s.min_p) == (0.0, 0, 1.0, 0.0)
    assert (s.repetition_penalty, s.presence_penalty, s.frequency_penalty) == (1.0, 0.0, 0.0)
    assert (s.penalty_last_n, dict(s.logit_bias), s.seed) == (64, {}, None)
    assert s.greedy and not s.penalties_active
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.temperature = 1.0  # type: ignore[misc]
    bias = {5: 1.0}
    t = Sampling(logit_bias=bias, temperature=1)
    bias[6] = 2.0
    assert dict(t.logit_bias) == {5: 1.0}
    assert isinstance(t.logit_bias, LogitBias)
    assert isinstance(t.temperature, float)
    with pytest.raises(TypeError):
        t.logit_bias[7] = 1.0  # type: ignore[index]
    assert hash(t) == hash(Sampling(temperature=1.0, logit_bias={5: 1}))
    assert t == Sampling(temperature=1.0, logit_bias={5: 1.0})
    assert t.logit_bias == {5: 1.0}


def test_replace_from_dict_to_dict() -> None:
    s = Sampling(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                 presence_penalty=0.3, frequency_penalty=-0.2, penalty_last_n=-1,
                 logit_bias={3: -2.0, 1: NEG_INF}, seed=11)
    assert Sampling.from_dict(s.to_dict()) == s
    assert Sampling.from_dict(json.loads(json.dumps(s.to_dict()))) == s  # "3": ... keys
    assert s.replace(top_k=5).top_k == 5 and s.replace(top_k=5).top_p == 0.9
    assert Sampling.from_dict({"temperature": 1}) == Sampling(temperature=1.0)
    with pytest.raises(ConfigError,
                       match=r"unknown setting 'top_a' \(did you mean 'top_p'\?\); allowed: temp"):
        s.replace(top_a=1)
    with pytest.raises(ConfigError, match="unknown setting 'temp'"):
        Sampling.from_dict({"temp": 1.0})
    with pytest.raises(ConfigError, match="expected a mapping"):
        Sampling.from_dict([("temperature", 1.0)])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Sampling\.top_p"):
        s.replace(top_p=0.0)
    with pytest.raises(ConfigError, match=r"Sampling\.logit_bias"):
        Sampling(logit_bias={"3": 1.0})  # type: ignore[dict-item]  # strings only from dicts


@pytest.mark.parametrize(
    ("kwargs", "field", "hint"),
    [
        ({"temperature": -0.1}, "Sampling.temperature", ">= 0"),
        ({"temperature": math.nan}, "Sampling.temperature", ">= 0"),
        ({"temperature": math.inf}, "Sampling.temperature", "finite"),
        ({"temperature": "0.7"}, "Sampling.temperature", "expected a number"),
        ({"temperature": True}, "Sampling.temperature", "expected a number"),
        ({"top_k": -1}, "Sampling.top_k", "0..2147483647"),
        ({"top_k": 4.0}, "Sampling.top_k", "integer"),
        ({"top_k": True}, "Sampling.top_k", "integer"),
        ({"top_p": 0.0}, "Sampling.top_p", "(0, 1]"),
        ({"top_p": 1.01}, "Sampling.top_p", "(0, 1]"),
        ({"top_p": math.nan}, "Sampling.top_p", "(0, 1]"),
        ({"min_p": -0.01}, "Sampling.min_p", "[0, 1]"),
        ({"min_p": 1.5}, "Sampling.min_p", "[0, 1]"),
        ({"repetition_penalty": 0.0}, "Sampling.repetition_penalty", "[0.001, 1000]"),
        ({"repetition_penalty": -1.0}, "Sampling.repetition_penalty", "[0.001, 1000]"),
        ({"repetition_penalty": 1e-308}, "Sampling.repetition_penalty", "[0.001, 1000]"),
        ({"presence_penalty": math.inf}, "Sampling.presence_penalty", "finite"),
        ({"frequency_penalty": math.nan}, "Sampling.frequency_penalty", "finite"),
        ({"frequency_penalty": None}, "Sampling.frequency_penalty", "expected a number"),
        ({"penalty_last_n": -2}, "Sampling.penalty_last_n", "-1..2147483647"),
        ({"penalty_last_n": 1.5}, "Sampling.penalty_last_n", "integer"),
        ({"logit_bias": [(1, 2.0)]}, "Sampling.logit_bias", "mapping"),
        ({"logit_bias": {"a": 1.0}}, "Sampling.logit_bias", "integer token ids"),
        ({"logit_bias": {1.0: 1.0}}, "Sampling.logit_bias", "integer token ids"),
        ({"logit_bias": {True: 1.0}}, "Sampling.logit_bias", "integer token ids"),
        ({"logit_bias": {-1: 1.0}}, "Sampling.logit_bias key", "0..2147483647"),
        ({"logit_bias": {1: math.nan}}, "Sampling.logit_bias[1]", "-inf to ban"),
        ({"logit_bias": {1: math.inf}}, "Sampling.logit_bias[1]", "-inf to ban"),
        ({"logit_bias": {1: "2"}}, "Sampling.logit_bias[1]", "expected a number"),
        ({"seed": -1}, "Sampling.seed", "out of range"),
        ({"seed": 1.0}, "Sampling.seed", "integer"),
    ],
)
def test_sampling_validation(kwargs: dict[str, Any], field: str, hint: str) -> None:
    with pytest.raises(ConfigError) as err:
        Sampling(**kwargs)
    assert field in str(err.value)
    assert hint in str(err.value)
    assert isinstance(err.value, ValueError)


def test_numpy_scalars_are_accepted() -> None:
    s = Sampling(temperature=np.float32(0.5), top_k=np.int64(3),  # type: ignore[arg-type]
                 logit_bias={np.int32(2): 1.0}, seed=np.uint64(5))  # type: ignore[dict-item,arg-type]
    assert s.top_k == 3 and type(s.top_k) is int and type(s.seed) is int
    assert list(s.logit_bias) == [2] and type(next(iter(s.logit_bias))) is int


# --- stop conditions ----------------------------------------------------------------------


def run(checker: StopChecker, pieces: list[str], ids: list[int] | None = None
        ) -> tuple[list[str], str | None]:
    """Feeds pieces until done; returns what was emitted per step and the finish reason."""
    out = []
    for i, piece in enumerate(pieces):
        status = checker.feed(ids[i] if ids else 100 + i, piece)
        out.append(status.text)
        if status.done:
            return out, status.finish_reason
    out.append(checker.flush())
    return out, checker.finish_reason


def test_stop_string_split_across_tokens_is_held_and_not_emitted() -> None:
    c = StopChecker(["</end>"])
    out, reason = run(c, ["Hello", " wor", "ld<", "/e", "nd", "> trailing"])
    assert out == ["Hello", " wor", "ld", "", "", ""]
    assert reason == "stop" and c.stop_string == "</end>"
    assert c.n_tokens == 6


def test_stop_string_inside_one_token() -> None:
    out, reason = run(StopChecker("###"), ["a", "b###c", "never"])
    assert out == ["a", "b"] and reason == "stop"


def test_false_alarm_is_released() -> None:
    c = StopChecker(["</end>"])
    assert c.feed(1, "x </e").text == "x "
    assert c.held == "</e"
    assert c.feed(2, "x").text == "</ex"
    assert c.held == ""
    assert not c.done


def test_overlapping_prefixes() -> None:
    # "aab" with stop "ab": the first "a" can be released as soon as the second arrives.
    c = StopChecker(["ab"])
    assert c.feed(1, "a").text == ""
    assert c.feed(2, "a").text == "a"
    st = c.feed(3, "b")
    assert (st.text, st.finish_reason, st.stop_string) == ("", "stop", "ab")


def test_earliest_stop_string_wins() -> None:
    c = StopChecker(["world", "o", "lo w"])
    st = c.feed(1, "hello world")
    assert (st.text, st.stop_string) == ("hel", "lo w")
    c = StopChecker(["ab", "abc"])  # same start: the longest
    assert c.feed(1, "xabcd").stop_string == "abc"


def test_eos() -> None:
    c = StopChecker(["STOP"], eos_ids={2, 7}, max_tokens=10)
    assert c.feed(5, "text S").text == "text "
    st = c.feed(7, "</s>")
    assert (st.text, st.finish_reason, st.stop_string) == ("S", "stop", None)
    assert c.done
    with pytest.raises(InvalidRequestError, match="already finished"):
        c.feed(1, "x")
    c.reset()
    assert not c.done and c.n_tokens == 0 and c.held == ""
    assert StopChecker(eos_ids=3).feed(3, "").finish_reason == "stop"


def test_max_tokens() -> None:
    c = StopChecker(["STOP"], max_tokens=3)
    out, reason = run(c, ["a", "b", "c ST", "OP"])
    assert out == ["a", "b", "c ST"] and reason == "length"  # held text released at the end
    # a stop string completed on the last allowed token is a stop, not a length
    out, reason = run(StopChecker(["STOP"], max_tokens=2), ["a ST", "OP"])
    assert out == ["a ", ""] and reason == "stop"
    out, reason = run(StopChecker(eos_ids=[0], max_tokens=2), ["a", "<eos>"], ids=[5, 0])
    assert reason == "stop" and out == ["a", ""]
    z = StopChecker(max_tokens=0)
    assert z.done and z.finish_reason == "length"
    unlimited = StopChecker()
    assert all(not unlimited.feed(i, "x").done for i in range(1000))


def test_flush_returns_held_text() -> None:
    c = StopChecker(["\n\nUser:"])
    assert c.feed(1, "answer\n").text == "answer"
    assert c.feed(2, "\nUs").text == ""
    assert c.flush() == "\n\nUs"
    assert c.held == ""


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"stop_strings": [""]}, "stop_strings"), ({"stop_strings": [3]}, "stop_strings"),
     ({"eos_ids": [-1]}, "eos_ids"), ({"eos_ids": ["2"]}, "eos_ids"),
     ({"eos_ids": [True]}, "eos_ids"), ({"max_tokens": -1}, "max_tokens"),
     ({"max_tokens": 1.0}, "max_tokens")],
)
def test_stop_checker_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StopChecker(**kwargs)


def test_stop_checker_against_a_reference_on_random_splits() -> None:
    """Random texts over a tiny alphabet, split at random: the emitted text is exactly the
    text before the first stop string, every emission is a prefix of it, and nothing that
    cannot start a stop string is held back."""
    rnd = random.Random(0)
    stops = ["aba", "bb", "cab"]
    for _ in range(400):
        text = "".join(rnd.choice("abcd") for _ in range(rnd.randint(0, 25)))
        cuts = sorted(rnd.sample(range(1, len(text)), rnd.randint(0, max(0, len(text) - 1))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        hits = [(text.find(s), s) for s in stops if s in text]
        first = min(hits, key=lambda h: (h[0], -len(h[1])), default=None)
        c = StopChecker(stops)
        emitted = ""
        seen = ""
        for i, piece in enumerate(pieces):
            st = c.feed(i, piece)
            seen += piece
            emitted += st.text
            if st.done:
                break
            # all is emitted except the longest suffix that could still begin a stop string
            assert emitted + c.held == seen
            could_begin = [n for n in range(1, len(seen) + 1)
                           if any(len(s) > n and s.startswith(seen[-n:]) for s in stops)]
            assert len(c.held) == max(could_begin, default=0)
        if first is None:
            assert not c.done
            emitted += c.flush()
            assert emitted == text
        else:
            assert c.done and c.finish_reason == "stop"
            assert emitted == text[: first[0]] and c.stop_string == first[1]


def test_function_arguments_are_checked() -> None:
    x = BASE.copy()
    with pytest.raises(InvalidRequestError, match="repetition_penalty"):
        apply_penalties(x, [1], repetition_penalty=0.0)
    with pytest.raises(InvalidRequestError, match="last_n"):
        apply_penalties(x, [1], presence_penalty=1.0, last_n=-2)
    with pytest.raises(InvalidRequestError, match="history"):
        apply_penalties(x, [[1, 2]], presence_penalty=1.0)
    with pytest.raises(InvalidRequestError, match="top_p"):
        top_p_filter(x, 0.0)
    with pytest.raises(InvalidRequestError, match="min_p"):
        min_p_filter(x, 1.5)
    with pytest.raises(InvalidRequestError, match="Sampler"):
        Sampler({"temperature": 1.0})  # type: ignore[arg-type]
