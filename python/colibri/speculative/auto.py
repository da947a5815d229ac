"""The "auto" rule: draft as many tokens as pay, from measured acceptance and cost.

Two figures decide, both measured during the generation:

- acceptance: for each draft position j, how often the draft token there was right given
  the ones before it were (``alpha[j]``). It is measured on every step, drafting or not:
  while drafting is off the drafter is still asked (it costs microseconds; an MTP draft is
  timed into the step's cost) and each proposal is scored against the tokens the model
  then produces, position by position as the tokens arrive (a copy in progress counts
  at once, not after its whole proposal has matched). So acceptance keeps being probed at
  no cost, and drafting comes back as soon as the text starts copying. The prior (one
  right of four) is a pseudo-count that decays like the observations, so steady
  acceptance 1 reads close to 1, not capped by it.
  Acceptance also depends on how the drafter found its guess: a prompt-lookup draft whose
  source matches the history over many tokens is right far more often than one found
  from a single token (SmolLM2's greedy outputs on the bench's copy tasks: a draft that
  continues a 1-token match is right ~0.35 of the time, 2-3 tokens ~0.6, 4-10 ~0.85, 20
  or more ~0.95). So each proposal carries a context: how far its source's match extends
  back (the lookup's ``suffix_length``, up to 24; 0 where the drafter has none, as MTP,
  which then uses the pooled figures), and whether its n-gram was always followed by the
  same token (``agree``). The draft at position j continues a match of ``context + j``
  tokens (the ones before it were right), so it reads the figure of that length's bucket
  (MATCH_BUCKETS: 1, 2-3, 4-7, 8-15, 16+), kept apart for agreeing and disagreeing
  n-grams: the bucket's decayed counts from its own prior (MATCH_PRIOR: a long match is
  believed to go on before the text has shown it), made non-decreasing in the length
  (MONOTONE). A copy that has run for a while is drafted long from the first step; a
  proposal found from one token, little or not at all, in the same text.
- cost: a one-token forward takes ``plain_s``; a verify of k drafts costs
  ``c_k = 1 + c0 + rho * k`` one-token forwards: a fixed cost ``c0`` for leaving the
  one-token path (~0.8 measured on a 2-core AVX2 machine; ~0 where the prefill tiles
  are as fast per row as the decode kernels) and ``rho`` per draft (0.45-0.9 measured on
  2 cores; far less where a forward is bound by weight reads). ``(c0, rho)`` is a ridge
  fit (least squares with the prior as pseudo-observations) over the verifies seen,
  older ones decayed, each sample clipped to within a factor of the current prediction
  so one verify caught in a burst of load cannot swing it. The prior decides before any
  verify (and splits a cost measured at one k only between the two parts); while
  drafting is off the measured weights relax toward it, so a cost measured under load is
  probed again after ~100-150 steps, not on every step. While the fit is uncertain at a
  length, that length is judged optimistically (OPTIMISM), so it is tried once when the
  acceptance makes it plausible.

Each step drafts the k (0..proposal length) maximising expected tokens per second,
``(1 + sum_{j<=k} prod_{i<=j} alpha[i]) / c_k``; k = 0 is a one-token forward (``c_0 =
1``). Because ``c_k`` has a fixed part, short verifies can lose where long ones win:
every k is compared, not only the next one.
"""

from __future__ import annotations

import bisect
import copy
import math
import statistics
import threading
from collections.abc import Sequence

__all__ = ["AutoSwitch", "CostMemory", "CostModel"]

