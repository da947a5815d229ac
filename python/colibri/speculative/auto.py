"""The "auto" rule: draft as many tokens as pay, from measured acceptance and cost.

Two figures decide, both measured during the generation:

- acceptance: for each draft position j, how often the draft token there was right given
  the ones before it were (``alpha[j]``). It is measured on every step, drafting or not:
  while drafting is off the drafter is still asked (it costs microseconds) and its
  proposal is scored against the tokens the model then produces. So acceptance keeps being
  probed at no cost, and drafting comes back as soon as the text starts copying.
- cost: a one-token forward takes ``plain_s``; a verify of k drafts ``plain_s * (1 +
  rho * k)``, rho fitted from the verifies seen (streamed expert reads included, since
  they are inside the forward's time). Before any verify rho is PRIOR_RHO; while
  drafting is off it relaxes back toward it, so a cost measured in a burst of load is
  probed again.

Each step drafts the k (0..proposal length) maximising expected tokens per second,
``(1 + sum_{j<=k} prod_{i<=j} alpha[i]) / (1 + rho * k)``; k = 0 is a one-token forward.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["AutoSwitch"]

PRIOR_RHO = 0.3  # extra cost of a verify per draft token, in one-token forwards
PRIOR_RIGHT, PRIOR_TRIED = 1.0, 4.0  # acceptance before any evidence: 1/4
DECAY = 0.9  # weight of older observations (acceptance and cost follow the text)
RHO_MIN = 0.01
# While drafting is off no verify measures the cost, so rho relaxes toward the prior by this
# share per step: a cost measured under a burst of load does not keep drafting off forever.
RHO_RELAX = 0.02


class AutoSwitch:
    def __init__(self, max_draft: int) -> None:
        self.max_draft = max_draft
        self.plain_s: float | None = None  # seconds of a one-token forward (EMA)
        self.rho = PRIOR_RHO
        self._rho_seen = False
        # Decayed counts per draft position: tried (the earlier ones were right), right.
        self._tried = [0.0] * max_draft
        self._right = [0.0] * max_draft
        self._shadow: list[int] = []  # a proposal not verified, scored as tokens arrive
        self._shadow_at = 0  # history length when it was proposed
        self.off_steps = 0
        self.switches = 0
        self._was_drafting = False

    # --- acceptance ---------------------------------------------------------------------

    def alpha(self, j: int) -> float:
        """P(draft j right | drafts before it right). The prior is pessimistic (one right
        of four): acceptance is measured for free in the shadow, so drafting starts on
        evidence rather than paying for hopeful verifies on text that does not copy."""
        return (self._right[j] + PRIOR_RIGHT) / (self._tried[j] + PRIOR_TRIED)

    def observe(self, right: int, tried: int) -> None:
        """A proposal of `tried` tokens whose first `right` matched what the model chose
        (a verify, or a shadow proposal scored later)."""
        for j in range(min(tried, right + 1, self.max_draft)):
            self._tried[j] = DECAY * self._tried[j] + 1.0
            self._right[j] = DECAY * self._right[j] + (1.0 if j < right else 0.0)

    def _score_shadow(self, history: Sequence[int]) -> None:
        if not self._shadow:
            return
        new = history[self._shadow_at:self._shadow_at + len(self._shadow)]
        right = 0
        while right < min(len(new), len(self._shadow)) and new[right] == self._shadow[right]:
            right += 1
        if right < len(self._shadow) and right == len(new):
            return  # still matching so far: wait for more tokens
        self.observe(right, len(self._shadow))
        self._shadow = []

    # --- cost ---------------------------------------------------------------------------

    def plain(self, seconds: float) -> None:
        self.plain_s = seconds if self.plain_s is None else DECAY * self.plain_s + (
            1 - DECAY) * seconds

    def verified(self, drafts: int, seconds: float) -> None:
        if self.plain_s is None or drafts <= 0:
            return
        sample = max((seconds / self.plain_s - 1.0) / drafts, RHO_MIN)
        self.rho = sample if not self._rho_seen else DECAY * self.rho + (1 - DECAY) * sample
        self._rho_seen = True

    # --- the decision -------------------------------------------------------------------

    def best_k(self, available: int) -> int:
        """The draft length with the most expected tokens per unit of time."""
        best, best_rate, expected, chain = 0, 1.0, 1.0, 1.0
        for k in range(1, min(available, self.max_draft) + 1):
            chain *= self.alpha(k - 1)
            expected += chain
            r = expected / (1.0 + self.rho * k)
            if r > best_rate:
                best, best_rate = k, r
        return best

    def choose(self, history: Sequence[int], proposal: list[int]) -> int:
        """How many of `proposal` to verify now (0: a one-token forward; the proposal is
        then scored in the shadow)."""
        self._score_shadow(history)
        k = 0 if self.plain_s is None else self.best_k(len(proposal))
        drafting = k > 0
        if drafting != self._was_drafting:
            self.switches += 1
            self._was_drafting = drafting
        if not drafting:
            self.off_steps += 1
            self.rho += (PRIOR_RHO - self.rho) * RHO_RELAX
            if proposal and not self._shadow:
                self._shadow, self._shadow_at = list(proposal), len(history)
        else:
            self._shadow = []  # the verify measures acceptance itself
        return k
