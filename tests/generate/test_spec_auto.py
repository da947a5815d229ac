"""The "auto" cost rule (colibri.speculative.auto) on synthetic cost and acceptance
sequences, no clock and no model.

The oracle is the cost model itself: for a verify cost curve ``c_k`` (in one-token
forwards) and a drafter whose every draft position is right with probability ``a``, the
best fixed policy yields ``max(1, max_k E_k(a) / c_k)`` tokens per one-token forward,
``E_k(a) = 1 + a + ... + a^k``. A simulated decode (noisy timings, occasional spikes of
load) checks that auto reaches close to that at both ends (an oracle drafter: a = 1; a
random one: a = 0) and on both sides of the crossover, and that it drafts or not
accordingly."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from colibri.speculative.auto import PRIOR_C0, PRIOR_RHO, AutoSwitch, CostModel

# Measured verify cost curves (time of a forward of k drafts over a one-token forward,
# docs/benchmarks-log.md): the DeepSeek-V3-shaped preset resident and streamed (k = 1..4),
# SmolLM2-135M Q4_1 with every position's logits (k = 1..8), and a linear one.
MOE_RESIDENT = (2.42, 2.72, 3.81, 4.50)
MOE_STREAMED = (1.75, 2.73, 3.11, 3.80)
SMOLLM2 = (2.2, 2.57, 3.01, 3.5, 3.78, 4.19, 4.66, 5.19)
CHEAP = (1.3, 1.45, 1.6, 1.75)  # a memory-bound model: drafts nearly free


def expected(a: float, k: int) -> float:
    return sum(a ** j for j in range(k + 1))


def best_fixed(curve: Sequence[float], a: float) -> float:
    """Tokens per one-token forward of the best fixed draft length (1.0: never draft)."""
    return max([1.0] + [expected(a, k) / c for k, c in enumerate(curve, start=1)])


def simulate(curve: Sequence[float], a: float, tokens: int = 300, seed: int = 0,
             noise: float = 0.1, spikes: float = 0.05) -> tuple[float, int, int]:
    """A decode of `tokens` with auto: (tokens per one-token forward's time, verifies,
    tokens the verifies produced). Each forward's time is its curve cost times lognormal
    noise, and one in 1/spikes is 3x (a burst of load)."""
    rng = random.Random(seed)
    auto = AutoSwitch(max_draft=len(curve))
    truth = [rng.randrange(1000) for _ in range(tokens + len(curve) + 2)]
    history = truth[:1]
    elapsed = 0.0
    verifies = from_verifies = 0

    def timing(cost: float) -> float:
        t = cost * math.exp(rng.gauss(0.0, noise))
        return 3.0 * t if rng.random() < spikes else t

    while len(history) < tokens:
        nxt = len(history)
        proposal = []  # right with probability a per position, then anything
        for j in range(len(curve)):
            right = rng.random() < a
            proposal.append(truth[nxt + j] if right else -1 - j)
        k = auto.choose(history, proposal)
        if k == 0:
            t = timing(1.0)
            auto.plain(t)
            history.append(truth[nxt])
        else:
            accepted = 0
            while accepted < k and proposal[accepted] == truth[nxt + accepted]:
                accepted += 1
            t = timing(curve[k - 1])
            auto.verified(k, t)
            auto.observe(accepted, k)
            history.extend(truth[nxt:nxt + accepted + 1])
            verifies += 1
            from_verifies += accepted + 1
        elapsed += t
    produced = len(history) - 1
    return produced / elapsed, verifies, from_verifies


def mean_rate(curve: Sequence[float], a: float, seeds: int = 5) -> tuple[float, float]:
    """Median over seeds of auto's rate over plain decoding's (the same noise and spikes)
    and the mean share of the tokens that came from verifies."""
    rates, shares = [], []
    for seed in range(seeds):
        rate, _, from_verifies = simulate(curve, a, seed=seed)
        base, _, _ = simulate(curve, 0.0, seed=seed)  # never drafts (checked below)
        rates.append(rate / base)
        shares.append(from_verifies / 300)
    rates.sort()
    return rates[len(rates) // 2], sum(shares) / len(shares)


# --- the cost model -----------------------------------------------------------------------


def test_cost_model_prior_fit_and_clipping() -> None:
    m = CostModel()
    assert m.cost(0) == 1.0 and m.cost(3) == pytest.approx(1 + PRIOR_C0 + 3 * PRIOR_RHO)
    # A curve with a fixed part, seen at several k, is recovered (noise-free).
    for _ in range(6):
        for k in (1, 2, 4, 8):
            m.observe(k, 1.0 + 0.9 + 0.45 * k)
    assert m.c0 == pytest.approx(0.9, abs=0.05) and m.rho == pytest.approx(0.45, abs=0.02)
    # One sample 30x off moves the fit by a bounded amount (clipped to 3x the prediction).
    c8 = m.cost(8)
    m.observe(8, 30 * c8)
    assert m.cost(8) < 1.6 * c8
    # Seen at one k only: the prediction there is the measurement; the prior splits it.
    m2 = CostModel()
    for _ in range(5):
        m2.observe(4, 4.5)
    assert m2.cost(4) == pytest.approx(4.5, rel=0.02)
    assert m2.c0 >= 0.0 and m2.rho > 0.0
    # A cost below any fixed part: c0 floors at 0, rho stays positive.
    m3 = CostModel()
    for _ in range(10):
        m3.observe(1, 1.05)
        m3.observe(4, 1.2)
    assert m3.c0 >= 0.0 and m3.rho >= 0.01 and m3.cost(4) == pytest.approx(1.2, abs=0.1)


def test_cost_relaxes_to_the_prior_while_off() -> None:
    m = CostModel()
    for _ in range(10):
        m.observe(4, 9.0)
    assert m.cost(4) == pytest.approx(9.0, rel=0.02)
    for _ in range(20):
        m.relax()
    assert m.cost(4) > 8.5  # still the measurement after 20 steps off
    for _ in range(100):
        m.relax()
    assert m.optimistic_cost(4) < 7.0  # probed again after ~100-150 steps
    for _ in range(300):
        m.relax()
    assert m.cost(4) == pytest.approx(1 + PRIOR_C0 + 4 * PRIOR_RHO, rel=0.1)


def test_acceptance_one_reads_close_to_one() -> None:
    a = AutoSwitch(max_draft=4)
    assert a.alpha(0) == pytest.approx(0.25)
    for _ in range(30):
        a.observe(4, 4)
    assert all(a.alpha(j) > 0.95 for j in range(4))  # the prior decays with the counts
    for _ in range(60):  # a window of ~20 proposals
        a.observe(0, 4)
    assert a.alpha(0) < 0.05


# --- both ends and the crossover, on a simulated decode ------------------------------------


@pytest.mark.parametrize("curve", [MOE_RESIDENT, MOE_STREAMED, SMOLLM2, CHEAP],
                         ids=["moe-resident", "moe-streamed", "smollm2", "cheap"])
def test_random_drafter_never_drafts(curve: Sequence[float]) -> None:
    for seed in range(5):
        _, verifies, _ = simulate(curve, 0.0, seed=seed)
        assert verifies == 0  # acceptance is measured in the shadow: nothing to pay


@pytest.mark.parametrize("curve", [MOE_RESIDENT, MOE_STREAMED, SMOLLM2, CHEAP],
                         ids=["moe-resident", "moe-streamed", "smollm2", "cheap"])
def test_oracle_drafter_drafts_when_a_length_pays(curve: Sequence[float]) -> None:
    best = best_fixed(curve, 1.0)
    assert best > 1.05  # at acceptance 1 every curve here has a length that pays
    rate, share = mean_rate(curve, 1.0)
    assert share > 0.85  # drafting nearly all the time (after a few shadow-scored steps)
    # Close to the best fixed length, and above plain decoding.
    assert rate > 1.0 and rate > 1.0 + 0.7 * (best - 1.0), (rate, best)


@pytest.mark.parametrize("a", [0.3, 0.5, 0.7, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("curve", [MOE_RESIDENT, SMOLLM2, CHEAP],
                         ids=["moe-resident", "smollm2", "cheap"])
def test_the_crossover(curve: Sequence[float], a: float) -> None:
    """Where no length pays auto stays (nearly) off and loses little; where one pays well
    it drafts and gains."""
    best = best_fixed(curve, a)
    rate, share = mean_rate(curve, a)
    assert rate > 0.97, (best, rate, share)  # never loses more than the probes cost
    top = max(expected(a, k) / c for k, c in enumerate(curve, start=1))
    if top < 0.9:
        assert share < 0.15, (best, rate, share)  # clearly off: hardly any verify
    if best > 1.15:  # clearly on: most tokens from verifies, most of the gain
        assert share > 0.5 and rate > 1.0 + 0.4 * (best - 1.0), (best, rate, share)


# --- acceptance per context (the lookup's match length) ------------------------------------

SMOLLM2_NOW = (1.46, 2.01, 2.27, 3.11, 3.49, 4.08, 4.59, 5.31)  # AVX-512 VM, benchmarks-log.md


def simulate_contexts(use_context: bool, tokens: int = 400, seed: int = 0,
                      curve: Sequence[float] = SMOLLM2_NOW) -> tuple[float, dict[int, list[int]]]:
    """A decode whose proposals come from two kinds of match, alternating in runs: context
    3 (every draft right with probability 0.9) and context 1 (0.1). Returns tokens per
    one-token forward's time and, per context, [proposals, proposals verified]."""
    rng = random.Random(seed)
    auto = AutoSwitch(max_draft=len(curve))
    truth = [rng.randrange(1000) for _ in range(tokens + len(curve) + 2)]
    history = truth[:1]
    elapsed = 0.0
    seen: dict[int, list[int]] = {1: [0, 0], 3: [0, 0]}
    while len(history) < tokens:
        nxt = len(history)
        context = 3 if (nxt // 12) % 2 == 0 else 1  # runs of 12 positions of each kind
        a = 0.9 if context == 3 else 0.1
        proposal = [truth[nxt + j] if rng.random() < a else -1 - j for j in range(len(curve))]
        k = auto.choose(history, proposal, context if use_context else 0)
        seen[context][0] += 1
        if k == 0:
            auto.plain(1.0)
            history.append(truth[nxt])
            elapsed += 1.0
            continue
        seen[context][1] += 1
        accepted = 0
        while accepted < k and proposal[accepted] == truth[nxt + accepted]:
            accepted += 1
        auto.verified(k, curve[k - 1])
        auto.observe(accepted, k, context if use_context else 0)
        history.extend(truth[nxt:nxt + accepted + 1])
        elapsed += curve[k - 1]
    return (len(history) - 1) / elapsed, seen


def test_context_acceptance_drafts_the_good_matches_only() -> None:
    """With each proposal's context (match length), auto verifies most context-3 proposals
    and few context-1 ones, gets within 10 % of the best per-context policy, and beats the
    pooled rule on the same decode. The oracle is the cost curve: context 3 alone at
    a = 0.9 pays (best fixed length ~1.5 tokens per forward's time), context 1 at a = 0.1
    never does (E_k / c_k < 1 for every k); half the positions of each, the best policy
    yields 2 / (1 / 1.5 + 1) ~ 1.2 tokens per forward's time."""
    good, bad = best_fixed(SMOLLM2_NOW, 0.9), best_fixed(SMOLLM2_NOW, 0.1)
    assert good > 1.4 and bad == 1.0
    oracle = 2.0 / (1.0 / good + 1.0 / bad)
    for seed in range(3):
        rate, seen = simulate_contexts(True, seed=seed)
        pooled, _ = simulate_contexts(False, seed=seed)
        assert seen[3][1] > 0.8 * seen[3][0], seen
        assert seen[1][1] < 0.1 * seen[1][0], seen
        assert 0.9 * oracle < rate <= oracle * 1.02, (rate, oracle)
        assert rate > 1.2 * pooled, (rate, pooled)


def test_context_zero_is_the_pooled_rule() -> None:
    """Context 0 (a drafter without match lengths, e.g. MTP) reads the pooled figures: the
    same decisions as before contexts existed. A context never observed reads its bucket's
    prior (MATCH_PRIOR), whatever the pooled figures say."""
    from colibri.speculative.auto import MATCH_PRIOR, _bucket
    a, b = AutoSwitch(4), AutoSwitch(4)
    for _ in range(30):
        a.observe(4, 4)
        b.observe(4, 4, context=2)
    assert [a.alpha(j) for j in range(4)] == [b.alpha(j) for j in range(4)]
    assert a.alpha(0) > 0.95  # the pooled figures: always right
    assert a.alpha(0, context=3) == pytest.approx(MATCH_PRIOR[_bucket(3) - 1])  # unseen
    assert a.alpha(0, context=20) == pytest.approx(MATCH_PRIOR[-1])
    c = AutoSwitch(4)  # context 2 always right, context 1 never: each reads its own
    for _ in range(30):
        c.observe(4, 4, context=2)
        c.observe(0, 4, context=1)
    assert c.alpha(0, 2) > 0.85 and c.alpha(0, 1) < 0.15 and 0.4 < c.alpha(0) < 0.6


# --- acceptance per match extent (the lookup's suffix length) ------------------------------


def test_a_long_match_drafts_long_before_any_acceptance_is_seen() -> None:
    """Each match-length bucket starts from its own prior (MATCH_PRIOR): at the cost a
    verify has today on SmolLM2 (1 + 0.22 k), a fresh switch drafts a proposal whose
    source matched 10 tokens all 8 long, and one found from a single token not at all,
    before a single acceptance has been observed. (Buckets shrunk toward the pooled prior,
    the rule until session 28, drafted neither: a long copy was drafted a few tokens at a
    time until its bucket had filled.)"""
    auto = AutoSwitch(max_draft=8)
    auto.plain(1.0)
    for _ in range(10):
        auto.verified(4, 1.0 + 0.22 * 4)
        auto.verified(8, 1.0 + 0.22 * 8)
    assert auto.best_k(8, context=10) == 8
    assert auto.best_k(8, context=1) == 0
    assert auto.best_k(8, context=0) == 0  # no context: the pooled prior (1/4)


def test_a_draft_continues_the_match_of_its_position() -> None:
    """The draft at position j of a proposal whose source matched L tokens continues a
    match of L + j: it reads that length's bucket. Proposals after 1-token matches always
    miss their first draft; proposals after 4-token matches are always right: a 1-token
    match's first draft reads low, but its 4th draft (a match of 4 by then) reads high,
    and auto verifies nothing after a 1-token match and all 8 after a 4-token one."""
    from colibri.speculative.auto import _bucket
    auto = AutoSwitch(max_draft=8)
    auto.plain(1.0)
    for _ in range(40):
        auto.observe(0, 8, context=1)
        auto.observe(8, 8, context=4)
    assert auto.alpha(0, context=1) < 0.2
    assert _bucket(1 + 3) == _bucket(4) and auto.alpha(3, context=1) > 0.8
    assert auto.alpha(0, context=4) > 0.9 and auto.alpha(7, context=4) > 0.9
    assert auto.best_k(8, context=1) == 0
    for _ in range(10):  # the measured cost: SmolLM2's curve (a verify of 8: 5.3 forwards)
        auto.verified(8, SMOLLM2_NOW[7])
    assert auto.best_k(8, context=4) == 8
    assert auto.alphas(8, context=4) == [auto.alpha(j, context=4) for j in range(8)]


def test_acceptance_is_monotone_in_the_match_length() -> None:
    """A bucket seen a few times with misses does not read below a shorter match's bucket
    seen often with hits (the figures are pooled across such violations); without
    MONOTONE it would."""
    import colibri.speculative.auto as auto_mod
    auto = AutoSwitch(max_draft=4)
    for _ in range(30):
        auto.observe(1, 1, context=4)  # matches of 4-7: right
    for _ in range(2):
        auto.observe(0, 1, context=8)  # matches of 8-15: two misses
    assert auto.alpha(0, context=8) >= auto.alpha(0, context=4) - 1e-12
    assert auto.alpha(0, context=4) > 0.7  # the misses only dent the pooled figure
    try:
        auto_mod.MONOTONE = False
        assert auto.alpha(0, context=8) < auto.alpha(0, context=4) - 0.2
    finally:
        auto_mod.MONOTONE = True


def test_disagreeing_successors_are_kept_apart() -> None:
    """Proposals whose n-gram had several successors in the text (agree=False) keep their
    own counts: a run of misses there leaves the agreeing proposals' figure high."""
    auto = AutoSwitch(max_draft=4)
    for _ in range(30):
        auto.observe(4, 4, context=4, agree=True)
        auto.observe(0, 4, context=4, agree=False)
    assert auto.alpha(0, context=4, agree=True) > 0.8
    assert auto.alpha(0, context=4, agree=False) < 0.2


def copy_task(seed: int, length: int = 400, edit_every: int = 25) -> tuple[list[int], list[int]]:
    """A prompt of distinct-ish random tokens and an output that copies it with an edit (a
    replaced token) every ~`edit_every` tokens, then text of its own from 30 tokens (short
    matches everywhere, continuations at random: drafts there are wrong)."""
    rng = random.Random(seed)
    prompt = [rng.randrange(5000) for _ in range(length)]
    out = [p if rng.random() > 1.0 / edit_every else 6000 + rng.randrange(1000)
           for p in prompt[:length // 2]]
    out += [7000 + rng.randrange(30) for _ in range(length // 4)]
    return prompt, out


def test_replay_of_a_copy_task_beats_lookup_and_stays_under_the_bound() -> None:
    """bench_spec_replay.py's replay runs the Speculator itself against an output: on a
    copy with edits followed by text whose short matches mislead, auto gains (> 1.1x at
    SmolLM2's measured costs, where always drafting 8 loses), and stays under the
    hindsight bound; on text that never copies it verifies nothing."""
    import importlib.util
    from pathlib import Path

    from colibri.speculative import SpecConfig, Speculator
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_spec_replay.py"
    spec = importlib.util.spec_from_file_location("bench_spec_replay", path)
    assert spec is not None and spec.loader is not None
    replay_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(replay_mod)
    cost = [1.0, *SMOLLM2_NOW]
    for seed in range(3):
        prompt, out = copy_task(seed)
        auto = replay_mod.replay(prompt, out, len(out), cost,
                                 Speculator(SpecConfig(drafter="auto", max_draft=8)))
        lookup = replay_mod.replay(prompt, out, len(out), cost,
                                   Speculator(SpecConfig(drafter="lookup", max_draft=8)))
        acc = replay_mod.accepted_per_position(prompt, out, 8)
        bound = replay_mod.hindsight_ratio(acc, cost)
        assert auto["ratio"] > 1.1 and lookup["ratio"] < 0.8, (auto, lookup)
        assert auto["ratio"] <= bound + 1e-9, (auto["ratio"], bound)
        rng = random.Random(seed)
        chat = [rng.randrange(50000) for _ in range(200)]  # distinct tokens: no match ever
        plain = replay_mod.replay(prompt, chat, len(chat), cost,
                                  Speculator(SpecConfig(drafter="auto", max_draft=8)))
        assert plain["verifies"] == 0 and plain["ratio"] == 1.0


def test_shadow_proposals_with_a_context_count_as_their_tokens_arrive() -> None:
    """While drafting is off, a proposal made with a match length is scored one position at
    a time (each position is evidence for its own bucket); one without (context 0, the
    pooled figures) only once decided, as a whole: at its first miss or its end."""
    from colibri.speculative.auto import MATCH_PRIOR, MATCH_PRIOR_WEIGHT, _bucket
    auto = AutoSwitch(max_draft=4)  # no one-token cost: every step is off, shadows kept
    history = [1, 2, 3]
    assert auto.choose(history, [10, 11, 12, 13], context=6) == 0
    assert auto.choose([*history, 10], [], context=0) == 0  # one token of the copy arrived
    b6, b8 = _bucket(6), _bucket(8)
    w, p6, p8 = MATCH_PRIOR_WEIGHT, MATCH_PRIOR[b6 - 1], MATCH_PRIOR[b8 - 1]
    assert auto._ctx_tried[True][b6] == pytest.approx(0.95 * w + 1.0)  # length 6 (j = 0)
    assert auto._ctx_right[True][b6] == pytest.approx(0.95 * w * p6 + 1.0)  # right
    assert auto.choose([*history, 10, 11, 99], [], context=0) == 0  # j = 1 right, j = 2 not
    # lengths 6, 7: bucket 4-7, both right
    assert auto._ctx_tried[True][b6] == pytest.approx(0.95 * (0.95 * w + 1.0) + 1.0)
    assert auto._ctx_tried[True][b8] == pytest.approx(0.95 * w + 1.0)  # length 8 (j = 2)
    assert auto._ctx_right[True][b8] == pytest.approx(0.95 * w * p8)  # the miss
    assert not auto._shadows
    pooled = AutoSwitch(max_draft=4)
    pooled.choose(history, [10, 11, 12, 13])
    pooled.choose([*history, 10, 11], [])
    assert pooled._tried == [2.0] * 4 and len(pooled._shadows) == 1  # undecided: not yet
    pooled.choose([*history, 10, 11, 12, 13], [])  # all four right: scored at once
    assert pooled._tried[3] == pytest.approx(0.95 * 2.0 + 1.0) and not pooled._shadows


def test_spec_stats_estimate_the_time_saved_or_lost() -> None:
    """saved_seconds: decode_tokens one-token forwards at the generation's mean one-token
    time, less what the decode spent (verifies, one-token forwards, the drafter)."""
    from colibri.speculative.stats import SpecStats
    s = SpecStats(drafter="auto (lookup)", drafted=12, accepted=9, verify_forwards=3,
                  plain_forwards=10, decode_tokens=22, verify_seconds=0.06,
                  plain_seconds=0.05, draft_seconds=0.001)
    # 22 tokens at 5 ms = 110 ms, spent 60 + 50 + 1 = 111 ms: 1 ms lost
    assert s.saved_seconds == pytest.approx(-0.001)
    assert "1 ms lost" in str(s) and s.to_dict()["saved_seconds"] == s.saved_seconds
    fast = SpecStats(drafter="lookup", drafted=8, accepted=8, verify_forwards=1,
                     plain_forwards=2, decode_tokens=11, verify_seconds=0.02,
                     plain_seconds=0.01)
    assert fast.saved_seconds == pytest.approx(11 * 0.005 - 0.03)  # 25 ms saved
    assert "25 ms saved" in str(fast)
    assert SpecStats(drafter="lookup", drafted=8, accepted=8, verify_forwards=1,
                     plain_forwards=0, decode_tokens=9, verify_seconds=0.02).saved_seconds == 0.0


def _memory_run(memory: object, prompt: list[int], out: list[int],
                cost: Sequence[float]) -> tuple[object, list[int]]:
    """Replays `out` with an auto Speculator on `memory`; its finish() is called. Returns
    the speculator and the draft lengths of its steps."""
    from colibri.speculative import SpecConfig, Speculator
    s = Speculator(SpecConfig(drafter="auto", max_draft=8), memory=memory)  # type: ignore[arg-type]
    lengths: list[int] = []
    choose = s.auto.choose  # type: ignore[union-attr]

    def logged(*a: object) -> int:
        k = choose(*a)  # type: ignore[arg-type]
        lengths.append(k)
        return k
    s.auto.choose = logged  # type: ignore[union-attr, method-assign]
    _replay_module().replay(prompt, out, len(out), cost, s)
    s.finish()
    return s, lengths


def _replay_module() -> object:
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_spec_replay.py"
    spec = importlib.util.spec_from_file_location("bench_spec_replay", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cost_memory_lets_a_later_generation_draft_from_its_first_step() -> None:
    """A generation leaves its measured cost (the time unit and the verify fit) in the
    model's CostMemory; the next one starts from it: it drafts within its first steps (a
    cold one forwards MIN_PLAIN single tokens first), its fit is the first's, and its
    acceptance prior is WARM_PRIOR_RIGHT's. reset() makes the next one cold again."""
    from colibri.speculative import auto as auto_mod
    memory = auto_mod.CostMemory()
    cost = [1.0] + [1.0 + 0.22 * k for k in range(1, 9)]
    prompt, out = copy_task(0)
    first, lengths = _memory_run(memory, prompt, out, cost)
    assert lengths[:auto_mod.MIN_PLAIN] == [0] * auto_mod.MIN_PLAIN  # cold: plain first
    assert "lookup" in memory and "mtp" not in memory
    a1 = first.auto  # type: ignore[attr-defined]
    assert a1.cost.seen > 0 and abs(a1.cost.rho - 0.22) < 0.05, (a1.cost.c0, a1.cost.rho)
    second, lengths2 = _memory_run(memory, prompt, out, cost)
    a2 = second.auto  # type: ignore[attr-defined]
    # The copy drafts before MIN_PLAIN one-token forwards (where the cold one cannot): at
    # its first step with a match long enough to pay at the measured cost.
    assert any(lengths2[:auto_mod.MIN_PLAIN]), lengths2[:5]
    assert a2.warm and not a1.warm
    fresh = auto_mod.AutoSwitch(8, memory)
    assert fresh.plain_s is not None and fresh.cost.rho == a2.cost.rho
    assert fresh.alpha(0) == auto_mod.WARM_PRIOR_RIGHT / auto_mod.PRIOR_TRIED
    # The copy is not shared: the fresh switch's fit moves without touching the memory's.
    fresh.cost.observe(4, 10.0)
    assert auto_mod.AutoSwitch(8, memory).cost.rho == a2.cost.rho
    memory.reset()
    assert "lookup" not in memory
    cold = auto_mod.AutoSwitch(8, memory)
    assert not cold.warm and cold.plain_s is None and cold.cost.seen == 0
    _, lengths3 = _memory_run(memory, prompt, out, cost)
    assert lengths3[:auto_mod.MIN_PLAIN] == [0] * auto_mod.MIN_PLAIN


def test_cost_memory_kept_when_nothing_was_timed_and_under_threads() -> None:
    """A generation that timed no one-token forward leaves the memory as it was; saves
    and loads from several threads always read one whole saved state (the time unit and
    the fit saved together)."""
    import threading

    from colibri.speculative.auto import AutoSwitch, CostMemory, CostModel
    memory = CostMemory()
    memory.save("lookup", [1e-3], CostModel(0.0, 0.2))
    AutoSwitch(8).finish()  # no memory: nothing happens
    a = AutoSwitch(8, memory)
    a._plain = []
    a.finish()
    loaded = memory.load("lookup")
    assert loaded is not None and loaded[0] == [1e-3] and loaded[1].rho == 0.2
    errors: list[str] = []

    def worker(i: int) -> None:
        for j in range(300):
            memory.save("lookup", [float(i + 1)] * (1 + j % 5), CostModel(0.0, float(i + 1)))
            got = memory.load("lookup")
            if got is None or got[1].rho != got[0][0]:
                errors.append(f"{got}")
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