PRIOR_C0 = 0.5  # fixed cost of a verify over a one-token forward, in one-token forwards
PRIOR_RHO = 0.4  # cost per draft token, in one-token forwards
# Weights of the prior, in verify observations (rho's in observations at k = 1: k^2 scale).
PRIOR_W_C0, PRIOR_W_RHO = 0.3, 0.3
PRIOR_RIGHT, PRIOR_TRIED = 0.5, 2.0  # acceptance before any evidence: 1/4 (pseudo-counts)
# The acceptance prior when the cost comes measured from earlier generations (CostMemory):
# 1/2. With the cost known, an early verify is only risked where the measured cost makes
# it pay at that acceptance; chosen on the session 28 replay (docs/benchmarks-log.md), where
# it wins on the tuning and the held-out copy tasks at every cost curve, and loses with
# the cold cost prior (so the cold start keeps 1/4).
WARM_PRIOR_RIGHT = 1.0
# Weight of older observations (acceptance and cost follow the text and the machine).
ACC_DECAY = 0.95  # acceptance: an effective window of ~20 proposals
DECAY = 0.9  # cost: ~10 verifies
PLAIN_WINDOW = 15  # one-token forwards whose median is the time unit
# One-token forwards timed before the first draft: their median is then not one caught in
# a burst of load (a unit read 3x too long makes every verify look cheap, and while
# drafting no one-token forward corrects it). Shadow scoring needs a step or two anyway.
MIN_PLAIN = 3
RHO_MIN = 0.01
# A cost sample is clipped to [prediction / CLIP, prediction * CLIP]: CLIP_FIRST while
# fewer than CLIP_AFTER verifies are in (the prior may be far off), CLIP after.
CLIP_FIRST, CLIP, CLIP_AFTER = 3.0, 1.5, 3
# While drafting is off no verify measures the cost, so the measured weights relax by this
# share per step: a cost measured under a burst of load does not keep drafting off forever.
COST_RELAX = 0.04
# Optimism while the cost is uncertain: a length is judged at a cost whose extra part
# (c_k - 1) is cut by OPTIMISM * u_k, u_k in (0, 1] the fit's uncertainty at k relative
# to the prior's (1 with no verify seen; ~0.1 after one verify at that k). So a length the
# prior alone would reject is still probed once when the acceptance makes it plausible, and
# again once the measurement has relaxed; at acceptance ~0 nothing is (E_k = 1 <= c_k).
OPTIMISM = 0.5
# Acceptance per match length: a proposal's context is how many tokens its source matches
# before it (the lookup's suffix_length; 0: none, as MTP), and the draft at position j
# continues a match of context + j tokens (the drafts before it were right). The figures
# are kept per bucket of that length (MATCH_BUCKETS: the first length of each bucket), each
# starting from its own prior, MATCH_PRIOR (acceptance) at MATCH_PRIOR_WEIGHT
# pseudo-observations that decay like the observations: a match that has run for 8 tokens
# is believed to go on from the first step of a generation, one of a single token is not.
# The prior is the shape measured on SmolLM2's copy outputs (a 1-token match continues
# ~0.35 of the time, 2-3 ~0.6, 4-10 ~0.85, 20+ ~0.95), shaded down at the short lengths
# where a wrong belief costs free chat; chosen on the session 29 replay (docs/benchmarks-log.md).
# (Until session 28 each bucket started empty and was shrunk toward the pooled figure at its
# position instead; that figure at a late position is mostly short matches' misses, so a
# long copy was drafted two or three tokens at a time until its bucket had filled.)
MATCH_BUCKETS = (1, 2, 4, 8, 16)
CONTEXTS = len(MATCH_BUCKETS) + 1  # bucket 0: no context (the pooled figures)
MATCH_PRIOR = (0.25, 0.5, 0.8, 0.9, 0.95)
MATCH_PRIOR_WEIGHT = 4.0
# The figures are made non-decreasing in the match length (pool-adjacent-violators over
# the buckets, weighted by their counts): a longer match is not less likely to continue,
# so a bucket seen rarely borrows from its neighbours instead of reading noise.
MONOTONE = True


