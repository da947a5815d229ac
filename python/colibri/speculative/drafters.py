"""Drafters: guess the next few tokens cheaply, for the target model to verify in one
forward. A drafter only proposes; :mod:`colibri.speculative.verify` decides what is kept, so
a bad guess costs time, never correctness."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .. import _core

__all__ = ["SUFFIX_CAP", "Drafter", "MtpDrafter", "PromptLookupDrafter"]


class Drafter(Protocol):
    """Proposes up to `k` tokens to follow `history` (every token of the sequence so far:
    the prompt, then the generated text, the last generated token included)."""

    def propose(self, history: Sequence[int], k: int) -> list[int]: ...


class PromptLookupDrafter:
    """Prompt lookup (n-gram) drafting, as llama.cpp's lookup and vLLM's ngram drafter:
    find an earlier occurrence of the last `n` tokens of the history (n from
    `ngram_sizes`, longest first) and propose what followed it, up to `k` tokens. No
    model: it pays on text that copies from its context (edits, quotes, code).

    Of the n-gram's occurrences (the latest RECENT of them), the one whose match extends
    furthest back (the most tokens before it equal the history's last ones, up to
    SUFFIX_CAP) is proposed, the latest among equals; ``longest=False`` takes the latest
    occurrence (llama.cpp's and vLLM's choice). Each proposal leaves three figures that
    ``auto`` uses as its context: ``match_length`` (the n that matched; 0: none),
    ``suffix_length`` (how far the match extends back, >= match_length) and ``agree``
    (whether every occurrence of the n-gram so far was followed by the same token).

    The search is incremental: an index from each n-gram to its latest end positions is
    extended with the tokens appended since the last call, so a call costs O(new tokens +
    RECENT * SUFFIX_CAP + k), not O(history)."""

    def __init__(self, ngram_sizes: Sequence[int] = (3, 2, 1), longest: bool = True) -> None:
        if not ngram_sizes or any(n < 1 for n in ngram_sizes):
            raise ValueError(f"ngram_sizes must be sizes >= 1, got {tuple(ngram_sizes)}")
        self.ngram_sizes = tuple(ngram_sizes)
        self.longest = longest
        self._tokens: list[int] = []
        # n -> {n-gram: [indices just after its latest RECENT occurrences that have a
        # successor, oldest first], and whether all its occurrences had one successor}
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self._agree: dict[int, dict[tuple[int, ...], bool]] = {}
        self._reset()
        self.match_length = 0
        self.suffix_length = 0
        self.agree = True

    def _reset(self) -> None:
        self._tokens = []
        self._index = {n: {} for n in self.ngram_sizes}
        self._agree = {n: {} for n in self.ngram_sizes}

    def _sync(self, history: Sequence[int]) -> None:
        """Brings the index up to `history`; starts over if it is not an extension of the
        tokens seen so far (a session rolled back or reused). The check compares the first
        token and the last CHECK_TAIL seen, plus CHECK_TAIL evenly spaced ones, not all: a
        history that differs only elsewhere keeps a stale index, which costs acceptance,
        never correctness (every draft is verified)."""
        t = self._tokens
        m = len(t)
        if len(history) < m or (m and not _same_prefix(history, t)):
            self._reset()
            t, m = self._tokens, 0
        t.extend(int(x) for x in history[m:])
        # An n-gram ending at i-1 (tokens [i-n, i)) is recorded once token i exists, so the
        # index only holds occurrences with a continuation.
        for n, index in self._index.items():
            agree = self._agree[n]
            for i in range(max(n, m), len(t)):
                key = tuple(t[i - n:i])
                starts = index.get(key)
                if starts is None:
                    index[key] = [i]
                    agree[key] = True
                    continue
                if t[starts[-1]] != t[i]:
                    agree[key] = False
                starts.append(i)
                if len(starts) > RECENT:
                    del starts[0]

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        self.match_length = self.suffix_length = 0
        self.agree = True
        if k <= 0:
            return []
        self._sync(history)
        t = self._tokens
        for n in self.ngram_sizes:
            if len(t) <= n:
                continue
            key = tuple(t[-n:])
            starts = self._index[n].get(key)
            if starts is None:
                continue
            start, length = starts[-1], _suffix_length(t, starts[-1], n)
            if self.longest:
                for s in reversed(starts[:-1]):
                    if length >= SUFFIX_CAP:
                        break
                    ls = _suffix_length(t, s, n)
                    if ls > length:
                        start, length = s, ls
            self.match_length, self.suffix_length = n, length
            self.agree = self._agree[n][key]
            return t[start:min(start + k, len(t))]
        return []


SUFFIX_CAP = 24  # how far back a match's length is measured
RECENT = 8  # occurrences of an n-gram compared for the longest match
CHECK_TAIL = 64  # tokens compared to tell a grown history from a different one


def _same_prefix(history: Sequence[int], t: list[int]) -> bool:
    """Whether `history` starts with `t` at the positions the drafter checks (O(CHECK_TAIL))."""
    m = len(t)
    tail = max(0, m - CHECK_TAIL)
    if list(history[tail:m]) != t[tail:] or history[0] != t[0]:
        return False
    step = max(1, tail // CHECK_TAIL)
    return all(history[i] == t[i] for i in range(0, tail, step))


def _suffix_length(t: list[int], start: int, n: int) -> int:
    """How many tokens before `start` equal the last tokens of `t` (the first `n` are known
    to), at most SUFFIX_CAP."""
    last, length = len(t) - 1, n
    while length < SUFFIX_CAP and start - 1 - length >= 0 and \
            t[start - 1 - length] == t[last - length]:
        length += 1
    return length


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
