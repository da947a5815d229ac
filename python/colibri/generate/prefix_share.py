"""Prompt-prefix sharing between generations that run at the same time (part of the
prompt cache: on with ``EngineConfig(prompt_cache=...)`` under a
:class:`~colibri.generate.batching.StepBatcher`, i.e. ``colibri serve --parallel N
--prompt-cache``).

The prompt cache reuses a prefix once a generation holding it has ended. Requests that
arrive together (eight chats with the same long system prompt) would each prefill it;
instead, every generation running under the step batcher registers its prompt here, and
a new one whose prompt shares at least :data:`MIN_SHARED` leading tokens with a running
one's (more than the prompt cache gave it) **follows** that leader: it waits, without
holding up the steps, until the leader's session holds the shared prefix, has the step
thread copy that prefix's KV state into its own session between two steps (the core's
``copy_prefix_from``, the prompt cache's copy), and prefills only its remainder.

- The copy is only made while the leader's owner waits for a step (its row is queued),
  so nothing else touches the leader's session meanwhile, and only if the leader still
  holds exactly those tokens; a position's KV state depends on the tokens up to it alone,
  so the copy is the same bits as prefilling them (greedy outputs do not change).
- A leader that ends, is cancelled or fails before the copy is made releases its
  followers: each takes what the prompt cache holds by then (a finished leader's
  session) and prefills the rest itself (nothing waits for a leader that is gone).
- Memory: the follower's copy lives in its own session, inside the KV positions the
  server reserved for it (prompt + max_tokens), so it counts against the KV budget as
  its prefill would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .session import Session

__all__ = ["MIN_SHARED", "RunningPrompts", "common_prefix"]

MIN_SHARED = 32  # fewer shared tokens are not worth waiting for a leader
T = TypeVar("T")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(eq=False)
class Running:
    """A running generation's prompt; ``ended`` once its generation has ended (or its
    stream was dropped unstarted)."""

    ids: list[int]  # the generation's whole prompt
    session: Session
    ended: bool = False


class RunningPrompts:
    """The prompts of the generations running now (see the module docstring).
    Thread-safe."""

    def __init__(self, min_tokens: int = MIN_SHARED) -> None:
        self.min_tokens = min_tokens
        self._running: list[Running] = []
        self._lock = threading.RLock()  # end() may run from a __del__

    def add(self, ids: list[int], session: Session) -> Running:
        """Registers a generation's prompt (before its stream starts)."""
        entry = Running(list(ids), session)
        with self._lock:
            self._running.append(entry)
        return entry

    def leader(self, entry: Running, have: int) -> tuple[Running, int] | None:
        """Of the generations registered before `entry`, the one sharing the longest
        prefix with its prompt (at most all but the last token, at least ``min_tokens``
        and more than `have`, what the prompt cache gave), the earliest on a tie, and
        that prefix's length; None if none. (Only earlier ones: no two generations wait
        for each other.)"""
        ids = entry.ids
        limit = len(ids) - 1
        best: tuple[Running, int] | None = None
        with self._lock:
            for r in self._running:
                if r is entry:
                    break
                n = min(common_prefix(r.ids, ids), limit)
                if n >= self.min_tokens and n > have and (best is None or n > best[1]):
                    best = (r, n)
        return best

    def end(self, entry: Running) -> None:
        with self._lock:
            entry.ended = True
            if entry in self._running:
                self._running.remove(entry)

    def tracked(self, entry: Running, gen: Generator[T, None, None],
                on_end: Callable[[], object] | None = None) -> Generator[T, None, None]:
        """`gen`, whose end (exhausted, failed, closed, or dropped unstarted) ends
        `entry`, then calls `on_end`."""
        def end() -> None:
            self.end(entry)
            if on_end is not None:
                on_end()
        return _Tracked(gen, end)

    def __len__(self) -> int:
        with self._lock:
            return len(self._running)


class _Tracked(Generator[T, None, None]):
    """A generator that calls ``end`` once when the one it wraps ends in any way (a
    generator's own ``finally`` does not run when it is dropped before it started)."""

    def __init__(self, gen: Generator[T, None, None], end: Callable[[], None]) -> None:
        self._gen = gen
        self._end: Callable[[], None] | None = end

    def _ended(self) -> None:
        end, self._end = self._end, None
        if end is not None:
            end()

    def send(self, value: None) -> T:
        try:
            return self._gen.send(value)
        except BaseException:
            self._ended()
            raise

    def throw(self, *args: Any) -> T:
        try:
            return self._gen.throw(*args)
        except BaseException:
            self._ended()
            raise

    def close(self) -> None:
        try:
            self._gen.close()
        finally:
            self._ended()

    def __del__(self) -> None:
        self._ended()
