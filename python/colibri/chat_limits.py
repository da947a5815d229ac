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
- **time**: a render deadline of ``seconds`` (plus 0.5 s per MiB of input), checked at
  every loop iteration, call, attribute access, operator, filter and output; compiling
  stops after ``compile_seconds`` of CPU time.

A template that crosses a limit raises :class:`LimitExceeded`; chat.py turns it (and any
other failure of the template) into a ModelFormatError naming the template. The limits are
far above what real templates need (every template in tests/ renders byte-identically with
or without them) and far below what would hurt the process (about 1 GB at most).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import re
import string
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jinja2
import jinja2.nodes as nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context, LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from .chat_deadline import Deadline, DeadlinePassed


@dataclasses.dataclass(frozen=True)
class TemplateLimits:
    """What one chat-template render may use (see the module docstring)."""

    # Render deadline (wall clock), plus 0.5 s per MiB of input. Real templates render in
    # about 2 ms; with compile_seconds, a refused template costs under 1 s in all.
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


class _Budget:
    """The running totals of one render (or of one compile-time constant folding)."""

    __slots__ = ("built", "deadline", "depth", "iterations", "limits", "max_built", "max_chars",
                 "max_iterations", "seconds", "ticks")

    def __init__(self, limits: TemplateLimits, input_chars: int = 0, input_items: int = 0):
        self.limits = limits
        self.seconds = limits.seconds + 0.5 * input_chars / (1 << 20)
        self.deadline = time.monotonic() + self.seconds
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
        if not self.ticks & 63 and time.monotonic() > self.deadline:
            raise LimitExceeded(self.deadline_message())

    def deadline_message(self) -> str:
        return f"rendering took longer than {self.seconds:.2g} s"

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


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("colibri_template",
                                                                        default=None)


def _budget() -> _Budget:
    # Outside a render (jinja folds constant filter calls while compiling): fresh limits.
    return _BUDGET.get() or _Budget(DEFAULT_LIMITS)


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
    _budget().check_text(value, what)


def _int_arg(value: object, default: int) -> int:
    return value if isinstance(value, int) else default


_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)")


def _check_printf(b: _Budget, fmt: str, args: object) -> None:
    """``fmt % args``: widths, precisions and the arguments' text must fit."""
    widths = 0
    star = False
    for m in _PRINTF_SPEC.finditer(fmt):
        for g in (m.group(1), m.group(2)):
            if g == "*":
                star = True
            elif g:
                widths += int(g) if len(g) < 12 else b.max_chars + 1
    values = args if isinstance(args, tuple) else (args,)
    if star:
        widths += sum(abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool))
    b.check_chars(len(fmt) + widths, "a %-formatted string")
    b.check_text(args, "a %-formatted string")


def _check_str_format(b: _Budget, fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
                      ) -> None:
    """``fmt.format(...)``: literal widths and precisions, nested ones refused."""
    widths = 0
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # str.format raises the same error itself
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if "{" in spec:
            raise LimitExceeded("str.format with a computed width or precision is not allowed")
        for digits in re.findall(r"\d+", spec):
            widths += int(digits) if len(digits) < 12 else b.max_chars + 1
    b.check_chars(len(fmt) + widths, "a str.format result")
    b.check_text((args, dict(kwargs)), "a str.format result")


