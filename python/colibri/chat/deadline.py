"""A deadline that stops a chat-template render or compile (the rendering or compiling
thread's CPU time; or the wall clock) wherever its Python code is.

The render budget (chat_limits.py) checks its deadline in the hooks the compiled template
calls. Some operations run long between two hooks: a filter's own loop over a large value
(``select``, ``unique``, ``title``, ``pprint``, ``tojson`` with an indent), or the size
estimate itself. :class:`Deadline` covers those too: a watchdog thread raises
:class:`DeadlinePassed` in the rendering thread when the deadline passes (CPython's
``PyThreadState_SetAsyncExc``: the exception is raised at the next bytecode the thread
runs, inside any Python function). One C call is not interrupted; the size limits keep
each of those to milliseconds.

Both deadlines count the working thread's CPU time: a busy machine, or another thread
holding the GIL, slows a real template down without refusing it (with a wall-clock render
deadline of 0.4 s, Kimi-K3's template, which renders in 0.5 ms, was refused once in a CI
run on a loaded 2-core machine), while a template built to run or compile for seconds is
still stopped.

The exception can arrive only between ``__enter__`` and the end of ``__exit__``, never
after: ``__exit__`` marks the render over under the same lock the watchdog fires under,
and withdraws an exception fired but not yet raised. Callers catch DeadlinePassed around
the whole ``with`` block (it can be raised inside ``__exit__`` itself).
"""

from __future__ import annotations

import ctypes
import threading
import time
from types import TracebackType

# Without argtypes, ctypes passes None as NULL, which withdraws a pending exception.
_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class DeadlinePassed(BaseException):
    """Raised in the rendering thread at its deadline. A BaseException, so that no
    ``except Exception`` on the way (jinja's, a filter's) swallows it."""


class Deadline:
    """``with Deadline(at):`` the block is interrupted by DeadlinePassed once
    ``time.monotonic()`` passes ``at``; ``with Deadline.cpu(seconds):`` once the thread
    that entered it has used ``seconds`` more of CPU time. One thread per block, for its
    duration."""

    def __init__(self, at: float, clock: int | None = None) -> None:
        self._at = at
        self._clock = clock  # a clock id for time.clock_gettime; None: time.monotonic
        self._tid = threading.get_ident()
        self._lock = threading.Lock()
        self._over = threading.Event()
        self._fired = False

    @classmethod
    def cpu(cls, seconds: float) -> Deadline:
        clock = time.pthread_getcpuclockid(threading.get_ident())
        return cls(time.clock_gettime(clock) + seconds, clock)

    def _left(self) -> float:
        now = time.monotonic() if self._clock is None else time.clock_gettime(self._clock)
        return self._at - now

    def __enter__(self) -> Deadline:
        threading.Thread(target=self._watch, name="colibri-template-deadline",
                         daemon=True).start()
        return self

    def _watch(self) -> None:
        # A thread's CPU time advances no faster than the wall clock, so waiting out what
        # is left and looking again never passes the deadline by more than one wait's slack.
        while (left := self._left()) > 0.0:
            if self._over.wait(left):
                return
        with self._lock:
            if not self._over.is_set():
                self._fired = True
                _set_async_exc(ctypes.c_ulong(self._tid), ctypes.py_object(DeadlinePassed))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            self._over.set()
            if self._fired:  # fired but perhaps not yet raised: withdrawn
                _set_async_exc(ctypes.c_ulong(self._tid), None)


__all__ = ["Deadline", "DeadlinePassed"]
