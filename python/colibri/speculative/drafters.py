"""Drafters: guess the next few tokens cheaply, for the target model to verify in one
forward. A drafter only proposes; :mod:`colibri.speculative.verify` decides what is kept, so
a bad guess costs time, never correctness."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .. import _core

__all__ = ["Drafter", "MtpDrafter", "PromptLookupDrafter"]


class Drafter(Protocol):
    """Proposes up to `k` tokens to follow `history` (every token of the sequence so far:
    the prompt, then the generated text, the last generated token included)."""

    def propose(self, history: Sequence[int], k: int) -> list[int]: ...


class PromptLookupDrafter:
    """Prompt lookup (n-gram) drafting, as llama.cpp's lookup and vLLM's ngram drafter:
    find the latest earlier occurrence of the last `n` tokens of the history (n from
    `ngram_sizes`, longest first) and propose what followed it, up to `k` tokens. No
    model: it pays on text that copies from its context (edits, quotes, code).

    The search is incremental: an index from each n-gram to its latest end position is
    extended with the tokens appended since the last call, so a call costs O(new tokens +
    k), not O(history)."""

    def __init__(self, ngram_sizes: Sequence[int] = (3, 2, 1)) -> None:
        if not ngram_sizes or any(n < 1 for n in ngram_sizes):
            raise ValueError(f"ngram_sizes must be sizes >= 1, got {tuple(ngram_sizes)}")
        self.ngram_sizes = tuple(ngram_sizes)
        self._tokens: list[int] = []
        # n -> {n-gram: index just after its latest occurrence that has a successor}
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ngram_sizes}
        # The n-gram size the last proposal matched (0: none). `auto` keeps acceptance
        # per match length: a longer match's continuation is right more often.
        self.match_length = 0

    def _sync(self, history: Sequence[int]) -> None:
        """Brings the index up to `history`; starts over if it is not an extension of the
        tokens seen so far (a session rolled back or reused)."""
        t = self._tokens
        m = len(t)
        if len(history) < m or (m and (history[m - 1] != t[-1] or history[0] != t[0])):
            self._tokens, self._index = [], {n: {} for n in self.ngram_sizes}
            t, m = self._tokens, 0
        t.extend(int(x) for x in history[m:])
        # An n-gram ending at i-1 (tokens [i-n, i)) is recorded once token i exists, so the
        # index only holds occurrences with a continuation; the latest one wins.
        for n, index in self._index.items():
            for i in range(max(n, m), len(t)):
                index[tuple(t[i - n:i])] = i

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        self.match_length = 0
        if k <= 0:
            return []
        self._sync(history)
        t = self._tokens
        for n in self.ngram_sizes:
            if len(t) <= n:
                continue
            start = self._index[n].get(tuple(t[-n:]))
            if start is not None:
                self.match_length = n
                return t[start:min(start + k, len(t))]
        return []


class MtpDrafter:
    """The model's multi-token-prediction layer (DeepSeek-V3 / GLM ``nextn``) as a drafter:
    greedy drafts from the layer, chained on its own output for depth > 1 (the core's
    ``model/mtp.hpp``). The session keeps the MTP layer's KV cache in step with its tokens
    (rolled back with them), so a proposal only runs the pairs not seen yet plus one
    single-row step per extra depth.

    It proposes only when the history is the session's tokens plus the one chosen after
    them (the decode loop's state); otherwise nothing."""

    def __init__(self, session: _core.Session) -> None:
        session.enable_mtp()
        self._session = session

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        if k <= 0 or not history or self._session.n_tokens != len(history) - 1:
            return []
        drafts, _ = self._session.mtp_draft(int(history[-1]), k)
        return [int(t) for t in drafts]
