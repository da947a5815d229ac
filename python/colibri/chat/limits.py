"""Resource limits for chat templates: a model file's Jinja code runs at every chat turn.

jinja2's ``ImmutableSandboxedEnvironment`` keeps a template away from Python internals and
from mutating its inputs, but does not bound what it computes: ``range(10**9)``, ``'x' *
10**10``, ``center(10**9)``, ``tojson(indent=10**8)``, a recursive macro or nested loops
take the process's memory or time. :class:`LimitedEnvironment` adds limits, checked from the
hooks the sandbox offers and a few more this module adds to the compiled code:

- **size**: every value a template builds (a string, list, dict, int) and the rendered
  output are capped at ``max_chars`` (plus 4 times the size of the inputs, so a long
  conversation renders), and all the values one render builds at ``built_factor`` times
  that (so a loop cannot build and drop, or buffer, large strings until memory runs out);
  operations whose result can be far larger than their operands
  (``*``, ``+``, ``%``, ``**``, ``~``, ``str.center/ljust/rjust/zfill/replace/join/
  expandtabs/translate/format``, the filters ``center``, ``indent``, ``format``,
  ``replace``, ``join``, ``tojson``, ``wordwrap``, ``batch``, ``slice``, ``sum``, and
  turning a value into text) are checked *before* they run, from their operands' sizes;
- **loops**: ``range`` holds at most ``max_range`` items, and a render runs at most
  ``max_iterations`` loop iterations in all;
- **depth**: calls (macros, recursive loops, ``caller()``) nest at most ``max_depth`` deep;
- **time**: a render deadline of ``seconds`` of the rendering thread's CPU time (plus 0.5 s
  per MiB of input), checked at every loop iteration, call, attribute access, operator,
  filter and output; compiling stops after ``compile_seconds`` of CPU time.

A template that crosses a limit raises :class:`LimitExceeded`; chat.py turns it (and any
other failure of the template) into a ModelFormatError naming the template. The limits are
far above what real templates need (every template in tests/ renders byte-identically with
or without them) and far below what would hurt the process (about 1 GB at most).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jinja2
import jinja2.nodes as nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .budget import (
    BUDGET,
    DEFAULT_LIMITS,
    Budget,
    LimitExceeded,
    TemplateLimits,
    check_text,
    current_budget,
    text_size,
)
from .deadline import Deadline, DeadlinePassed
from .prechecks import (
    REFUSED_FILTERS,
    check_printf,
    check_str_format,
    check_str_method,
    limited_filter,
)

# --- the environment -------------------------------------------------------------------------


class _GuardedLoop:
    """A for loop's iterable, counting iterations against the budget (len kept, so
    ``loop.length`` does not have to buffer it)."""

    __slots__ = ("_budget", "_it", "_len")

    def __init__(self, iterable: Iterable[Any], budget: Budget) -> None:
        self._budget = budget
        try:
            self._len: int | None = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            self._len = None
        self._it = iter(iterable)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        b = self._budget
        b.iterations += 1
        if b.iterations > b.max_iterations:
            raise LimitExceeded(f"loops ran more than {b.max_iterations:,} iterations")
        b.tick()
        return next(self._it)

    def __len__(self) -> int:
        if self._len is None:
            raise TypeError("no length")
        return self._len


class _LimitedCodeGenerator(CodeGenerator):
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # ``a ~ b``: jinja writes str_join((a, b)); the parts' text is checked first.
        if frame.eval_ctx.volatile:
            func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            func_name = "markup_join"
        else:
            func_name = "str_join"
        self.write(f"environment.limited_concat({func_name}, (")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the limits of this module (see its docstring)."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})
    code_generator_class = _LimitedCodeGenerator

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["finalize"] = self._finalize
        super().__init__(*args, **kwargs)
        self.globals["range"] = self._range
        self.globals.pop("lipsum", None)  # lipsum(10**9): text for web page mock-ups
        for name in REFUSED_FILTERS:
            self.filters.pop(name, None)
        self.limit_filters()

    def limit_filters(self) -> None:
        """Wraps every filter (call again after adding one)."""
        for name, func in list(self.filters.items()):
            if not getattr(func, "_colibri_limited", False):
                limited = limited_filter(name, func)
                limited._colibri_limited = True  # type: ignore[attr-defined]
                self.filters[name] = limited

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        if len(source) > DEFAULT_LIMITS.max_source_chars:
            raise LimitExceeded(f"the template is {len(source):,} characters long, over the "
                                f"limit of {DEFAULT_LIMITS.max_source_chars:,}")
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):  # every loop's iterable is counted
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("guard_loop"), [loop.iter], [],
                                   None, None, lineno=loop.lineno)
        return tree

    # Hooks the compiled template calls.

    def guard_loop(self, iterable: Iterable[Any]) -> _GuardedLoop:
        return _GuardedLoop(iterable, current_budget())

    def limited_concat(self, join: Callable[[Iterable[Any]], str], parts: tuple[Any, ...]
                       ) -> str:
        b = current_budget()
        b.tick()
        n = sum(text_size(p, b.max_chars) for p in parts)
        b.check_chars(n, "a ~ concatenation")
        b.count_built(n)
        return join(parts)

    def concat(self, parts: Iterable[str]) -> str:
        # The text of a block, macro or {% set %} capture.
        b = current_budget()
        b.tick()
        chunks = list(parts)
        n = sum(len(c) for c in chunks)
        b.check_chars(n, "a block's text")
        b.count_built(n)
        return "".join(chunks)

    def _finalize(self, value: Any) -> Any:
        # Every {{ expression }} before it is turned into text.
        if not isinstance(value, str):  # a str is output as it is; anything else is str()'d
            b = current_budget()
            b.tick()
            b.check_built_text(value, "an output expression")
        return value

    def _range(self, *args: Any) -> range:
        b = current_budget()
        b.tick()
        r = range(*args)
        if len(r) > b.limits.max_range:
            raise LimitExceeded(f"range() of {len(r):,} items is over the limit of "
                                f"{b.limits.max_range:,}")
        return r

    def getattr(self, obj: Any, attribute: str) -> Any:
        current_budget().tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        current_budget().tick()
        return super().getitem(obj, argument)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        b = current_budget()
        b.tick()
        sized = (str, bytes, list, tuple)
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, sized) and isinstance(times, int):
                    b.check_chars(len(seq) * times, "a repetition")
            if isinstance(left, int) and isinstance(right, int):
                bits = left.bit_length() + right.bit_length()
                if bits > b.limits.max_int_bits:
                    raise LimitExceeded(f"a product would have {bits:,} bits, over the limit "
                                        f"of {b.limits.max_int_bits:,}")
        elif operator == "+":
            if isinstance(left, sized) and isinstance(right, sized):
                b.check_chars(len(left) + len(right), "a concatenation")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                bits = left.bit_length() * right
                if bits > b.limits.max_int_bits:
                    raise LimitExceeded(f"a power would have {bits:,} bits, over the limit "
                                        f"of {b.limits.max_int_bits:,}")
        elif operator == "%" and isinstance(left, str):
            check_printf(b, left, right)
        result = super().call_binop(context, operator, left, right)
        b.check_value(result, f"the result of {operator}")
        return result

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        b = current_budget()
        b.tick()
        if isinstance(obj, LoopContext) and args:  # loop(children) in a recursive loop
            args = (self.guard_loop(args[0]), *args[1:])
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, (str, bytes)):
            args = check_str_method(b, owner, getattr(obj, "__name__", ""), args, kwargs)
        if b.depth >= b.limits.max_depth:
            raise LimitExceeded(f"calls nest deeper than {b.limits.max_depth}")
        b.depth += 1
        try:
            result = super().call(context, obj, *args, **kwargs)
        finally:
            b.depth -= 1
        b.check_value(result, "a call's result")
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__
        is_map = value.__name__ == "format_map"

        @functools.wraps(wrapped)
        def limited(*args: Any, **kwargs: Any) -> str:
            b = current_budget()
            if is_map and len(args) == 1 and isinstance(args[0], Mapping):
                check_str_format(b, fmt, (), args[0])
            else:
                check_str_format(b, fmt, args, kwargs)
            return wrapped(*args, **kwargs)

        return limited


def render(template: jinja2.Template, context: dict[str, Any], limits: TemplateLimits) -> str:
    """``template.render(**context)`` within ``limits`` (raises LimitExceeded)."""
    input_chars = text_size(context, 1 << 62)
    budget = Budget(limits, input_chars, input_items=input_chars // 16)
    token = BUDGET.set(budget)
    try:
        out: list[str] = []
        size = 0
        # The budget's own checks stop most renders; the watchdog stops one that runs long
        # between two of them (a filter's loop over a large value). Inside the budget's
        # set/reset, so the reset always runs after the last moment it can fire.
        with Deadline(budget.deadline, budget.clock):
            for chunk in template.generate(**context):
                size += len(chunk)
                budget.check_chars(size, "the rendered prompt")
                budget.tick()
                out.append(chunk)
        return "".join(out)
    except DeadlinePassed:
        raise LimitExceeded(budget.deadline_message()) from None
    finally:
        BUDGET.reset(token)


__all__ = [
    "DEFAULT_LIMITS",
    "LimitExceeded",
    "LimitedEnvironment",
    "TemplateLimits",
    "check_text",
    "render",
    "text_size",
]
