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

from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from . import _core
from .errors import InvalidRequestError, TokenOutOfRangeError
from .generation import Chunk, Generation
from .sampling import Sampling

if TYPE_CHECKING:
    from .model import Model

Progress = Callable[[int, int], object]
"""``progress(done, total)``: called after each prefill chunk with the tokens forwarded so
far and the total, in the calling thread; an exception it raises stops the forward (the
session is then unchanged)."""


class Session:
    """One conversation's state (KV cache) on a model."""

    def __init__(self, model: Model, core: _core.Session) -> None:
        self._model = model
        self._core = core

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
        progress: Progress | None = None,
    ) -> npt.NDArray[np.float32]:
        """Appends tokens and returns logits: ``[vocab]`` for the last position, or
        ``[n, vocab]`` for every position when ``all_logits``.

        A long prompt runs in chunks of ``EngineConfig.prefill_chunk`` tokens (the same bits
        as one batch); ``progress(done, total)`` is called after each. Ctrl-C stops the
        forward within one layer: KeyboardInterrupt is raised and the session is as before.
        """
        ids = self._check_ids(token_ids)
        if progress is not None and not callable(progress):
            raise InvalidRequestError(
                f"progress must be a callable(done, total), not {type(progress).__name__}"
            )
        chunk = self._model.engine_config.prefill_chunk or 0
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
        progress: Progress | None = None,
    ) -> Generation:
        """Continues from the session's state: forwards ``prompt_ids`` (may be empty) and
        generates. The generated tokens stay in the session (the last one's KV entry is
        written by the next forward). ``progress`` as in :meth:`forward`, for the prompt."""
        chunks: list[str] = []
        result: dict[str, Any] = {}
        ids = [int(t) for t in prompt_ids]
        for chunk in self.stream(ids, max_tokens=max_tokens, sampling=sampling, stop=stop,
                                 progress=progress, _result=result):
            chunks.append(chunk.text)
        return Generation("".join(chunks), result["generated"], result["finish"],
                          result["stats"], ids)

    def stream(
        self,
        prompt_ids: Sequence[int] = (),
        *,
        max_tokens: int = 256,
        sampling: Sampling | Mapping[str, Any] | None = None,
        stop: str | Sequence[str] = (),
        progress: Progress | None = None,
        _result: dict[str, Any] | None = None,
    ) -> Generator[Chunk, None, None]:
        """Like :meth:`generate`, yielding chunks."""
        ids = [int(t) for t in prompt_ids]
        if ids:
            self._check_ids(ids)
        return self._model._stream(
            self, ids, max_tokens, sampling, stop, {} if _result is None else _result,
            history=self.token_ids, progress=progress,
        )  # fmt: skip

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

    def _close(self) -> None:
        """Frees the KV cache (Model.close); every later call raises InvalidRequestError."""
        self._core.close()

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
        vocab = self._model.config.vocab_size
        bad = np.flatnonzero((arr < 0) | (arr >= vocab))
        if bad.size:
            i = int(bad[0])
            raise TokenOutOfRangeError(
                f"token id {int(arr[i])} at index {i} is outside the vocabulary [0, {vocab})"
            )
        return arr.astype(np.int32)
