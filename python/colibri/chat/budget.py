"""The limits one chat-template render runs under, and its running totals.

:class:`TemplateLimits` is the user's setting; :class:`Budget` counts what one render (or
one compile-time constant folding) has used against it, and :func:`text_size` estimates
how long a value's text is without building it. The checks that use them are in
chat_prechecks.py (operations and filters, before they run) and chat_limits.py (the
environment's hooks); see chat_limits.py for the whole picture.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
import time
from collections.abc import Mapping

from jinja2.utils import Namespace


@dataclasses.dataclass(frozen=True)
class TemplateLimits:
    """What one chat-template render may use (see the module docstring)."""

    # Render deadline, CPU seconds of the rendering thread, plus 0.5 s per MiB of input.
    # Real templates render in about 2 ms; with compile_seconds, a refused template costs
    # under 1 s in all. CPU time, not wall clock: a busy machine (or a GIL held by another
    # thread) slows a real template down without refusing it.
    seconds: float = 0.4
    # Compile deadline, CPU seconds of the compiling thread: the largest real templates
    # (gpt-oss's, Gemma 4's, Kimi's, 15-17 KB) compile in 0.11-0.17 s.
    compile_seconds: float = 0.4
    max_chars: int = 1 << 20  # any built value and the output, plus 4 x the input size
    max_range: int = 100_000  # items in one range()
    max_iterations: int = 1_000_000  # loop iterations per render, plus 100 per input item
    max_depth: int = 64  # nested calls
    max_int_bits: int = 1 << 14  # an int a template computes (about 4,900 digits)
    built_factor: int = 64  # all values built in one render: at most this many max_chars
    # The template's own text (the largest real template known, gpt-oss's, is 16.7 KB):
    # bounds what the compile deadline cannot interrupt, Python's compiler on Jinja's output.
    max_source_chars: int = 128 << 10


DEFAULT_LIMITS = TemplateLimits()


class LimitExceeded(Exception):
    """A chat template crossed one of its TemplateLimits."""


class Budget:
    """The running totals of one render (or of one compile-time constant folding)."""

    __slots__ = ("built", "clock", "deadline", "depth", "iterations", "limits", "max_built",
                 "max_chars", "max_iterations", "seconds", "ticks")

    def __init__(self, limits: TemplateLimits, input_chars: int = 0, input_items: int = 0):
        self.limits = limits
        self.seconds = limits.seconds + 0.5 * input_chars / (1 << 20)
        # The CPU clock of the thread that renders (the one that creates the budget).
        self.clock = time.pthread_getcpuclockid(threading.get_ident())
        self.deadline = time.clock_gettime(self.clock) + self.seconds
        self.max_chars = limits.max_chars + 4 * input_chars
        # Every value built counts here too, so a loop that builds and drops large strings
        # (or keeps references to them in a block's buffer) stops long before memory does.
        self.max_built = limits.built_factor * self.max_chars
        self.built = 0
        self.max_iterations = limits.max_iterations + 100 * input_items
        self.iterations = 0
        self.depth = 0
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1
        if not self.ticks & 63 and time.clock_gettime(self.clock) > self.deadline:
            raise LimitExceeded(self.deadline_message())

    def deadline_message(self) -> str:
        return f"rendering took longer than {self.seconds:.2g} s of CPU time"

    def check_chars(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise LimitExceeded(f"{what} would be {n:,} long, over the limit of "
                                f"{self.max_chars:,}")

    def count_built(self, n: int) -> None:
        self.built += n
        if self.built > self.max_built:
            raise LimitExceeded(f"the template built more than {self.max_built:,} characters "
                                f"of values in all")

    def check_value(self, value: object, what: str = "a value") -> None:
        if isinstance(value, (str, bytes, list, tuple, dict)):
            self.check_chars(len(value), what)
            self.count_built(len(value))
        elif isinstance(value, int) and value.bit_length() > self.limits.max_int_bits:
            raise LimitExceeded(f"{what} is an integer of {value.bit_length():,} bits, over "
                                f"the limit of {self.limits.max_int_bits:,}")

    def check_text(self, value: object, what: str) -> None:
        """Before ``str(value)``: the text it would make is within the size limit."""
        self.check_chars(text_size(value, self.max_chars), what)

    def check_built_text(self, value: object, what: str) -> None:
        """Before ``str(value)`` makes a new string: within the size and the built limits."""
        n = text_size(value, self.max_chars)
        self.check_chars(n, what)
        self.count_built(n)


BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("colibri_template",
                                                                        default=None)


def current_budget() -> Budget:
    # Outside a render (jinja folds constant filter calls while compiling): fresh limits.
    return BUDGET.get() or Budget(DEFAULT_LIMITS)


def text_size(value: object, limit: int, indent: int = 0) -> int:
    """About how long ``str(value)`` (or its JSON with ``indent``) is, counting shared
    references each time they appear (``[s] * 1000`` is 1000 times ``s``). Stops counting
    once past ``limit``, so it costs at most O(limit) whatever the value."""
    total = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, (str, bytes)):
            total += len(obj) + 2
        elif isinstance(obj, (bool, float)) or obj is None:
            total += 24
        elif isinstance(obj, int):
            total += obj.bit_length() // 3 + 2
        elif isinstance(obj, Mapping):
            total += 2
            # Each item adds at least 8 (a separator, the shortest key and value: '' or
            # []): a mapping that cannot fit is known without walking it.
            if total + len(obj) * (8 + indent * (depth + 1)) > limit:
                return total + len(obj) * (8 + indent * (depth + 1))
            for k, v in obj.items():
                total += 4 + indent * (depth + 1)
                # a plain str is counted here, not pushed (the common case)
                if type(k) is str:
                    total += len(k) + 2
                else:
                    stack.append((k, depth + 1))
                if type(v) is str:
                    total += len(v) + 2
                else:
                    stack.append((v, depth + 1))
                if total > limit:
                    return total
        elif isinstance(obj, (list, tuple, set, frozenset)):
            total += 2
            if total + len(obj) * (4 + indent * (depth + 1)) > limit:  # at least 4 an item
                return total + len(obj) * (4 + indent * (depth + 1))
            for v in obj:
                if type(v) is str:
                    total += len(v) + 4 + indent * (depth + 1)
                else:
                    total += 2 + indent * (depth + 1)
                    stack.append((v, depth + 1))
                if total > limit:
                    return total
        elif isinstance(obj, Namespace):  # its text shows its attributes
            try:
                attrs = object.__getattribute__(obj, "_Namespace__attrs")
            except AttributeError:
                attrs = {}
            total += 14
            stack.append((attrs, depth))
        else:
            total += 64  # an Undefined, a macro, a loop...: a short repr
        if total > limit:
            return total
    return total


def check_text(value: object, what: str) -> None:
    """Raises LimitExceeded when ``str(value)`` would be over the current render's size
    limit (for helpers a template calls, before they turn a value into text)."""
    current_budget().check_text(value, what)


__all__ = ["BUDGET", "DEFAULT_LIMITS", "Budget", "LimitExceeded", "TemplateLimits", "check_text",
           "current_budget", "text_size"]
