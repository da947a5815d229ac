"""Continuous batching: several sessions of one model advanced in ONE forward.

:func:`forward_batch` is the primitive: session ``i`` appends ``token_ids[i]`` (a decode
token, a prefill chunk, or several draft tokens) and every row runs through the same
forward: the dense matmuls over all rows together (each weight read once per step),
attention per row against its own session's KV cache, and the MoE block over the union
of the rows' experts (each distinct routed expert read and multiplied once for all the
rows routed to it). A row's logits are the same bits alone or in any batch (the kernels
are per row, reductions in fixed order: docs/serving.md, tests/generate/test_batch_forward.py).

:class:`StepBatcher` turns concurrent ``Session.forward`` calls from many threads (the
server's generations, each with its own sampler, stop strings and constraints) into such
steps: while it is attached to a model (``StepBatcher.attach``), a session's forward
waits for the next step instead of running alone, and a prompt goes in chunks of
``step_tokens``, one chunk per step, so it shares the steps with the running decodes
instead of stalling them for its whole length.

Sampling belongs to the step: a generation driven without pause between its forwards
(the server's, :func:`colibri.generate.aio.pump_stream`) is registered with
:meth:`StepBatcher.enter`;
after each step the batcher waits for every registered generation of that step to sample
its row and submit its next forward before it forms the next step (up to ``patience``
seconds, for a sampler that blocks), so with N generations decoding every step carries N
rows. The samplers run on the generations' own threads, each on its own logits row, right
after the batched forward.

Prefix copies between steps (:meth:`StepBatcher.copy_prefix`, colibri.generate.prefix_share): a
generation following another's shared prompt prefix has the step thread copy that
prefix's KV state into its session between two steps, once the leader holds it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .. import _core
from ..errors import InvalidRequestError

if TYPE_CHECKING:
    from .runner import HasRunner, Runner
    from .session import Session

__all__ = ["StepBatcher", "StepCancelled", "forward_batch"]

Logits = npt.NDArray[np.float32]


def forward_batch(sessions: Sequence[Session], token_ids: Sequence[Sequence[int]], *,
                  all_logits: bool | Sequence[bool] = False) -> list[Logits]:
    """Appends ``token_ids[i]`` to ``sessions[i]`` for every i in one forward and returns
    each session's logits (``[vocab]`` after its last token, or ``[n, vocab]`` with
    ``all_logits``). The sessions must be distinct sessions of one model. All or nothing:
    on any error (a bad id, a context overflow, a failed expert read) no session changes."""
    if len(sessions) != len(token_ids):
        raise InvalidRequestError(
            f"forward_batch: {len(sessions)} sessions but {len(token_ids)} token lists")
    if not sessions:
        raise InvalidRequestError("forward_batch needs at least one session")
    runner = sessions[0]._runner
    if any(s._runner is not runner for s in sessions):
        raise InvalidRequestError("forward_batch: the sessions belong to different models")
    flags = ([bool(all_logits)] * len(sessions) if isinstance(all_logits, bool)
             else [bool(a) for a in all_logits])
    if len(flags) != len(sessions):
        raise InvalidRequestError("forward_batch: give one all_logits flag per session")
    ids = [s._check_ids(t) for s, t in zip(sessions, token_ids, strict=True)]
    out: list[Logits] = _core.forward_batch([s._core for s in sessions], ids, flags)
    return out


class StepCancelled(Exception):
    """A forward dropped before its step ran: its generation was cancelled
    (:meth:`StepBatcher.cancel`)."""


@dataclass(eq=False)
class _Copy:
    dst: Session
    src: Session
    tokens: list[int]  # the prefix: src must hold exactly these first
    src_ended: Callable[[], bool]  # the leader's generation has ended: give up
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


@dataclass
class _Row:
    session: Session
    ids: npt.NDArray[np.int32]
    all_logits: bool | None  # None: no logits (a prompt chunk before the last)
    submitted: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Logits | None = None
    error: BaseException | None = None


class StepBatcher:
    """Runs the forwards of concurrent generations of one model as batched steps, on a
    thread of its own.

    A step starts when every generation registered with :meth:`enter` that was in the
    last step has sampled its row and is waiting for its next forward (at most
    ``patience`` seconds after the oldest waiting forward arrived), and every generation
    that has :meth:`join`-ed is waiting for its forward, or ``window`` seconds (up to half
    the last decode step's time, at most 50 ms) after the oldest waiting forward arrived
    (a new generation still setting up joins the next step). A step takes every waiting
    decode row
    and prompt chunks up to ``step_tokens`` tokens in all (at least one chunk), at most
    ``max_rows`` rows. Forwards of sessions that never joined (a prompt-cache refresh) are
    served too, in the next step."""

    def __init__(self, *, step_tokens: int = 256, window: float = 0.004,
                 max_rows: int = 64, patience: float = 1.0, record: bool = False) -> None:
        if step_tokens < 1 or window < 0 or max_rows < 1 or patience < 0:
            raise ValueError("step_tokens and max_rows must be >= 1, window and patience >= 0")
        self.step_tokens = step_tokens
        self.window = window
        self.max_rows = max_rows
        self.patience = patience
        self.steps = 0  # batched forwards run
        self.rows = 0  # rows in them (steps / rows: the mean batch size)
        self.row_counts: Counter[int] = Counter()  # rows in a step -> steps with that many
        # With `record`: the sessions (id()) of each step, in order (tests).
        self.history: list[tuple[int, ...]] | None = [] if record else None
        self._cond = threading.Condition()
        self._pending: list[_Row] = []
        self._active = 0
        self._looping: set[int] = set()  # sessions of entered generations (id())
        self._expect: set[int] = set()  # of those, the ones sampling after the last step
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._runner: Runner | None = None
        self._last_step = 0.0  # seconds of the last decode-only step
        self._copies: list[_Copy] = []  # prefix copies waiting for their leader
        self._paused: set[int] = set()  # entered generations waiting in copy_prefix
        self._cancelled: set[int] = set()  # entered generations cancelled, until their exit
        self.copies = 0  # prefix copies made

    # --- lifetime ---------------------------------------------------------------------

    def attach(self, model: HasRunner | Runner) -> None:
        """Routes every Session.forward of `model` through this batcher (and starts its
        thread)."""
        from .runner import runner_of

        runner = runner_of(model)
        if runner.batcher is not None:
            raise InvalidRequestError("the model already has a step batcher attached")
        self._runner = runner
        self._thread = threading.Thread(target=self._run, name="colibri-steps", daemon=True)
        self._thread.start()
        runner.batcher = self

    def detach(self) -> None:
        """Stops routing (forwards run alone again), serves what is waiting, stops the
        thread. Idempotent."""
        if self._runner is not None and self._runner.batcher is self:
            self._runner.batcher = None
        with self._cond:
            self._stopped = True
            self._fail_copies(lambda c: True)
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def wake(self) -> None:
        """Something a waiting prefix copy depends on changed (its leader ended)."""
        with self._cond:
            self._cond.notify_all()

    def join(self) -> None:
        """A generation starts: steps wait for its forwards (up to the window)."""
        with self._cond:
            self._active += 1

    def leave(self) -> None:
        with self._cond:
            self._active = max(0, self._active - 1)
            self._cond.notify_all()

    def enter(self, session: Session) -> None:
        """A generation on `session` runs its decode loop without pause (it samples and
        submits its next forward right after each step, never waiting for a consumer):
        :meth:`join`, and from its next step on, steps wait for its row."""
        with self._cond:
            self._active += 1
            self._looping.add(id(session))

    def exit(self, session: Session) -> None:
        """The generation on `session` has made its last forward: steps stop waiting
        (:meth:`leave`)."""
        with self._cond:
            self._active = max(0, self._active - 1)
            self._looping.discard(id(session))
            self._expect.discard(id(session))
            self._cancelled.discard(id(session))
            self._cond.notify_all()

    def cancel(self, session: Session) -> None:
        """The entered generation on `session` is cancelled (its client left): its forward
        waiting for a step, and any it submits until its :meth:`exit`, raise
        :class:`StepCancelled` in its thread instead of running (the session is as before
        that forward). A step already running with its row finishes. Without this, a
        cancelled generation ran its next step, a whole prompt for one cut during its
        prefill, before it could stop."""
        key = id(session)
        with self._cond:
            if key not in self._looping:
                return  # not entered, or already out (nothing to mark: ids are reused)
            self._cancelled.add(key)
            self._expect.discard(key)
            dropped = [r for r in self._pending if r.session is session]
            self._pending = [r for r in self._pending if r.session is not session]
            self._cond.notify_all()
        for r in dropped:
            r.error = StepCancelled("the generation was cancelled")
            r.done.set()

    @property
    def active(self) -> int:
        return self._active

    def copy_prefix(self, dst: Session, src: Session, tokens: Sequence[int],
                    src_ended: Callable[[], bool]) -> bool:
        """Copies the KV state of `src`'s first ``len(tokens)`` tokens into `dst` (the
        core's ``copy_prefix_from``), on the step thread between two steps, once `src`
        holds exactly `tokens` first and its owner is waiting for a step (so nothing else
        touches `src`). Blocks until then; meanwhile steps do not wait for `dst`'s
        generation. False, `dst` unchanged, when `src_ended()` turns true first (the
        leader's generation ended, was cancelled or failed: call :meth:`wake`), the copy
        failed, or the batcher is detached."""
        job = _Copy(dst, src, list(tokens), src_ended)
        key = id(dst)
        with self._cond:
            if self._stopped:
                return False
            paused = key in self._looping
            if paused:  # not waited for while it waits for its leader
                self._looping.discard(key)
                self._expect.discard(key)
                self._active = max(0, self._active - 1)
                self._paused.add(key)
            self._copies.append(job)
            self._cond.notify_all()
        try:
            job.done.wait()
        finally:
            with self._cond:
                if paused:
                    self._paused.discard(key)
                    self._looping.add(key)
                    self._active += 1
        return job.ok

    def _fail_copies(self, which: Callable[[_Copy], bool]) -> None:
        """Releases the waiting copies `which` selects, unmade (the lock held)."""
        keep = []
        for c in self._copies:
            if which(c):
                c.done.set()
            else:
                keep.append(c)
        self._copies = keep

    def _ready_copies(self) -> list[_Copy]:
        """The copies whose leader has a row waiting (its owner blocked until the step
        ends) and holds enough tokens; gives up those whose leader ended (lock held)."""
        self._fail_copies(lambda c: c.src_ended())
        queued = {id(r.session) for r in self._pending}
        ready = [c for c in self._copies
                 if id(c.src) in queued and c.src.n_tokens >= len(c.tokens)]
        self._copies = [c for c in self._copies if c not in ready]
        return ready

    @staticmethod
    def _copy(job: _Copy) -> None:
        n = len(job.tokens)
        try:
            if job.src._core.token_ids()[:n] == job.tokens:
                job.dst._core.copy_prefix_from(job.src._core, n)
                job.ok = True
        except Exception:  # the follower prefills the prefix itself
            job.ok = False
        finally:
            job.done.set()

    # --- the calling side ---------------------------------------------------------------

    def forward(self, session: Session, ids: npt.NDArray[np.int32], all_logits: bool,
                progress: Callable[[int, int], object] | None) -> Logits:
        """Session.forward through the steps: the prompt in chunks of ``step_tokens``
        (the same bits as one batch). On an error after some chunks went in, those are
        rolled back with the session's last logits kept: the session is as before."""
        total = len(ids)
        n0 = session.n_tokens
        before = session._core.last_logits
        pieces: list[Logits] = []
        try:
            for start in range(0, total, self.step_tokens):
                piece = ids[start:start + self.step_tokens]
                last = start + len(piece) == total
                out = self._submit(session, piece, all_logits if all_logits or last else None)
                if out is not None:
                    pieces.append(out)
                if progress is not None:
                    progress(start + len(piece), total)
        except BaseException:
            added = session.n_tokens - n0
            if added > 0:
                session._core.rollback(added, before)
            raise
        if not all_logits:
            return pieces[-1]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _submit(self, session: Session, ids: npt.NDArray[np.int32], all_logits: bool | None,
                ) -> Logits | None:
        row = _Row(session, ids, all_logits)
        with self._cond:
            if id(session) in self._cancelled:
                raise StepCancelled("the generation was cancelled")
            if self._stopped:  # detached meanwhile: run alone
                return self._alone(row)
            self._pending.append(row)
            self._cond.notify_all()
        row.done.wait()
        if row.error is not None:
            raise row.error
        return row.result

    @staticmethod
    def _alone(row: _Row) -> Logits | None:
        out: list[Logits | None] = _core.forward_batch([row.session._core], [row.ids],
                                                       [row.all_logits])
        return out[0]

    # --- the step thread ----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    if self._copies:
                        self._fail_copies(lambda c: c.src_ended())
                    self._cond.wait()
                if not self._pending:
                    return  # stopped, nothing waiting
                first = self._pending[0].submitted
                while not self._stopped:
                    if self._expect - {id(r.session) for r in self._pending}:
                        left = first + self.patience  # a generation sampling its row
                    elif len(self._pending) < self._active:
                        left = first + self._window()  # one setting up
                    else:
                        break
                    left -= time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                copies = self._ready_copies() if self._copies else []
                batch = self._take()
                self._expect.difference_update(id(r.session) for r in batch)
            for job in copies:  # the leaders' owners wait for their rows: safe to read
                self._copy(job)
                self.copies += job.ok
            self._step(batch)

    def _window(self) -> float:
        """How long a step waits for stragglers: ``window``, or half the last step's time
        when that is longer (a step that takes 60 ms is worth 30 ms of waiting for a row
        more), at most 50 ms."""
        return min(max(self.window, 0.5 * self._last_step), max(self.window, 0.05))

    def _take(self) -> list[_Row]:
        """The rows of the next step (the lock held): every decode row, prompt chunks up to
        step_tokens, one row per session, at most max_rows."""
        batch: list[_Row] = []
        seen: set[int] = set()
        budget = self.step_tokens
        rest: list[_Row] = []
        for row in self._pending:
            key = id(row.session)
            n = len(row.ids)
            fits = n == 1 or budget >= n
            if key in seen or len(batch) >= self.max_rows or not fits:
                rest.append(row)
                continue
            seen.add(key)
            if n > 1:
                budget -= n
            batch.append(row)
        self._pending = rest
        return batch

    def _step(self, batch: list[_Row]) -> None:
        t0 = time.monotonic()
        try:
            outs: list[Logits | None] = _core.forward_batch(
                [r.session._core for r in batch], [r.ids for r in batch],
                [r.all_logits for r in batch])
            for r, out in zip(batch, outs, strict=True):
                r.result = out
            self.steps += 1
            self.rows += len(batch)
            self.row_counts[len(batch)] += 1
            if self.history is not None:
                self.history.append(tuple(id(r.session) for r in batch))
        except BaseException as exc:
            if len(batch) == 1:
                batch[0].error = exc
            else:
                # Nothing changed (all or nothing): each row alone, so that one request's
                # error (its context full, its session closed) is its own.
                for r in batch:
                    try:
                        r.result = self._alone(r)
                    except BaseException as e:
                        r.error = e
        finally:
            if all(len(r.ids) == 1 for r in batch):  # decode steps set the window
                self._last_step = time.monotonic() - t0
            with self._cond:  # before they wake: the next step waits for their next rows
                self._expect.update(key for r in batch
                                    if (key := id(r.session)) in self._looping)
            for r in batch:
                r.done.set()
