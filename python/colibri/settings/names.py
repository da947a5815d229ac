"""Unknown setting names: one message, with the closest valid name, for every settings
class (colibri.settings.config, colibri.sampling.Sampling), whether the name came as a keyword
argument, through ``replace`` or through ``from_dict``."""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ..errors import ConfigError

_F = TypeVar("_F", bound=Callable[..., None])


def did_you_mean(name: object, allowed: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` naming the closest allowed name, or ``""``."""
    if not isinstance(name, str):
        return ""
    near = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.6)
    if not near:  # a prefix or a substring ("budget" for "ram_budget") is also close
        near = [a for a in allowed if name and (a.startswith(name) or name in a)][:1]
    return f" (did you mean {near[0]!r}?)" if near else ""


def unknown_setting(owner: str, name: object, allowed: Sequence[str]) -> ConfigError:
    return ConfigError(
        f"{owner}: unknown setting {name!r}{did_you_mean(name, allowed)}; "
        f"allowed: {', '.join(allowed)}"
    )


def check_names(owner: str, names: Iterable[object], allowed: Sequence[str]) -> None:
    """Raises :func:`unknown_setting` for the first name not in `allowed`."""
    for name in names:
        if name not in allowed:
            raise unknown_setting(owner, name, allowed)


def checked_init(init: _F) -> _F:
    """Wraps a settings class's ``__init__`` so that a misspelled keyword, too many
    positional values or a value given twice raise ConfigError (naming the setting and the
    closest valid one) instead of Python's bare TypeError. The signature is kept for
    type checkers, IDEs and ``help()``."""
    signature = list(inspect.signature(init).parameters.values())[1:]
    positional = [p.name for p in signature if p.kind == p.POSITIONAL_OR_KEYWORD]
    params = positional + [p.name for p in signature if p.kind == p.KEYWORD_ONLY]

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        owner = type(self).__name__
        if len(args) > len(positional):
            raise ConfigError(
                f"{owner}: takes at most {len(positional)} settings by position "
                f"({', '.join(positional)}), got {len(args)}; pass them by name"
            )
        check_names(owner, kwargs, params)
        for name in positional[: len(args)]:
            if name in kwargs:
                raise ConfigError(
                    f"{owner}: setting {name!r} given twice (by position and by name)"
                )
        init(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _exact_size(n: int) -> str:
    """`n` bytes as an exact size text (``'6GiB'``) when it is a whole number of a binary
    unit, else the integer: what the settings classes accept back."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return repr(f"{n >> shift}{unit}")
    return str(n)


def settings_repr(obj: Any, sizes: Sequence[str] = ()) -> str:
    """``Name(field=value, ...)`` with only the fields that differ from the defaults, enums
    as their strings and the fields in `sizes` as exact sizes: short, and valid Python
    that builds an equal object."""
    import dataclasses
    from enum import Enum

    default = type(obj)()
    parts = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value == getattr(default, f.name):
            continue
        if isinstance(value, Enum):
            text = repr(value.value)
        elif f.name in sizes and isinstance(value, int):
            text = _exact_size(value)
        elif hasattr(value, "to_dict") and not dataclasses.is_dataclass(value):
            text = repr(value.to_dict())  # LogitBias: a plain dict
        else:
            text = repr(value)
        parts.append(f"{f.name}={text}")
    return f"{type(obj).__name__}({', '.join(parts)})"
