"""SpecStats: what speculative decoding did during one generation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..display import Displayable, percent, sig3

__all__ = ["SpecStats"]


@dataclass(frozen=True, repr=False)
class SpecStats(Displayable):
    """Drafts proposed and accepted in one generation, and what the verify forwards cost."""

    drafter: str  # the drafter in effect: "lookup", "mtp", "auto (lookup)", "auto (mtp)"
    drafted: int  # draft tokens proposed (and verified)
    accepted: int  # draft tokens the target model agreed with
    verify_forwards: int  # batched forwards of [last token, drafts...]
    plain_forwards: int  # one-token forwards (no draft, or drafting switched off)
    decode_tokens: int  # tokens the decode forwards produced (generated - 1)
    # Per draft position j (0 = the first drafted token): how often a draft had a token
    # there, and how often it was accepted.
    proposed_at: tuple[int, ...] = ()
    accepted_at: tuple[int, ...] = ()
    verify_seconds: float = 0.0
    plain_seconds: float = 0.0
    draft_seconds: float = 0.0  # in the drafter (an MTP draft runs a layer and the head)
    # "auto": steps decoded with drafting switched off by the cost rule, and how often
    # the rule switched.
    auto_off_steps: int = 0
    auto_switches: int = 0

    def __add__(self, other: SpecStats) -> SpecStats:
        """The figures of both (cumulative per model: ``ModelStats.spec``); per-position
        counts add position by position; a drafter that differs reads "mixed"."""

        def add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
            n = max(len(a), len(b))
            return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0)
                         for i in range(n))

        return SpecStats(
            drafter=self.drafter if self.drafter == other.drafter else "mixed",
            drafted=self.drafted + other.drafted, accepted=self.accepted + other.accepted,
            verify_forwards=self.verify_forwards + other.verify_forwards,
            plain_forwards=self.plain_forwards + other.plain_forwards,
            decode_tokens=self.decode_tokens + other.decode_tokens,
            proposed_at=add(self.proposed_at, other.proposed_at),
            accepted_at=add(self.accepted_at, other.accepted_at),
            verify_seconds=self.verify_seconds + other.verify_seconds,
            plain_seconds=self.plain_seconds + other.plain_seconds,
            draft_seconds=self.draft_seconds + other.draft_seconds,
            auto_off_steps=self.auto_off_steps + other.auto_off_steps,
            auto_switches=self.auto_switches + other.auto_switches,
        )  # fmt: skip

    @property
    def forwards(self) -> int:
        return self.verify_forwards + self.plain_forwards

    @property
    def acceptance(self) -> float:
        """Accepted / drafted (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_at(self) -> tuple[float, ...]:
        """Acceptance per draft position (accepted / proposed there)."""
        return tuple(a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at,
                                                        strict=True))

    @property
    def mean_accepted(self) -> float:
        """Draft tokens accepted per verify forward."""
        return self.accepted / self.verify_forwards if self.verify_forwards else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens the decode forwards produced, per forward (1.0 without drafting)."""
        return self.decode_tokens / self.forwards if self.forwards else 0.0

    @property
    def verify_cost_ratio(self) -> float:
        """Mean seconds of a verify forward over a one-token forward (0 until both ran)."""
        if not (self.verify_forwards and self.plain_forwards and self.plain_seconds > 0):
            return 0.0
        return (self.verify_seconds / self.verify_forwards) / (
            self.plain_seconds / self.plain_forwards)

    @property
    def saved_seconds(self) -> float:
        """Decode time saved by drafting (negative: lost), estimated against one-token
        decoding at this generation's mean one-token forward: ``decode_tokens`` such
        forwards, less what the decode spent (verify and one-token forwards, and the
        drafter). 0 when no one-token forward ran (nothing to compare with)."""
        if not (self.plain_forwards and self.plain_seconds > 0):
            return 0.0
        one = self.plain_seconds / self.plain_forwards
        return (self.decode_tokens * one
                - (self.verify_seconds + self.plain_seconds + self.draft_seconds))

    def _display_rows(self) -> list[tuple[str, str]]:
        rows = [
            ("drafter", self.drafter),
            ("drafted", f"{self.drafted} tokens, {self.accepted} accepted "
                        f"({percent(self.acceptance)})"),
            ("forwards", f"{self.verify_forwards} verify + {self.plain_forwards} plain, "
                         f"{sig3(self.tokens_per_forward)} tokens per forward"),
        ]
        if self.verify_cost_ratio:
            rows.append(("verify cost", f"{sig3(self.verify_cost_ratio)}x a one-token forward"))
        if self.draft_seconds and self.forwards:
            rows.append(("drafting", f"{sig3(1e3 * self.draft_seconds / self.forwards)} ms "
                                     "per step"))
        if self.plain_forwards and self.verify_forwards:
            saved = self.saved_seconds
            rows.append(("time", f"{sig3(1e3 * abs(saved))} ms {'saved' if saved >= 0 else 'lost'}"
                                 " against one-token decoding (estimated)"))
        if self.auto_switches or self.auto_off_steps:
            rows.append(("auto", f"{self.auto_off_steps} steps off, {self.auto_switches} "
                                 "switches"))
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "drafter": self.drafter,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.acceptance,
            "acceptance_at": list(self.acceptance_at),
            "proposed_at": list(self.proposed_at),
            "accepted_at": list(self.accepted_at),
            "mean_accepted": self.mean_accepted,
            "verify_forwards": self.verify_forwards,
            "plain_forwards": self.plain_forwards,
            "decode_tokens": self.decode_tokens,
            "tokens_per_forward": self.tokens_per_forward,
            "verify_seconds": self.verify_seconds,
            "plain_seconds": self.plain_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_cost_ratio": self.verify_cost_ratio,
            "saved_seconds": self.saved_seconds,
            "auto_off_steps": self.auto_off_steps,
            "auto_switches": self.auto_switches,
        }
