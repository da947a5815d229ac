"""The speculative side of the decode loop (:func:`colibri.generate.generation.stream_tokens`).

The loop asks :meth:`Speculator.draft` for tokens to follow the history, forwards
``[last token, drafts...]`` in one batch with every position's logits, and then chooses
the tokens one position at a time exactly as without drafting (logits processors,
penalties, the sampler, stop checks all see the same sequences): each position's token is
chosen from that position's logits, and the next draft is accepted when it equals the
chosen token. The first mismatch ends the verify: the session is rolled back to the
accepted tokens, keeping the logits of that position, so the next step starts as if the
tokens had been forwarded one by one (batched and single forwards give the same bits).

For greedy decoding this is the longest prefix of drafts that greedy would produce, plus
the token greedy produces after it. With temperature > 0 it is the standard speculative
(rejection) sampling rule for a deterministic draft, realised with the sampler's own
draw: the draft ``x`` is accepted with probability ``p(x)`` (the chance the draw lands on
it), and on rejection the token is the draw itself, which is distributed as ``p`` without
``x``, renormalised. So the output distribution is the target's exactly; and because each
position takes the one uniform the plain loop would, a seeded generation gives the same
tokens with drafting as without.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..settings.spec import SpecConfig
from .auto import AutoSwitch, CostMemory
from .drafters import Drafter, MtpDrafter, PromptLookupDrafter
from .stats import SpecStats

__all__ = ["Speculator"]


class Speculator:
    """One generation's drafter, its counters and (for ``"auto"``) its on/off rule."""

    def __init__(self, config: SpecConfig, drafter: Drafter | None = None,
                 drafter_name: str | None = None, memory: CostMemory | None = None) -> None:
        self.config = config
        self.drafter: Drafter = (PromptLookupDrafter(config.ngram_sizes) if drafter is None
                                 else drafter)
        # What the stats call it: the config's drafter, or e.g. "auto (mtp)".
        self.name = drafter_name or config.drafter
        self.draft_seconds = 0.0  # in the drafter's propose calls
        self._step_draft_s = 0.0
        # "auto" starts from the cost `memory` holds for this drafter kind (earlier
        # generations of the model) and leaves its own there at finish().
        kind = "mtp" if isinstance(self.drafter, MtpDrafter) else "lookup"
        self.auto = (AutoSwitch(config.max_draft, memory, kind) if config.drafter == "auto"
                     else None)
        self.drafted = self.accepted = 0
        self.verify_forwards = self.plain_forwards = 0
        self.verify_seconds = self.plain_seconds = 0.0
        self._proposed_at = [0] * config.max_draft
        self._accepted_at = [0] * config.max_draft
        self._verify_accepted = 0
        self._verify_s = 0.0
        self._verify_drafts = 0
        # The current proposal's context for auto: how far the drafter's match extends,
        # and whether its n-gram always had the same continuation.
        self._context = 0
        self._agree = True

    def draft(self, history: Sequence[int], room: int) -> list[int]:
        """Up to ``min(max_draft, room)`` tokens to verify after `history` (which ends with
        the last chosen token); ``room`` is what the context and ``max_tokens`` leave."""
        k = min(self.config.max_draft, room)
        if k <= 0:
            return []
        t = time.perf_counter()
        proposal = [int(t) for t in self.drafter.propose(history, k)[:k]]
        # An MTP draft is a forward of one layer and the head per depth: its time is part of
        # what a step costs, with drafts or (shadow proposals for auto) without.
        self._step_draft_s = time.perf_counter() - t
        self.draft_seconds += self._step_draft_s
        if self.auto is not None:
            # The proposal's context: how far its source matches the history (the lookup's
            # suffix length; a drafter with only a match length gives that, MTP none).
            ctx = getattr(self.drafter, "suffix_length", None)
            if ctx is None:
                ctx = getattr(self.drafter, "match_length", 0)
            self._context = int(ctx or 0) if proposal else 0
            self._agree = bool(getattr(self.drafter, "agree", True))
            proposal = proposal[:self.auto.choose(history, proposal, self._context,
                                                  self._agree)]
        return proposal

    def accept(self, chosen: int, draft: int) -> int:
        """The token emitted at a drafted position: the one chosen from the target's logits
        (the draft is accepted when they are equal). A subclass that returns something
        else breaks exactness: the tests use one as a control."""
        return chosen

    def on_verify(self, drafts: int, seconds: float) -> None:
        self.verify_forwards += 1
        self.verify_seconds += seconds
        self.drafted += drafts
        for j in range(drafts):
            self._proposed_at[j] += 1
        self._verify_accepted = 0
        self._verify_s = seconds + self._step_draft_s
        self._verify_drafts = drafts

    def on_accept(self, position: int) -> None:
        """The draft at `position` (0-based) of the current verify was accepted."""
        self.accepted += 1
        self._accepted_at[position] += 1
        self._verify_accepted += 1

    def on_verify_done(self) -> None:
        """The current verify's drafts are all decided (accepted, rejected or cut off)."""
        if self.auto is not None:
            self.auto.verified(self._verify_drafts, self._verify_s)
            self.auto.observe(self._verify_accepted, self._verify_drafts, self._context,
                              self._agree)

    def on_plain(self, seconds: float) -> None:
        self.plain_forwards += 1
        self.plain_seconds += seconds
        if self.auto is not None:
            self.auto.plain(seconds + self._step_draft_s)

    def finish(self) -> None:
        """The generation is over (the decode loop calls it once, however it ended)."""
        if self.auto is not None:
            self.auto.finish()

    def stats(self, decode_tokens: int) -> SpecStats:
        return SpecStats(
            drafter=self.name, drafted=self.drafted, accepted=self.accepted,
            verify_forwards=self.verify_forwards, plain_forwards=self.plain_forwards,
            decode_tokens=decode_tokens, proposed_at=tuple(self._proposed_at),
            accepted_at=tuple(self._accepted_at), verify_seconds=self.verify_seconds,
            plain_seconds=self.plain_seconds, draft_seconds=self.draft_seconds,
            auto_off_steps=self.auto.off_steps if self.auto is not None else 0,
            auto_switches=self.auto.switches if self.auto is not None else 0,
        )  # fmt: skip