class CostModel:
    """``c_k = 1 + c0 + rho * k`` (k >= 1 drafts; ``c_0 = 1``) fitted to verify costs in
    one-token forwards: decayed, ridge-regularised least squares toward the prior."""

    def __init__(self, c0: float = PRIOR_C0, rho: float = PRIOR_RHO) -> None:
        self.prior_c0, self.prior_rho = c0, rho
        # Decayed sums over observations (k, y = c - 1) with weights w: w, wk, wkk, wy, wky.
        self._s = [0.0] * 5
        self.c0, self.rho = c0, rho
        self.seen = 0

    def cost(self, k: int) -> float:
        """A verify of k drafts in one-token forwards (1 for k = 0)."""
        return 1.0 if k <= 0 else 1.0 + self.c0 + self.rho * k

    def uncertainty(self, k: int) -> float:
        """The fit's variance at k over the prior's alone (1: nothing measured; -> 0 as
        verifies of about k drafts accumulate), square-rooted."""
        if k <= 0:
            return 0.0
        w, wk, wkk = self._s[0], self._s[1], self._s[2]
        a, b, c = w + PRIOR_W_C0, wk, wkk + PRIOR_W_RHO
        fit = (c - 2.0 * b * k + a * k * k) / (a * c - b * b)  # x' A^-1 x, x = (1, k)
        prior = 1.0 / PRIOR_W_C0 + k * k / PRIOR_W_RHO
        return min(1.0, math.sqrt(fit / prior))

    def optimistic_cost(self, k: int) -> float:
        """The cost a decision uses: the fit's, its extra part cut while uncertain."""
        c = self.cost(k)
        return 1.0 + (c - 1.0) * (1.0 - OPTIMISM * self.uncertainty(k))

    def observe(self, k: int, ratio: float) -> None:
        """A verify of k >= 1 drafts took `ratio` one-token forwards."""
        if k <= 0 or not ratio > 0.0:
            return
        if self.seen:
            pred, clip = self.cost(k), CLIP if self.seen >= CLIP_AFTER else CLIP_FIRST
            ratio = min(max(ratio, pred / clip), pred * clip)
        y = ratio - 1.0
        s = self._s
        for i in range(5):
            s[i] *= DECAY
        s[0] += 1.0
        s[1] += k
        s[2] += k * k
        s[3] += y
        s[4] += k * y
        self.seen += 1
        self._fit()

    def relax(self, share: float = COST_RELAX) -> None:
        """Lets the prior regain weight (a step without a verify)."""
        if self.seen:
            self._s = [v * (1.0 - share) for v in self._s]
            self._fit()

    def _fit(self) -> None:
        w, wk, wkk, wy, wky = self._s
        a, b, c = w + PRIOR_W_C0, wk, wkk + PRIOR_W_RHO
        u, v = wy + PRIOR_W_C0 * self.prior_c0, wky + PRIOR_W_RHO * self.prior_rho
        det = a * c - b * b
        c0, rho = (c * u - b * v) / det, (a * v - b * u) / det
        if rho < RHO_MIN:  # the best fit with rho at its floor
            rho = RHO_MIN
            c0 = (u - b * rho) / a
        if c0 < 0.0:  # with no fixed cost
            c0 = 0.0
            rho = max(v / c, RHO_MIN)
        self.c0, self.rho = c0, rho


