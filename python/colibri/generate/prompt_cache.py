"""The prompt cache (``Model.prompt_cache``, on with ``EngineConfig(prompt_cache="1GiB")``):
the KV state of recent generations, kept so that a later call whose prompt starts with
the same tokens reuses it instead of prefilling it again.

- **Lookup**: the entry sharing the longest token prefix with the new prompt wins (at
  most the prompt minus its last token, which is forwarded to get fresh logits). When the
  entry is all prefix (the next turn of a chat: the history, then a new message) the
  entry's session itself is taken out of the cache and continues; when the entry goes on
  differently (a shared system prompt, then another question) the prefix is copied into a
  new session (the core's ``copy_prefix_from``) and the entry stays.
- **Insert**: a generation's session goes into the cache when it ends (prompt and
  generated tokens), replacing entries it extends.
- **Bytes**: each entry counts its session's allocated KV bytes; the total stays within
  ``EngineConfig.prompt_cache``, which is part of the RAM budget (``MemoryStats.
  prompt_cache_bytes``).
- **Sliding windows**: a sliding-window layer keeps only its last positions (a ring), so
  an entry is reused only for a prefix that ends near its own end (``Session.holds_prefix``);
  a shorter shared prefix is a miss.
- **Eviction**: least recently used first; an entry larger than the whole cache is not
  kept.
- **Numerics**: entries hold state computed under one activation precision and KV type.
  ``Model.set_activation_precision`` calls :meth:`PromptCache.invalidate`, which drops
  them and starts a new epoch; a generation that began in an older epoch is not kept
  when it ends (its state mixes the two arithmetics).

- **Running prompts** (``share_running``, on by default): under a step batcher (the
  server with several slots), a generation whose prompt shares a long prefix with one
  that is running now copies that prefix from the running one's session once it is
  prefilled, instead of prefilling it too (colibri.generate.prefix_share).

Reuse changes speed, never tokens: a prompt prefilled in parts gives bit-identical logits
to one prefilled at once, so a cached call generates what an uncached one does.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..display import Displayable, size
from .prefix_share import RunningPrompts, common_prefix

if TYPE_CHECKING:
    from .runner import Runner
    from .session import Session

__all__ = ["PromptCache", "PromptCacheStats"]


@dataclass(frozen=True, repr=False)
class PromptCacheStats(Displayable):
    """What the prompt cache holds and has done since load (or :meth:`PromptCache.clear`)."""

    entries: int  # sessions held
    bytes: int  # their KV bytes
    max_bytes: int  # EngineConfig.prompt_cache
    hits: int  # calls that reused a prefix
    misses: int  # calls that found none
    reused_tokens: int  # prompt tokens not prefilled thanks to it
    evictions: int  # entries dropped to make room
    shares: int = 0  # calls that copied a prefix from a running generation
    shared_tokens: int = 0  # prompt tokens not prefilled thanks to that

    def _display_rows(self) -> list[tuple[str, str]]:
        return [
            ("entries", f"{self.entries}, {size(self.bytes)} of {size(self.max_bytes)}"),
            ("hits", f"{self.hits} of {self.hits + self.misses} calls, "
                     f"{self.reused_tokens} tokens reused"),
            ("shared", f"{self.shares} calls, {self.shared_tokens} tokens from running "
                       "generations"),
            ("evictions", str(self.evictions)),
        ]


@dataclass
class _Entry:
    tokens: list[int]
    session: Session
    bytes: int
    used: float


class PromptCache:
    """The cache of one model (see the module docstring). Thread-safe."""

    def __init__(self, runner: Runner, max_bytes: int) -> None:
        self._runner = runner
        self.max_bytes = int(max_bytes)
        self._entries: list[_Entry] = []
        self._lock = threading.Lock()
        # hits, misses, reused tokens, evictions, shares, shared tokens
        self._counts = [0, 0, 0, 0, 0, 0]
        self.share_running = True  # copy prefixes from running generations too
        self.running = RunningPrompts()
        # Bumped whenever what changes the numbers changes (invalidate()); entries and
        # puts carry the epoch their state was computed in.
        self.epoch = 0

    @property
    def sharing(self) -> bool:
        """Prefixes are shared between running generations (under a step batcher)."""
        return self.enabled and self.share_running

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def stats(self) -> PromptCacheStats:
        with self._lock:
            h, m, r, e, sh, st = self._counts
            return PromptCacheStats(len(self._entries), sum(x.bytes for x in self._entries),
                                    self.max_bytes, h, m, r, e, sh, st)

    def clear(self) -> None:
        """Drops every entry and zeroes the counters."""
        with self._lock:
            self._entries.clear()
            self._counts = [0, 0, 0, 0, 0, 0]

    def invalidate(self) -> None:
        """Drops every entry (counted as evictions) and starts a new epoch: called when
        the arithmetic changes, so that no later call reuses state computed before."""
        with self._lock:
            self._counts[3] += len(self._entries)
            self._entries.clear()
            self.epoch += 1

    def count_share(self, tokens: int) -> None:
        """A call copied `tokens` prompt tokens from a running generation."""
        with self._lock:
            self._counts[4] += 1
            self._counts[5] += tokens

    def take(self, ids: list[int]) -> tuple[Session, int]:
        """A session holding the longest cached prefix of `ids` (at most all but the last
        token) and that prefix's length (0, and a new session, on a miss)."""
        limit = len(ids) - 1
        with self._lock:
            self._drop_stale()
            best, best_n = None, 0
            for e in self._entries:
                n = min(common_prefix(e.tokens, ids), limit)
                # (a sliding-window model's entry keeps only the window before its end)
                if n > best_n and e.session.holds_prefix(n):
                    best, best_n = e, n
            if best is None:
                self._counts[1] += 1
                return self._runner.session(), 0
            self._counts[0] += 1
            self._counts[2] += best_n
            if best_n == len(best.tokens) or best_n == len(best.tokens) - 1 == limit:
                # The prompt extends the entry: continue in its own session.
                self._entries.remove(best)
                session = best.session
            else:
                best.used = time.monotonic()
                session = best.session.fork(best_n)
                return session, best_n
        if session.n_tokens > best_n:
            session.rollback(session.n_tokens - best_n)
        return session, best_n

    def fill(self, session: Session, ids: list[int], have: int) -> int:
        """Copies into `session` the longest cached prefix of `ids` (at most all but the
        last token) when it is longer than `have`, the tokens `session` holds now (a
        follower whose running leader ended: its session may be cached now). Returns the
        tokens `session` then holds of `ids` (`have` when nothing longer is cached)."""
        limit = len(ids) - 1
        with self._lock:
            self._drop_stale()
            best, best_n = None, have
            for e in self._entries:
                n = min(common_prefix(e.tokens, ids), limit)
                if n > best_n and e.session.holds_prefix(n):
                    best, best_n = e, n
            if best is None:
                return have
            session._core.copy_prefix_from(best.session._core, best_n)
            best.used = time.monotonic()
            if have == 0:  # take() counted this call a miss: a hit after all
                self._counts[0] += 1
                self._counts[1] -= 1
            self._counts[2] += best_n - have
        return best_n

    def _drop_stale(self) -> None:
        """Drops entries whose session no longer holds the tokens they were kept with
        (rolled back or extended by its owner after the put): copying from one would
        read positions it does not hold. Called with the lock held."""
        self._entries = [e for e in self._entries if e.session.n_tokens == len(e.tokens)]

    def put(self, session: Session, epoch: int) -> None:
        """Keeps `session`'s state (called when a generation ends; `epoch`: the cache's
        epoch when that generation began)."""
        tokens = session.token_ids
        if not self.enabled or not tokens or session.n_tokens != len(tokens):
            return  # empty, or inconsistent (an interrupted call): not reusable
        nbytes = session.kv_bytes
        with self._lock:
            if epoch != self.epoch:
                return  # begun under the arithmetic before the last invalidate()
            # Entries this one extends hold nothing it does not.
            self._entries = [e for e in self._entries
                             if common_prefix(e.tokens, tokens) < len(e.tokens)]
            if nbytes > self.max_bytes:
                self._counts[3] += 1
                return
            self._entries.sort(key=lambda e: e.used)
            while self._entries and sum(e.bytes for e in self._entries) + nbytes > self.max_bytes:
                self._entries.pop(0)
                self._counts[3] += 1
            self._entries.append(_Entry(tokens, session, nbytes, time.monotonic()))
