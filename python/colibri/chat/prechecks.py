"""Checks made *before* an operation of a chat template runs, from its operands' sizes:
the str methods and filters whose result can be far larger than their input (see
chat_limits.py for the whole picture). Each raises LimitExceeded through the render's
Budget."""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Callable, Mapping
from typing import Any

from .budget import Budget, LimitExceeded, current_budget, text_size


def _int_arg(value: object, default: int) -> int:
    return value if isinstance(value, int) else default


_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)")


def check_printf(b: Budget, fmt: str, args: object) -> None:
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


def check_str_format(b: Budget, fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
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


def check_str_method(b: Budget, owner: str | bytes, name: str, args: tuple[Any, ...],
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
REFUSED_FILTERS = frozenset({"urlize"})


def _filter_center(b: Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    width = args[1] if len(args) > 1 else kwargs.get("width", 80)
    b.check_chars(_int_arg(width, 0), "the center filter's result")


def _filter_indent(b: Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    s = str(args[0])
    width = args[1] if len(args) > 1 else kwargs.get("width", 4)
    per_line = len(width) if isinstance(width, str) else _int_arg(width, 4)
    b.check_chars(len(s) + (s.count("\n") + 1) * max(per_line, 0), "the indent filter's result")


def _filter_format(b: Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    check_printf(b, str(args[0]), dict(kwargs) if kwargs else tuple(args[1:]))


def _filter_replace(b: Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if len(args) >= 3:
        rest = {"count": args[3]} if len(args) > 3 else kwargs
        check_str_method(b, str(args[0]), "replace", (str(args[1]), str(args[2])), rest)


def _filter_tojson(b: Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    indent = args[2] if len(args) > 2 else kwargs.get("indent")
    if indent is not None and (not isinstance(indent, int) or not 0 <= indent <= 64):
        raise LimitExceeded(f"tojson(indent={indent!r}): the indent must be an int in 0..64")
    b.check_chars(text_size(args[0], b.max_chars, indent or 0), "the tojson filter's result")


def _filter_wordwrap(b: Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    wrap = args[3] if len(args) > 3 else kwargs.get("wrapstring")
    s = str(args[0])
    b.check_chars(len(s) * (1 + len(str(wrap or "\n"))), "the wordwrap filter's result")


def _filter_count_arg(name: str) -> Callable[[Budget, tuple[Any, ...], dict[str, Any]], None]:
    def check(b: Budget, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        n = args[1] if len(args) > 1 else kwargs.get("linecount", kwargs.get("slices", 1))
        if isinstance(n, int) and n > b.limits.max_range:
            raise LimitExceeded(f"the {name} filter's count {n:,} is over the limit of "
                                f"{b.limits.max_range:,}")
    return check


_FILTER_CHECKS: dict[str, Callable[[Budget, tuple[Any, ...], dict[str, Any]], None]] = {
    "center": _filter_center,
    "indent": _filter_indent,
    "format": _filter_format,
    "replace": _filter_replace,
    "tojson": _filter_tojson,
    "wordwrap": _filter_wordwrap,
    "batch": _filter_count_arg("batch"),
    "slice": _filter_count_arg("slice"),
}


def limited_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with the budget's checks around it (jinja's pass_context/pass_eval_ctx/
    pass_environment marker is kept, so jinja still passes that first argument)."""
    skip = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
    check = _FILTER_CHECKS.get(name)
    stringifies = name in _STRINGIFYING

    @functools.wraps(func)
    def limited(*args: Any, **kwargs: Any) -> Any:
        b = current_budget()
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
