"""Runner: what generates on one loaded engine.

It opens the model's sessions (and closes them with the model), runs each generation
(in a fresh session or one the prompt cache holds a prefix in; under a server's
continuous batching, sharing a prefix with a generation running now), and adds the
finished ones to the model's totals. ``Model`` is a facade over a Runner and its
:class:`~colibri.engine.handle.EngineHandle`; servers drive the Runner (its ``batcher``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from .. import _core
from ..engine.handle import EngineHandle
from ..engine.streaming import wait_policy_name
from ..errors import ContextOverflowError
from ..speculative.auto import CostMemory
from ..speculative.choose import speculator_for
from ..tokenizers import Tokenizer
from .decoding import Decoder
from .generation import Chunk, FinishReason, GenerationStats, stream_tokens
from .prompt_cache import PromptCache
from .session import Progress, Session
from .totals import Totals

if TYPE_CHECKING:
    from .batching import StepBatcher
    from .prefix_share import Running
    from .request import Request

__all__ = ["HasRunner", "Runner", "runner_of"]


class HasRunner(Protocol):
    """A loaded model: anything that exposes its Runner (``colibri.Model`` does)."""

    @property
    def runner(self) -> Runner: ...


def runner_of(model: HasRunner | Runner) -> Runner:
    return model if isinstance(model, Runner) else model.runner


class Runner:
    """Sessions and generations of one loaded engine."""

    def __init__(self, handle: EngineHandle) -> None:
        self.handle = handle
        self._tokenizer: Tokenizer | None = None
        self._lock = threading.Lock()
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()  # closed with the model
        self.prompt_cache = PromptCache(self, handle.engine_config.prompt_cache)
        # Set while a StepBatcher runs this model's forwards as batched steps (the server).
        self.batcher: StepBatcher | None = None
        self.totals = Totals()
        # What "auto" drafting measured of the verify cost, for the next generations.
        self.spec_memory = CostMemory()

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (from the GGUF metadata or the checkpoint directory)."""
        if self._tokenizer is None:
            m = self.handle.manifest
            if m.source == "gguf":
                self._tokenizer = Tokenizer.from_gguf_metadata(m.metadata, str(m.files[0]))
            else:
                self._tokenizer = Tokenizer.from_hf(m.path)
        return self._tokenizer

    def session(self) -> Session:
        """A new conversation state (KV cache) on the engine."""
        h = self.handle
        with self._lock:
            session = Session(self, _core.Session(h.core, h.context_length, h.kv_type))
            self._sessions.add(session)
        return session

    def fit(self, ids: list[int], request: Request) -> list[int]:
        """`ids` if they leave room to answer, else their end (``truncate``) or an error."""
        context = self.handle.context_length
        if len(ids) < context:
            return ids
        if not request.truncate:
            raise ContextOverflowError(
                f"the prompt has {len(ids)} tokens but the context holds {context} (and at "
                "least one more is needed to answer); shorten it, pass truncate=True to keep "
                "its end (a conversation keeps its system message and last turn), or raise "
                "EngineConfig.context_length"
            )
        return ids[-self.truncated_length(request.max_tokens):]

    def truncated_length(self, max_tokens: int) -> int:
        """How long a prompt that does not fit the context is cut to: room is left for
        `max_tokens`, but for at most half the context (and at least one token)."""
        context = self.handle.context_length
        return context - max(1, min(max_tokens, context // 2))

    def start(self, ids: list[int], request: Request, result: dict[str, Any],
              progress: Progress | None = None,
              ) -> tuple[Session, Generator[Chunk, None, None]]:
        """A generation of `ids` in a new session, or in one of the prompt cache holding
        a prefix of them (which is then not prefilled again); the session goes to the
        cache when the generation ends."""
        cache = self.prompt_cache
        if cache.enabled:
            session, m = cache.take(ids)
        else:
            session, m = self.session(), 0
        batcher = self.batcher
        if batcher is None or not cache.sharing:
            return session, self.stream(session, ids[m:], request, result, history=ids[:m],
                                        to_cache=True, progress=progress)
        # Under continuous batching: share a prefix with a generation running now
        # (colibri.generate.prefix_share), and be one others can share with.
        entry = cache.running.add(ids, session)
        lead = cache.running.leader(entry, m)
        if lead is None:
            gen = self.stream(session, ids[m:], request, result, history=ids[:m],
                              to_cache=True, progress=progress)
        else:
            gen = self._follow(session, ids, m, lead, batcher, request, result, progress)
        return session, cache.running.tracked(entry, gen, on_end=batcher.wake)

    def _follow(self, session: Session, ids: list[int], m: int, lead: tuple[Running, int],
                batcher: StepBatcher, request: Request, result: dict[str, Any],
                progress: Progress | None) -> Generator[Chunk, None, None]:
        """The generation of `ids` after copying the first ``lead[1]`` tokens' KV state
        from the running leader ``lead[0]`` once it holds them (or, if it ends first,
        from what the prompt cache holds then, at least the `m` tokens it gave)."""
        leader, n = lead
        if batcher.copy_prefix(session, leader.session, ids[:n], lambda: leader.ended):
            k = n
            self.prompt_cache.count_share(n - m)
        else:  # the leader ended first: its session may be in the cache by now
            k = self.prompt_cache.fill(session, ids, m)
        yield from self.stream(session, ids[k:], request, result, history=ids[:k],
                               to_cache=True, progress=progress)

    def stream(
        self,
        session: Session,
        ids: Sequence[int],
        request: Request,
        result: dict[str, Any],
        history: Sequence[int] = (),
        to_cache: bool = False,
        progress: Progress | None = None,
    ) -> Generator[Chunk, None, None]:
        """The generation of `request` after forwarding `ids` into `session` (which holds
        `history`); fills `result` (stats, generated ids, finish, logprobs) at the end."""
        handle = self.handle
        decoder = None if request.plain else Decoder(request, self.tokenizer,
                                                     handle.config.vocab_size)
        core = handle.core
        # The session's own counters, not the engine's: another thread's generation on
        # this model must not mix into this one's figures (docs/api.md, threads).
        experts0, phases0 = session.forward_stats()
        epoch = self.prompt_cache.epoch

        def done(stats: GenerationStats, generated: list[int], finish: FinishReason | None) -> None:
            experts1, phases1 = session.forward_stats()
            stats = replace(
                stats, experts=experts1.minus(experts0), phases=phases1.minus(phases0),
                wait_policy=wait_policy_name(core), cached_tokens=len(history),
            )  # fmt: skip
            # Not an interrupted call (finish None): async cancellation rolls its session
            # back after this, which would leave a cache entry that no longer holds its
            # tokens.
            if to_cache and finish is not None and self.prompt_cache.enabled:
                self.prompt_cache.put(session, epoch)
            result.update(stats=stats, generated=generated, finish=finish)
            if decoder is not None:
                result.update(logprobs=decoder.logprobs, prompt_logprobs=decoder.prompt_logprobs)
            self.totals.add(stats)

        spec = request.spec if request.spec is not None else handle.engine_config.spec
        return stream_tokens(
            session, self.tokenizer, ids, max_tokens=request.max_tokens,
            sampling=request.sampling, stop=request.stop, history=history, on_done=done,
            decoder=decoder, progress=progress, max_time=request.max_time,
            speculator=speculator_for(spec, session._core, handle.config.n_mtp_layers,
                                      handle.name, self.spec_memory),
        )  # fmt: skip

    def close(self) -> None:
        """Closes the model: the routing history is saved, the batcher's waiting forwards
        are served and its thread stopped, the prompt cache emptied, every session's KV
        cache freed (their calls raise InvalidRequestError from now on) and the engine
        dropped. Idempotent."""
        try:
            self.handle.save_routing_history()
        finally:
            if self.batcher is not None:
                self.batcher.detach()
            self.prompt_cache.clear()
            with self._lock:
                sessions = list(self._sessions)
                self._sessions.clear()
            for session in sessions:
                session._close()  # drops its KV cache and its hold on the engine
            self.handle.release()  # the last reference: the engine frees its memory now
