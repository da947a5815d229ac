"""The request scheduler: the one object that owns the model on the server's side.

A request is admitted into a bounded queue (:meth:`Scheduler.admit` raises
:class:`~colibri.server.errors.QueueFull`, a 429, when ``max_running + max_queue``
requests are already in), waits for one of ``max_running`` slots, then streams its tokens
from ``Model.astream`` (run ahead of its consumer: colibri.generate.aio.pump_stream): its own
session, sampler, stop strings and constraints. A
request's ``n`` samples run one after the other in its slot.

Continuous batching: with ``max_running > 1`` the scheduler attaches a
:class:`~colibri.generate.batching.StepBatcher` to the model, so the forwards of every running
generation go through shared steps: one batched forward per step advances every running
sequence by a token (each weight, and each routed expert the step's rows need, read once
for all of them; each generation samples its row right after the step, and the next step
waits for it), a new request's prompt goes in chunks of ``step_tokens`` between the
decodes, and requests join and leave between steps. A row's logits do not depend on the
batch (docs/serving.md), so a greedy request gives the same tokens alone or under load.
With the prompt cache on, requests running at the same time share a common prompt prefix
(colibri.generate.prefix_share): a follower copies it from its leader's session between steps,
within its own KV reservation.

Memory: each slot holds one session, whose KV cache grows with its tokens up to the
context length. A request reserves the KV bytes of the positions it may fill (its prompt
plus ``max_tokens``, at most the context) when it starts; it starts only when a slot is
free AND the reservations of the running requests plus its own fit ``kv_budget`` (a
request needing more than the whole budget runs alone). Otherwise it waits in the queue,
in arrival order (beyond the queue: 429), and never oversubscribes the KV memory.

Cancellation: a ticket's consumer being cancelled (the client disconnected) raises
CancelledError inside the stream, which stops between tokens (a forward still waiting
for its step is dropped; the session, the request's own, is not rolled back:
colibri.generate.aio.pump_stream); the slot is released on the way out. The per-request
deadline (queue wait included) cancels the same way and raises
:class:`~colibri.server.errors.RequestTimeout`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from ..engine.budget import kv_layers_bytes, kv_ring_positions
from ..engine.streaming import kv_layer_widths, kv_layer_windows, mtp_kv_layer_widths
from ..generate.batching import StepBatcher
from ..generate.generation import Chunk
from ..model import Model
from ..sources.linear_attn import linear_state_bytes
from ..sources.v4_units import v4_compressed_state_bytes
from .errors import QueueFull, RequestTimeout, ShuttingDown
from .metrics import Metrics

_T = TypeVar("_T")


class Scheduler:
    """Admits requests into a bounded queue and runs ``max_running`` generations at a time
    on ``model``, batched into shared steps when there are several (see the module's
    docstring). ``step_tokens``: prompt tokens per step; ``step_window``: seconds a step
    waits for a running generation that is not ready yet. ``kv_budget``: bytes of KV
    state all running requests may reserve (default: ``max_running`` sessions at the full
    context, i.e. no limit beyond the slots)."""

    def __init__(self, model: Model, metrics: Metrics | None = None, *, max_queue: int = 16,
                 max_running: int = 1, timeout: float | None = 600.0,
                 retry_after: int = 1, step_tokens: int = 256,
                 step_window: float = 0.004, kv_budget: int | None = None) -> None:
        if max_queue < 0 or max_running < 1:
            raise ValueError("max_queue must be >= 0 and max_running >= 1")
        if kv_budget is not None and kv_budget < 1:
            raise ValueError("kv_budget must be >= 1 byte")
        self.model = model
        self.metrics = metrics if metrics is not None else Metrics()
        self.max_queue = max_queue
        self.max_running = max_running
        self.timeout = timeout
        self.retry_after = retry_after
        self.waiting = 0  # admitted, waiting for a slot
        self.running = 0  # holding a slot
        self.draining = False  # set at shutdown: new requests get 503
        self.kv_fixed_bytes = fixed_state_bytes(model)
        self.kv_position_bytes = kv_position_bytes(model)
        self._kv_rings = _ring_layout(model)
        self.kv_budget = (kv_budget if kv_budget is not None
                          else max_running * self.request_kv_bytes(model.context_length))
        self.kv_reserved = 0  # bytes reserved by the running requests
        self._queue: deque[Ticket] = deque()  # tickets waiting in __aenter__, in order
        self.batcher: StepBatcher | None = None
        if max_running > 1 and model.runner.batcher is None:
            self.batcher = StepBatcher(step_tokens=step_tokens, window=step_window,
                                       max_rows=max_running + 1)
            self.batcher.attach(model)

    def close(self) -> None:
        """Detaches the step batcher (the model's forwards run alone again)."""
        if self.batcher is not None:
            self.batcher.detach()

    def admit(self, timeout: float | None = None, positions: int | None = None) -> Ticket:
        """A place in the queue, or QueueFull (429) / ShuttingDown (503) at once.
        ``timeout`` (seconds, default the scheduler's) bounds queue wait plus generation;
        ``positions``: the KV positions the request may fill (prompt + max_tokens; default
        and at most the context length)."""
        if self.draining:
            raise ShuttingDown(self.retry_after)
        if self.waiting + self.running >= self.max_running + self.max_queue:
            self.metrics.rejected_total += 1
            raise QueueFull(self.waiting, self.retry_after)
        self.waiting += 1
        n = self.model.context_length if positions is None else max(1, positions)
        kv = self.request_kv_bytes(min(n, self.model.context_length))
        return Ticket(self, self.timeout if timeout is None else timeout, kv)

    def request_kv_bytes(self, positions: int) -> int:
        """KV bytes a session holding `positions` positions takes: the state that does not
        grow with positions (fixed_state_bytes) and kv_position_bytes each, except on a
        model whose sliding-window layers keep a ring (gpt-oss): those layers hold at most
        their ring, so a short request costs more per position than the full-context
        average and a long one less (counted exactly)."""
        if self._kv_rings is None:
            return self.kv_fixed_bytes + positions * self.kv_position_bytes
        widths, windows, kv_type, mtp = self._kv_rings
        return (self.kv_fixed_bytes + kv_layers_bytes(widths, positions, kv_type, windows)
                + kv_layers_bytes(mtp, positions, kv_type))

    def _dispatch(self) -> None:
        """Starts the queued tickets at the head of the queue while a slot is free and
        their KV reservation fits (in the event loop's thread: no lock needed)."""
        while self._queue and self.running < self.max_running:
            t = self._queue[0]
            if self.running and self.kv_reserved + t.kv > self.kv_budget:
                if not t._kv_wait_counted:
                    self.metrics.kv_waits_total += 1
                    t._kv_wait_counted = True
                return  # waits for KV room, and so does everyone behind it (FIFO)
            self._queue.popleft()
            self.waiting -= 1
            self.running += 1
            self.kv_reserved += t.kv
            t._state = "running"
            t._go.set()

    async def drain(self) -> None:
        """Refuses new requests and waits until the admitted ones have finished."""
        self.draining = True
        while self.waiting or self.running:
            await asyncio.sleep(0.05)


def fixed_state_bytes(model: Model) -> int:
    """Bytes of a session's state that do not grow with its positions: the linear-attention
    layers' recurrent state (Qwen3-Next, Kimi-Linear) and DeepSeek-V4's compressed layers'
    state, which a session reserves for the whole context when it opens."""
    c = model.config
    return linear_state_bytes(c) + v4_compressed_state_bytes(c, model.context_length)


def kv_position_bytes(model: Model) -> int:
    """KV bytes one position of a session takes (every layer's keys and values at the
    model's KV type, and the MTP layer's own cache on a model that has one: any request may
    draft with it): the budget plan's one session at the full context, less the fixed
    state (fixed_state_bytes), per position."""
    fixed = fixed_state_bytes(model)
    mem = model.stats().memory
    if mem is not None and mem.session_kv_bytes > 0:
        return max(1, -(-(mem.session_kv_bytes - fixed) // model.context_length))
    s = model.session()  # no plan: measure a session's allocation for one position
    s.forward([0])
    return max(1, s.kv_bytes - fixed)


def _ring_layout(model: Model) -> tuple[list[tuple[int, int]], list[int], str,
                                        list[tuple[int, int]]] | None:
    """(per-layer KV widths, windows, KV type, the MTP layer's widths) of a model whose
    sessions keep sliding-window rings at its context; None when none do (every layer's KV
    grows with the positions)."""
    c = model.config
    windows = kv_layer_windows(c)
    if not any(kv_ring_positions(w, model.context_length) for w in windows):
        return None
    mem = model.stats().memory
    mtp = mtp_kv_layer_widths(c) if mem is not None and mem.mtp_kv_bytes else []
    return kv_layer_widths(c), windows, model.kv_cache_type, mtp


async def _within(aw: Awaitable[_T], seconds: float | None) -> _T:
    """`aw`'s result, or asyncio.TimeoutError after `seconds` (`aw` is cancelled then).
    Not ``asyncio.wait_for``: before Python 3.12 it drops a cancellation that comes in
    the same turn of the loop as the result (it returns the result instead), and the
    generation of a client that had gone then ran on to its end."""
    step = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({step}, timeout=seconds)
    except asyncio.CancelledError:
        step.cancel()  # the generation stops (colibri.generate.aio.pump_stream)
        await asyncio.gather(step, return_exceptions=True)
        raise
    if not done:
        step.cancel()
        await asyncio.gather(step, return_exceptions=True)
        raise asyncio.TimeoutError
    return step.result()


class Ticket:
    """One admitted request: ``async with ticket:`` waits for a slot (within the deadline)
    and frees it at exit; :meth:`stream` runs one generation in it. :meth:`release` frees
    the queue place of a ticket that never ran (a client gone before its turn)."""

    def __init__(self, scheduler: Scheduler, timeout: float | None, kv: int = 0) -> None:
        self._s = scheduler
        self.timeout = timeout
        self.kv = kv  # KV bytes it reserves while running
        self._go = asyncio.Event()
        self._kv_wait_counted = False
        self.admitted = time.perf_counter()
        self.deadline = None if timeout is None else self.admitted + timeout
        self._state = "queued"  # -> "running" -> "done"
        self._first_token = False

    def _left(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.perf_counter())

    async def __aenter__(self) -> Ticket:
        s = self._s
        if self._state != "queued":
            raise RuntimeError("a ticket runs once")
        s._queue.append(self)
        s._dispatch()
        try:
            await _within(self._go.wait(), self._left())
        except asyncio.TimeoutError:
            self.release()
            s.metrics.timeouts_total += 1
            raise RequestTimeout(self.timeout or 0.0) from None
        except BaseException:
            self.release()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()

    def release(self) -> None:
        """Gives the queue place or the slot back (idempotent)."""
        s = self._s
        if self._state == "queued":
            s.waiting -= 1
            if self in s._queue:
                s._queue.remove(self)
        elif self._state == "running":
            s.running -= 1
            s.kv_reserved -= self.kv
        self._state = "done"
        s._dispatch()

    async def stream(self, prompt_ids: Sequence[int], options: Mapping[str, Any],
                     ) -> AsyncIterator[Chunk]:
        """The chunks of one generation of `prompt_ids` with the call `options` of
        ``Model.astream``, within the ticket's deadline. Counts the request's figures."""
        if self._state != "running":
            raise RuntimeError("Ticket.stream needs the slot: use `async with ticket:` first")
        m = self._s.metrics
        m.prompt_tokens_total += len(prompt_ids)
        # The generation runs ahead on its own thread (colibri.generate.aio.pump_stream): it samples
        # each token right after its step and submits the next forward at once, and the
        # steps wait for it, so every running request is in every step.
        chunks = self._s.model._apump(prompt_ids, options)
        t_first = None
        n = 0
        try:
            while True:
                try:
                    chunk = await _within(anext(chunks), self._left())
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    m.timeouts_total += 1
                    raise RequestTimeout(self.timeout or 0.0) from None
                if chunk.token_id is not None:
                    n += 1
                    m.generated_tokens_total += 1
                    now = time.perf_counter()
                    if t_first is None:
                        t_first = now
                        if not self._first_token:
                            self._first_token = True
                            m.ttft.observe(now - self.admitted)
                yield chunk
        except asyncio.CancelledError:
            m.cancelled_total += 1
            raise
        finally:
            await chunks.aclose()
            if t_first is not None and n > 1:
                seconds = time.perf_counter() - t_first
                m.decode_seconds_total += seconds
                m.decode_tokens_total += n - 1
                m.last_decode_tok_s = (n - 1) / seconds if seconds > 0 else 0.0