class CostMemory:
    """What a model's generations learn about the cost of drafting, kept for the next
    ones: the one-token forward times (the time unit) and the verify cost fit, per drafter
    kind ("lookup", "mtp"). Acceptance is not kept (it is a property of the text). The
    cost is a property of the model and the machine, so a later generation starts with it
    measured: it drafts from its first step (no MIN_PLAIN one-token forwards) and reads
    the cost from the fit, not the prior.

    One per loaded model (``Model.reset_spec_memory`` clears it). Thread-safe: each
    generation copies the state in at its start and its own state out at its end, under a
    lock (concurrent generations each write back what they ended with; the last one
    stays)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state: dict[str, tuple[list[float], CostModel]] = {}

    def load(self, kind: str) -> tuple[list[float], CostModel] | None:
        with self._lock:
            state = self._state.get(kind)
            return None if state is None else (list(state[0]), copy.deepcopy(state[1]))

    def save(self, kind: str, plain: Sequence[float], cost: CostModel) -> None:
        """Keeps `plain` (one-token forward seconds) and `cost` (copied) for `kind`; a
        generation that timed no one-token forward leaves the memory as it was."""
        if not plain:
            return
        with self._lock:
            self._state[kind] = (list(plain), copy.deepcopy(cost))

    def reset(self) -> None:
        with self._lock:
            self._state.clear()

    def __contains__(self, kind: str) -> bool:
        with self._lock:
            return kind in self._state


class AutoSwitch:
    def __init__(self, max_draft: int, memory: CostMemory | None = None,
                 kind: str = "lookup") -> None:
        self.max_draft = max_draft
        self.plain_s: float | None = None  # seconds of a one-token forward (median)
        self._plain: list[float] = []
        self.cost = CostModel()
        self.memory, self.kind = memory, kind
        carried = memory.load(kind) if memory is not None else None
        # Whether the cost came measured from earlier generations (CostMemory).
        self.warm = carried is not None
        if carried is not None:
            self._plain, self.cost = carried
            self.plain_s = statistics.median(self._plain)
        # Decayed counts per draft position: tried (the earlier ones were right), right;
        # they start at the prior's pseudo-counts, which decay with the observations.
        self._tried = [PRIOR_TRIED] * max_draft
        self._right = [WARM_PRIOR_RIGHT if self.warm else PRIOR_RIGHT] * max_draft
        # Decayed counts per match-length bucket 1..CONTEXTS - 1, from MATCH_PRIOR's
        # pseudo-counts; context 0 reads the pooled figures (index 0 unused).
        # Kept apart for proposals whose n-gram was always followed by the same token
        # (index 1) and the others (0): a continuation the text has varied is less sure.
        self._ctx_tried = [[0.0] + [MATCH_PRIOR_WEIGHT] * len(MATCH_PRIOR) for _ in range(2)]
        self._ctx_right = [[0.0] + [MATCH_PRIOR_WEIGHT * p for p in MATCH_PRIOR]
                           for _ in range(2)]
        # Proposals not verified, scored as tokens arrive: (tokens, history length then,
        # context, agree, positions already scored).
        self._shadows: list[tuple[list[int], int, int, bool, int]] = []
        self.off_steps = 0
        self.switches = 0
        self._was_drafting = False

    @property
    def rho(self) -> float:
        return self.cost.rho

    @property
    def c0(self) -> float:
        return self.cost.c0

    # --- acceptance ---------------------------------------------------------------------

    def alpha(self, j: int, context: int = 0, agree: bool = True) -> float:
        """P(draft j right | drafts before it right), for a proposal whose source matched
        the history over `context` tokens (0: unknown). The prior is pessimistic (one
        right of four): acceptance is measured for free in the shadow, so drafting starts
        on evidence rather than paying for hopeful verifies on text that does not copy.
        With a context, the draft at j continues a match of ``context + j`` tokens: the
        figure of that length's bucket, its counts from MATCH_PRIOR (non-decreasing in
        the length, MONOTONE)."""
        if context <= 0:
            return self._right[j] / self._tried[j]
        tried, right = self._ctx_tried[agree], self._ctx_right[agree]
        b = _bucket(context + j)
        return _monotone(tried, right)[b] if MONOTONE else right[b] / tried[b]

    def observe(self, right: int, tried: int, context: int = 0, agree: bool = True) -> None:
        """A proposal of `tried` tokens whose first `right` matched what the model chose
        (a verify, or a shadow proposal scored later), made in `context` (its match
        length; 0: none) with `agree` (its n-gram always had one continuation)."""
        for j in range(min(tried, right + 1, self.max_draft)):
            self._observe_at(j, j < right, context, agree)

    def _observe_at(self, j: int, hit: bool, context: int, agree: bool) -> None:
        """The draft at position j (the ones before it right) was right or not."""
        h = 1.0 if hit else 0.0
        self._tried[j] = ACC_DECAY * self._tried[j] + 1.0
        self._right[j] = ACC_DECAY * self._right[j] + h
        if context > 0:
            ct, cr = self._ctx_tried[agree], self._ctx_right[agree]
            b = _bucket(context + j)
            ct[b] = ACC_DECAY * ct[b] + 1.0
            cr[b] = ACC_DECAY * cr[b] + h

    def _score_shadows(self, history: Sequence[int]) -> None:
        """Scores the shadow proposals against the tokens that have arrived and drops each
        at its first miss or its end. A proposal with a context (a match length) is scored
        one position at a time: each position's outcome is evidence about its own
        match-length bucket, so a copy in progress counts as soon as its tokens match. One
        without (pooled per-position figures, as MTP) is scored once decided: scored by
        halves, the first positions would read their acceptance before the later ones and
        favour short verifies, the dearest per token where a verify has a fixed cost."""
        pending = []
        for shadow, at, context, agree, done in self._shadows:
            new = history[at:at + len(shadow)]
            end = min(len(shadow), self.max_draft)
            right = done
            while right < min(len(new), end) and new[right] == shadow[right]:
                right += 1
            decided = right < min(len(new), end) or right == end
            if context > 0 or decided:
                for j in range(done, min(right + 1, end) if decided else right):
                    self._observe_at(j, j < right, context, agree)
            if not decided:
                pending.append((shadow, at, context, agree, right if context > 0 else 0))
        self._shadows = pending

    # --- cost ---------------------------------------------------------------------------

    def plain(self, seconds: float) -> None:
        """A one-token forward took `seconds`. The reference is the median of the last
        PLAIN_WINDOW: one forward caught in a burst of load does not rescale every verify
        measured after it (while drafting runs no plain forward corrects it)."""
        self._plain.append(seconds)
        if len(self._plain) > PLAIN_WINDOW:
            del self._plain[0]
        self.plain_s = statistics.median(self._plain)

    def verified(self, drafts: int, seconds: float) -> None:
        if self.plain_s is None or drafts <= 0:
            return
        self.cost.observe(drafts, seconds / self.plain_s)

    def finish(self) -> None:
        """The generation is over: its cost measurements go to the memory (if any)."""
        if self.memory is not None:
            self.memory.save(self.kind, self._plain, self.cost)

    # --- the decision -------------------------------------------------------------------

    def alphas(self, k: int, context: int = 0, agree: bool = True) -> list[float]:
        """alpha(j, context, agree) for j < k (the bucket figures computed once)."""
        k = min(k, self.max_draft)
        if context <= 0 or not MONOTONE:
            return [self.alpha(j, context, agree) for j in range(k)]
        figures = _monotone(self._ctx_tried[agree], self._ctx_right[agree])
        return [figures[_bucket(context + j)] for j in range(k)]

    def expected_tokens(self, k: int, context: int = 0, agree: bool = True) -> float:
        """Tokens a verify of k drafts yields on average (1 for k = 0)."""
        expected, chain = 1.0, 1.0
        for a in self.alphas(k, context, agree):
            chain *= a
            expected += chain
        return expected

    def best_k(self, available: int, context: int = 0, agree: bool = True) -> int:
        """The draft length with the most expected tokens per unit of time."""
        best, best_rate, expected, chain = 0, 1.0, 1.0, 1.0
        for k, a in enumerate(self.alphas(available, context, agree), start=1):
            chain *= a
            expected += chain
            r = expected / self.cost.optimistic_cost(k)
            if r > best_rate:
                best, best_rate = k, r
        return best

    def choose(self, history: Sequence[int], proposal: list[int], context: int = 0,
               agree: bool = True) -> int:
        """How many of `proposal` (made in `context`: how far the drafter's match extends,
        0 if unknown; `agree`: its n-gram always had one continuation) to verify now (0: a
        one-token forward; the proposal is then scored in the shadow)."""
        self._score_shadows(history)
        k = 0 if len(self._plain) < MIN_PLAIN else self.best_k(len(proposal), context, agree)
        drafting = k > 0
        if drafting != self._was_drafting:
            self.switches += 1
            self._was_drafting = drafting
        if not drafting:
            self.off_steps += 1
            self.cost.relax()
            if proposal and len(self._shadows) < self.max_draft:
                self._shadows.append((list(proposal), len(history), context, agree, 0))
        return k


def _monotone(tried: Sequence[float], right: Sequence[float]) -> list[float]:
    """Each bucket's figure (right / tried), made non-decreasing in the bucket by pooling
    adjacent violators, weighted by their counts. Index 0 (no context) is unused (nan)."""
    blocks: list[list[float]] = []  # [weighted sum, weight, buckets]
    for b in range(1, CONTEXTS):
        blocks.append([right[b], tried[b], 1.0])
        while len(blocks) > 1 and blocks[-2][0] * blocks[-1][1] > blocks[-1][0] * blocks[-2][1]:
            s, w, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += w
            blocks[-1][2] += n
    out = [math.nan]
    for s, w, n in blocks:
        out += [s / w] * int(n)
    return out


def _bucket(length: int) -> int:
    """The bucket (1..CONTEXTS - 1) of a match of `length` >= 1 tokens."""
    return bisect.bisect_right(MATCH_BUCKETS, length)
