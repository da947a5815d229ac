"""Field validators of the settings classes (colibri.settings.config): each turns one user-given
value into the typed value of a field, or raises :class:`colibri.errors.ConfigError` naming
the field, what was given and what is allowed."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar, cast

from ..errors import ConfigError
from ..sizes import format_bytes, parse_bytes
from .names import check_names

MAX_RAM_BUDGET = 1 << 50
"""Largest ``ram_budget`` accepted: 1 PiB. Anything larger is a typo (a unit too many)."""

_E = TypeVar("_E", bound=Enum)
_C = TypeVar("_C")


# --- validation helpers -------------------------------------------------------------------


def _enum(field: str, value: object, enum: type[_E]) -> _E:
    """Coerces an enum member or its string value (case-insensitive) to the member."""
    if isinstance(value, enum):
        return value
    allowed = ", ".join(repr(m.value) for m in enum)
    if isinstance(value, str):
        for member in enum:
            if value.strip().lower() == str(member.value):
                return member
    raise ConfigError(f"{field}: {value!r} is not allowed; use one of {allowed}")


def _int(field: str, value: object, lo: int, hi: int, unit: str = "") -> int:
    """An int within [lo, hi]. bool is rejected although it is an int subclass."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{field}: expected an integer{unit and ' (' + unit + ')'}, "
            f"got {type(value).__name__} {value!r}"
        )
    if not lo <= value <= hi:
        suffix = f" {unit}" if unit else ""
        raise ConfigError(f"{field}: {value} is out of range; allowed {lo}..{hi}{suffix}")
    return value


def _optional_int(
    field: str, value: object, lo: int, hi: int, unit: str, none_means: str
) -> int | None:
    """None, or an int within [lo, hi]; errors also say what None means."""
    if value is None:
        return None
    try:
        return _int(field, value, lo, hi, unit)
    except ConfigError as e:
        raise ConfigError(f"{e} (or None: {none_means})") from None


def _check_names(cls: type, names: Mapping[str, object] | set[str]) -> None:
    """Raises ConfigError for a name that is not a field of dataclass `cls` (suggesting
    the closest field)."""
    check_names(cls.__name__, names, [f.name for f in dataclasses.fields(cls)])


def _replace(obj: _C, changes: Mapping[str, Any]) -> _C:
    _check_names(type(obj), set(changes))
    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]



def _bool(field: str, value: object) -> bool:
    """A real bool (1, "yes" and None are rejected: a setting is a value, not a presence)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{field}: expected True or False, got {type(value).__name__} {value!r}")
    return value


def _fraction(field: str, value: object, hi: float) -> float:
    """A real number within [0, hi] (ints accepted, bool and NaN rejected)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{field}: expected a number in 0..{hi:g}, "
                          f"got {type(value).__name__} {value!r}")
    if not 0 <= value <= hi:  # NaN fails both comparisons
        raise ConfigError(f"{field}: {value!r} is out of range; allowed 0..{hi:g}")
    return float(value)


def _choice(field: str, value: object, allowed: tuple[str, ...]) -> Any:
    """One of the strings `allowed` (case-insensitive, surrounding spaces ignored)."""
    if isinstance(value, str) and value.strip().lower() in allowed:
        return value.strip().lower()
    names = ", ".join(repr(a) for a in allowed)
    raise ConfigError(f"{field}: {value!r} is not allowed; use one of {names}")


def _optional_path(field: str, value: object, none_means: str) -> str | None:
    """None, or a non-empty path (str or os.PathLike), kept as a str."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{field}: expected a non-empty path, got {type(value).__name__} "
                          f"{value!r} (or None: {none_means})")
    return value


def _sub_config(field: str, value: object, cls: type[_C]) -> _C:
    """An instance of settings class `cls`, built from a mapping of its fields if needed."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cast(_C, cls.from_dict(value))  # type: ignore[attr-defined]
    raise ConfigError(
        f"{field}: expected a {cls.__name__} or a mapping of its fields, "
        f"got {type(value).__name__}"
    )


def _ram_budget(value: object) -> int | None:
    field = "EngineConfig.ram_budget"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(
            f"{field}: expected bytes (int) or a size such as \"6GiB\", got "
            f"{type(value).__name__} {value!r} (or None: available memory minus a margin)"
        )
    try:
        n = parse_bytes(value)
    except ConfigError as e:
        raise ConfigError(f"{field}: {e}") from None
    if n <= 0:
        raise ConfigError(f"{field}: {value!r} must be more than 0 bytes "
                          "(or None: available memory minus a margin)")
    if n > MAX_RAM_BUDGET:
        shown = f"{value!r} ({format_bytes(n)})" if isinstance(value, str) else f"{n} bytes"
        raise ConfigError(f"{field}: {shown} is more than the largest allowed, "
                          f"{format_bytes(MAX_RAM_BUDGET)} ({MAX_RAM_BUDGET} bytes); "
                          "check the unit")
    return n


def _size(field: str, value: object) -> int:
    """A byte count >= 0 given as an int or a size text ("1GiB")."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{field}: expected bytes (int) or a size such as \"1GiB\", got "
                          f"{type(value).__name__} {value!r} (0: off)")
    try:
        n = parse_bytes(value)
    except ConfigError as e:
        raise ConfigError(f"{field}: {e}") from None
    if not 0 <= n <= MAX_RAM_BUDGET:
        raise ConfigError(f"{field}: {value!r} is out of range; allowed 0.."
                          f"{format_bytes(MAX_RAM_BUDGET)}")
    return n