def _check_str_method(b: _Budget, owner: str | bytes, name: str, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Before a str/bytes method whose result can be much larger than the string."""
    n = len(owner)
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        b.check_chars(max(n, _int_arg(width, 0)), f"str.{name}")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
        b.check_chars(n + tabs * max(_int_arg(size, 8), 0), "str.expandtabs")
    elif name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, type(owner)) and isinstance(new, type(owner)):
            hits = owner.count(old) if old else n + 1  # type: ignore[arg-type]
            count = args[2] if len(args) > 2 else kwargs.get("count", -1)
            if isinstance(count, int) and count >= 0:
                hits = min(hits, count)
            b.check_chars(n + hits * max(len(new) - len(old), 0), "str.replace")
    elif name == "join" and args:
        items = list(args[0])  # materialized once: the size check and the join see the same
        b.check_chars(sum(len(x) if isinstance(x, (str, bytes)) else 0 for x in items)
                      + n * max(len(items) - 1, 0), "str.join")
        return (items, *args[1:])
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, (str, bytes))),
                      default=1)
        b.check_chars(n * max(longest, 1), "str.translate")
    return args


# --- filters ---------------------------------------------------------------------------------

# Filters that turn their input into text: its text must fit before they run.
_STRINGIFYING = frozenset({
    "capitalize", "center", "e", "escape", "forceescape", "format", "indent", "join",
    "lower", "pprint", "replace", "safe", "string", "striptags", "title", "tojson", "trim",
    "truncate", "upper", "urlencode", "wordcount", "wordwrap", "xmlattr",
})

# Not offered to templates: no chat template uses it, and its output can be far larger
# than its input (one link per word, each carrying a caller-chosen attribute string).
_REFUSED_FILTERS = frozenset({"urlize"})


def _filter_center(b: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    width = args[1] if len(args) > 1 else kwargs.get("width", 80)
    b.check_chars(_int_arg(width, 0), "the center filter's result")


def _filter_indent(b: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    s = str(args[0])
    width = args[1] if len(args) > 1 else kwargs.get("width", 4)
    per_line = len(width) if isinstance(width, str) else _int_arg(width, 4)
    b.check_chars(len(s) + (s.count("\n") + 1) * max(per_line, 0), "the indent filter's result")


def _filter_format(b: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _check_printf(b, str(args[0]), dict(kwargs) if kwargs else tuple(args[1:]))


def _filter_replace(b: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if len(args) >= 3:
        rest = {"count": args[3]} if len(args) > 3 else kwargs
        _check_str_method(b, str(args[0]), "replace", (str(args[1]), str(args[2])), rest)


def _filter_tojson(b: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    indent = args[2] if len(args) > 2 else kwargs.get("indent")
    if indent is not None and (not isinstance(indent, int) or not 0 <= indent <= 64):
        raise LimitExceeded(f"tojson(indent={indent!r}): the indent must be an int in 0..64")
    b.check_chars(text_size(args[0], b.max_chars, indent or 0), "the tojson filter's result")


def _filter_wordwrap(b: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    wrap = args[3] if len(args) > 3 else kwargs.get("wrapstring")
    s = str(args[0])
    b.check_chars(len(s) * (1 + len(str(wrap or "\n"))), "the wordwrap filter's result")


def _filter_count_arg(name: str) -> Callable[[_Budget, tuple[Any, ...], dict[str, Any]], None]:
    def check(b: _Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        n = args[1] if len(args) > 1 else kwargs.get("linecount", kwargs.get("slices", 1))
        if isinstance(n, int) and n > b.limits.max_range:
            raise LimitExceeded(f"the {name} filter's count {n:,} is over the limit of "
                                f"{b.limits.max_range:,}")
    return check


_FILTER_CHECKS: dict[str, Callable[[_Budget, tuple[Any, ...], dict[str, Any]], None]] = {
    "center": _filter_center,
    "indent": _filter_indent,
    "format": _filter_format,
    "replace": _filter_replace,
    "tojson": _filter_tojson,
    "wordwrap": _filter_wordwrap,
    "batch": _filter_count_arg("batch"),
    "slice": _filter_count_arg("slice"),
}


def _limited_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with the budget's checks around it (jinja's pass_context/pass_eval_ctx/
    pass_environment marker is kept, so jinja still passes that first argument)."""
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
    check = _FILTER_CHECKS.get(name)
    stringifies = name in _STRINGIFYING

    @functools.wraps(func)
    def limited(*args: Any, **kwargs: Any) -> Any:
        b = _budget()
        b.tick()
        own = args[skip:]
        if own:
            if stringifies:
                b.check_text(own[0], f"the input of the {name} filter")
            if name == "join":  # materialized once, like str.join
                items = list(own[0])
                sep = own[1] if len(own) > 1 else kwargs.get("d", "")
                b.check_chars(text_size(items, b.max_chars) + len(str(sep)) * len(items),
                              "the join filter's result")
                args = (*args[:skip], items, *own[1:])
            elif name == "sum":
                items = list(own[0])
                start = own[2] if len(own) > 2 else kwargs.get("start", 0)
                if not isinstance(start, (int, float)) or not all(
                        isinstance(x, (int, float)) for x in items):
                    b.check_text([start, *items], "the sum filter's result")
                args = (*args[:skip], items, *own[1:])
            elif check is not None:
                check(b, own, kwargs)
        result = func(*args, **kwargs)
        b.check_value(result, f"the result of the {name} filter")
        return result

    return limited


# --- the environment -------------------------------------------------------------------------


class _GuardedLoop:
    """A for loop's iterable, counting iterations against the budget (len kept, so
    ``loop.length`` does not have to buffer it)."""

    __slots__ = ("_budget", "_it", "_len")

    def __init__(self, iterable: Iterable[Any], budget: _Budget) -> None:
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
        for name in _REFUSED_FILTERS:
            self.filters.pop(name, None)
        self.limit_filters()

    def limit_filters(self) -> None:
        """Wraps every filter (call again after adding one)."""
        for name, func in list(self.filters.items()):
            if not getattr(func, "_colibri_limited", False):
                limited = _limited_filter(name, func)
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
        return _GuardedLoop(iterable, _budget())

    def limited_concat(self, join: Callable[[Iterable[Any]], str], parts: tuple[Any, ...]
                       ) -> str:
        b = _budget()
        b.tick()
        n = sum(text_size(p, b.max_chars) for p in parts)
        b.check_chars(n, "a ~ concatenation")
        b.count_built(n)
        return join(parts)

    def concat(self, parts: Iterable[str]) -> str:
        # The text of a block, macro or {% set %} capture.
        b = _budget()
        b.tick()
        chunks = list(parts)
        n = sum(len(c) for c in chunks)
        b.check_chars(n, "a block's text")
        b.count_built(n)
        return "".join(chunks)

    def _finalize(self, value: Any) -> Any:
        # Every {{ expression }} before it is turned into text.
        if not isinstance(value, str):  # a str is output as it is; anything else is str()'d
            b = _budget()
            b.tick()
            b.check_built_text(value, "an output expression")
        return value

    def _range(self, *args: Any) -> range:
        b = _budget()
        b.tick()
        r = range(*args)
        if len(r) > b.limits.max_range:
            raise LimitExceeded(f"range() of {len(r):,} items is over the limit of "
                                f"{b.limits.max_range:,}")
        return r

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget().tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _budget().tick()
        return super().getitem(obj, argument)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        b = _budget()
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
            _check_printf(b, left, right)
        result = super().call_binop(context, operator, left, right)
        b.check_value(result, f"the result of {operator}")
        return result

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        b = _budget()
        b.tick()
        if isinstance(obj, LoopContext) and args:  # loop(children) in a recursive loop
            args = (self.guard_loop(args[0]), *args[1:])
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, (str, bytes)):
            args = _check_str_method(b, owner, getattr(obj, "__name__", ""), args, kwargs)
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
            b = _budget()
            if is_map and len(args) == 1 and isinstance(args[0], Mapping):
                _check_str_format(b, fmt, (), args[0])
            else:
                _check_str_format(b, fmt, args, kwargs)
            return wrapped(*args, **kwargs)

        return limited


def render(template: jinja2.Template, context: dict[str, Any], limits: TemplateLimits) -> str:
    """``template.render(**context)`` within ``limits`` (raises LimitExceeded)."""
    input_chars = text_size(context, 1 << 62)
    budget = _Budget(limits, input_chars, input_items=input_chars // 16)
    token = _BUDGET.set(budget)
    try:
        out: list[str] = []
        size = 0
        # The budget's own checks stop most renders; the watchdog stops one that runs long
        # between two of them (a filter's loop over a large value). Inside the budget's
        # set/reset, so the reset always runs after the last moment it can fire.
        with Deadline(budget.deadline):
            for chunk in template.generate(**context):
                size += len(chunk)
                budget.check_chars(size, "the rendered prompt")
                budget.tick()
                out.append(chunk)
        return "".join(out)
    except DeadlinePassed:
        raise LimitExceeded(budget.deadline_message()) from None
    finally:
        _BUDGET.reset(token)


__all__ = [
    "DEFAULT_LIMITS",
    "LimitExceeded",
    "LimitedEnvironment",
    "TemplateLimits",
    "check_text",
    "render",
]
