"""Session: one conversation's state (KV cache) on a loaded model.

A session is what custom sampling loops drive: ``forward`` appends tokens and returns
NumPy logits, ``rollback`` forgets tokens, ``generate``/``stream`` continue from the state.

The state (tokens, their ids, the last logits) lives in the native session and changes in
one step at the end of a successful call: a forward that fails or is interrupted (Ctrl-C,
an exception from a progress callback, the model closed meanwhile) leaves it exactly as it
was. One call at a time per session: a call made while another thread's call on the same
session is running raises InvalidRequestError rather than waiting (two threads feeding one
conversation would interleave their tokens); give each thread its own session.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .. import _core
from ..engine.stats import ExpertStats, PhaseTimes
from ..engine.streaming import session_stats
from ..errors import InvalidRequestError, TokenOutOfRangeError
from ..progress import DelayedBar, delayed_bar
from ..sampling import Sampler, Sampling
from .aio import agenerate_stream, astream_stream
from .generation import Chunk, Generation, collect
from .request import GenerateOptions, parse_request

if TYPE_CHECKING:
    from typing import Unpack

    from .runner import HasRunner, Runner

Progress = Callable[[int, int], object]
"""``progress(done, total)``: called after each prefill chunk with the tokens forwarded so
far and the total, in the calling thread; an exception it raises stops the forward (the
session is then unchanged)."""

ProgressOption = Progress | bool | None
"""What ``progress=`` takes: a :data:`Progress` callable; True: a bar on stderr (or
Jupyter's widget) once the prefill has run a second; False: nothing; None: "auto", that bar
only where stderr is a terminal or in a Jupyter kernel (colibri.progress.interactive)."""


def prefill_progress(progress: ProgressOption, n_tokens: int, *, auto: bool = True,
                     ) -> tuple[Progress | None, DelayedBar | None]:
    """The callback a prefill of `n_tokens` reports to, and the bar to start and close
    around it (None when `progress` is a callable or nothing is shown). `auto`: whether
    None means "auto" (generate/stream) or nothing (Session.forward, the low-level call a
    decode loop makes per token)."""
    if progress is None and not auto:
        return None, None
    if progress is None or isinstance(progress, bool):
        bar = delayed_bar(progress, "prefill", n_tokens, unit="tok")
        return bar, bar
    if not callable(progress):
        raise InvalidRequestError(
            "progress must be a callable(done, total), True, False or None, not "
            f"{type(progress).__name__}"
        )
    return progress, None


def with_bar(chunks: Generator[Chunk, None, None], bar: DelayedBar | None,
             ) -> Generator[Chunk, None, None]:
    """`chunks` with `bar` started when the first is asked for (when the prefill starts)
    and closed when they end, however they end."""
    if bar is None:
        return chunks
    return _with_bar(chunks, bar)


def _with_bar(chunks: Generator[Chunk, None, None], bar: DelayedBar,
              ) -> Generator[Chunk, None, None]:
    bar.start()
    try:
        yield from chunks
    finally:
        bar.close()


class Session:
    """One conversation's state (KV cache) on a model."""

    def __init__(self, runner: Runner, core: _core.Session) -> None:
        self._runner = runner
        self._core = core
        # The Sampler restored by Session.load when one was saved (for custom loops).
        self.sampler: Sampler | None = None

    def __repr__(self) -> str:
        try:
            held = f"{self.n_tokens} of {self.context_length} tokens"
        except InvalidRequestError:
            held = "closed"
        return f"Session({held}, model {self._runner.handle.name!r})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))

    # --- the KV state: saved sessions, forks, the prompt cache (colibri.generate.session_store) ---

    @property
    def kv_bytes(self) -> int:
        """Bytes of KV state the session holds now (its allocation: the cache grows in
        steps as it fills), the MTP layer's own cache included once it drafts with MTP."""
        return int(self._core.kv_allocated_bytes) + int(self._core.mtp_kv_allocated_bytes)

    def save(self, path: str | os.PathLike[str], *, sampler: Sampler | None = None) -> None:
        """Writes the session to `path`: its tokens, its KV cache at its type, its last
        logits, and `sampler`'s settings and random state if given. Versioned and
        checksummed, written atomically (colibri.generate.session_store). After a
        rollback the last token is forwarded again first (the same bits), so that the
        file holds the logits its load is checked against; the session keeps them."""
        from .session_store import save_session

        save_session(self, path, sampler=sampler)

    @classmethod
    def load(cls, path: str | os.PathLike[str], model: HasRunner | Runner) -> Session:
        """A session of `model` restored from a file written by :meth:`save` (its
        ``sampler`` attribute holds the saved Sampler, if any). Refuses a file saved from
        another model, a corrupt, truncated or malformed one, one from a newer format, or
        one whose restored state does not reproduce its saved logits (only colibri.errors
        exceptions: the file is untrusted input)."""
        from .session_store import load_session

        return load_session(path, model)

    def fork(self, n: int | None = None) -> Session:
        """A new session of the same model holding this one's first `n` tokens (all by
        default), their KV state copied: the two then go their own ways. Forking all of
        them keeps the last logits too (the last token is forwarded once more: the same
        bits)."""
        held = self.n_tokens
        n = held if n is None else int(n)
        new = self._runner.session()
        new._core.copy_prefix_from(self._core, n)
        if n and n == held and self._core.last_logits is not None:
            new._refresh_logits()
        return new

    def _refresh_logits(self) -> None:
        """Recomputes the logits after the last token (after the KV state was replaced):
        rolls it back and forwards it again, which rewrites its KV entry with the same
        values (the forward is deterministic)."""
        last = self.token_ids[-1]
        self._core.rollback(1)
        self.forward([last])

    def forward_stats(self) -> tuple[ExpertStats, PhaseTimes]:
        """Expert cache, expert I/O and per-phase time of this session's forwards since it
        was made. Each forward's share is measured inside the engine's lock, so the
        figures are this session's alone even while other threads run other sessions of
        the same model (``Model.stats()`` has the model-wide totals)."""
        return session_stats(self._core)

    @property
    def n_tokens(self) -> int:
        """Tokens currently in the KV cache."""
        return int(self._core.n_tokens)

    @property
    def context_length(self) -> int:
        return int(self._core.context_length)

    @property
    def kv_cache_type(self) -> str:
        """How this session's KV cache stores keys and values: "f32", "f16", "bf16", "q8_0"."""
        return str(self._core.kv_type)

    def forward(
        self,
        token_ids: Sequence[int] | npt.ArrayLike,
        *,
        all_logits: bool = False,
        progress: ProgressOption = None,
    ) -> npt.NDArray[np.float32]:
        """Appends tokens and returns logits: ``[vocab]`` for the last position, or
        ``[n, vocab]`` for every position when ``all_logits``.

        A long prompt runs in chunks of ``EngineConfig.prefill_chunk`` tokens (the same bits
        as one batch); ``progress(done, total)`` is called after each. ``progress=True``
        shows a bar once the forward has run a second; None (the default here: a decode
        loop calls this per token) shows nothing. Ctrl-C stops the forward within one
        layer: KeyboardInterrupt is raised and the session is as before.
        """
        ids = self._check_ids(token_ids)
        callback, bar = prefill_progress(progress, len(ids), auto=False)
        if bar is None:
            return self._forward(ids, all_logits, callback)
        with bar:
            return self._forward(ids, all_logits, callback)

    def _forward(self, ids: npt.NDArray[np.int32], all_logits: bool,
                 progress: Progress | None) -> npt.NDArray[np.float32]:
        batcher = self._runner.batcher
        if batcher is not None:  # a server's continuous batching (colibri.generate.batching)
            return batcher.forward(self, ids, all_logits, progress)
        chunk = self._runner.handle.engine_config.prefill_chunk or 0
        result: npt.NDArray[np.float32] = self._core.forward(ids, all_logits, chunk, progress)
        return result

    def append(self, token_id: int) -> npt.NDArray[np.float32]:
        """Appends one token; returns the logits that follow it."""
        return self.forward([token_id])

    def last_routing(self) -> npt.NDArray[np.int32]:
        """Experts the router selected during the last :meth:`forward`:
        ``int32 [n_tokens, n_layers, top_k]`` in router order, -1 for dense layers
        (shape ``[0, n_layers, 0]`` for a dense model)."""
        routing: npt.NDArray[np.int32] = self._core.last_routing()
        return routing

    def last_logits(self) -> npt.NDArray[np.float32]:
        """Logits after the last token forwarded (raises when there are none)."""
        logits: npt.NDArray[np.float32] | None = self._core.last_logits
        if logits is None:
            raise InvalidRequestError(
                "the session has no logits yet: forward some tokens first"
            )
        return logits

    @property
    def token_ids(self) -> list[int]:
        """The tokens in the session, in order."""
        return [int(t) for t in self._core.token_ids()]

    def generate(
        self,
        prompt_ids: Sequence[int] = (),
        *,
        max_tokens: int = 256,
        sampling: Sampling | Mapping[str, Any] | None = None,
        stop: str | Sequence[str] = (),
        progress: ProgressOption = None,
        **options: Unpack[GenerateOptions],
    ) -> Generation:
        """Continues from the session's state: forwards ``prompt_ids`` (may be empty) and
        generates. The generated tokens stay in the session (the last one's KV entry is
        written by the next forward). ``progress`` for the prompt as in
        :meth:`Model.generate` (default "auto": a bar on a terminal or in Jupyter once the
        prefill has run a second); further options as :meth:`Model.generate`."""
        ids = self._prompt_ids(prompt_ids)
        result: dict[str, Any] = {}
        return collect(self.stream(ids, max_tokens=max_tokens, sampling=sampling, stop=stop,
                                   progress=progress, _result=result, **options), result, ids)

    def stream(
        self,
        prompt_ids: Sequence[int] = (),
        *,
        max_tokens: int = 256,
        sampling: Sampling | Mapping[str, Any] | None = None,
        stop: str | Sequence[str] = (),
        progress: ProgressOption = None,
        _result: dict[str, Any] | None = None,
        **options: Unpack[GenerateOptions],
    ) -> Generator[Chunk, None, None]:
        """Like :meth:`generate`, yielding chunks."""
        ids = self._prompt_ids(prompt_ids)
        request = parse_request({"max_tokens": max_tokens, "sampling": sampling, "stop": stop,
                                 **options}, where="Session.stream")
        callback, bar = prefill_progress(progress, len(ids)) if ids else (None, None)
        return with_bar(self._runner.stream(
            self, ids, request, {} if _result is None else _result, history=self.token_ids,
            progress=callback,
        ), bar)  # fmt: skip

    async def agenerate(
        self,
        prompt_ids: Sequence[int] = (),
        *,
        max_tokens: int = 256,
        sampling: Sampling | Mapping[str, Any] | None = None,
        stop: str | Sequence[str] = (),
        **options: Unpack[GenerateOptions],
    ) -> Generation:
        """:meth:`generate` for asyncio; a cancelled call leaves the session as it was
        before it (:mod:`colibri.generate.aio`)."""
        ids = self._prompt_ids(prompt_ids)
        result: dict[str, Any] = {}
        gen = self.stream(ids, max_tokens=max_tokens, sampling=sampling, stop=stop,
                          progress=False, _result=result, **options)
        return await agenerate_stream(gen, self, result, ids)

    def astream(
        self,
        prompt_ids: Sequence[int] = (),
        *,
        max_tokens: int = 256,
        sampling: Sampling | Mapping[str, Any] | None = None,
        stop: str | Sequence[str] = (),
        **options: Unpack[GenerateOptions],
    ) -> AsyncGenerator[Chunk, None]:
        """:meth:`stream` for asyncio: ``async for chunk in session.astream(ids)``."""
        gen = self.stream(prompt_ids, max_tokens=max_tokens, sampling=sampling, stop=stop,
                          progress=False, **options)
        return astream_stream(gen, self)

    def reset(self) -> None:
        """Empties the KV cache."""
        self._core.reset()

    def rollback(self, n: int) -> None:
        """Forgets the last ``n`` tokens (an int, 0 <= n <= n_tokens). The logits of the new
        last token are not kept: forward a token next (for example re-forward the last one
        after rolling back one more)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise InvalidRequestError(
                f"cannot roll back {n!r} tokens: rollback takes an int, not {type(n).__name__}"
            )
        count, held = int(n), self.n_tokens
        if not 0 <= count <= held:
            raise InvalidRequestError(
                f"cannot roll back {count} tokens: the session holds {held}"
            )
        self._core.rollback(count)

    def holds_prefix(self, n: int) -> bool:
        """Whether the session can go back to its first `n` tokens (:meth:`rollback`,
        :meth:`fork`, the prompt cache's copy). Always, except on a model with
        sliding-window layers: those keep only their last ``window + 64`` positions, so
        going back further than that from the end raises InvalidRequestError."""
        return bool(self._core.holds_prefix(int(n)))

    def _rollback_keeping(self, n: int, logits: npt.NDArray[np.float32]) -> None:
        """Forgets the last ``n`` tokens and keeps `logits` as the logits after the new last
        token, in one native call (speculative decoding: the verify forward computed them)."""
        self._core.rollback(int(n), np.ascontiguousarray(logits, dtype=np.float32))

    def _close(self) -> None:
        """Frees the KV cache (Model.close); every later call raises InvalidRequestError."""
        self._core.close()

    def _prompt_ids(self, prompt_ids: Sequence[int]) -> list[int]:
        """A continuation's token ids, checked (may be empty)."""
        if isinstance(prompt_ids, str):
            raise InvalidRequestError("a session continues from token ids, not text: pass "
                                      "model.tokenizer.encode(text)")
        return [int(t) for t in self._check_ids(prompt_ids)] if len(prompt_ids) else []

    def _check_ids(self, token_ids: Sequence[int] | npt.ArrayLike) -> npt.NDArray[np.int32]:
        arr = np.asarray(token_ids)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.ndim != 1:
            raise InvalidRequestError(f"token ids must be a 1-D sequence, got shape {arr.shape}")
        if arr.size == 0:
            raise InvalidRequestError("forward needs at least one token id")
        if not np.issubdtype(arr.dtype, np.integer):
            raise InvalidRequestError(f"token ids must be integers, got dtype {arr.dtype}")
        vocab = self._runner.handle.config.vocab_size
        bad = np.flatnonzero((arr < 0) | (arr >= vocab))
        if bad.size:
            i = int(bad[0])
            raise TokenOutOfRangeError(
                f"token id {int(arr[i])} at index {i} is outside the vocabulary [0, {vocab})"
            )
        return arr.astype(np.int32)
