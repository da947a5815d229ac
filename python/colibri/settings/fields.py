"""Field validators of the settings classes (colibri.settings.config): each turns one user-given
value into the typed value of a field, or raises :class:`colibri.errors.ConfigError` naming
the field, what was given and what is allowed. The lower-case factories at the end wrap
them as the :class:`~colibri.settings.table.Check` a :class:`~colibri.settings.table.Setting`
declares."""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import Enum
from typing import Any, Literal, TypeVar

from ..errors import ConfigError
from ..sizes import format_bytes, parse_bytes
from .table import Check, Settings

MAX_RAM_BUDGET = 1 << 50
"""Largest ``ram_budget`` accepted: 1 PiB. Anything larger is a typo (a unit too many)."""

_E = TypeVar("_E", bound=Enum)
_S = TypeVar("_S", bound=Settings)


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


def _sub_config(field: str, value: object, cls: type[_S]) -> _S:
    """An instance of settings class `cls`, built from a mapping of its fields if needed."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        return cls.from_dict(value)
    raise ConfigError(
        f"{field}: expected a {cls.__name__} or a mapping of its fields, "
        f"got {type(value).__name__}"
    )


def _ram_budget(field: str, value: object) -> int | None:
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


# --- the checks the settings classes declare -----------------------------------------------


def ints(lo: int, hi: int, unit: str = "") -> Check[int]:
    return Check(lambda field, value: _int(field, value, lo, hi, unit))


def optional_ints(lo: int, hi: int, unit: str, none_means: str) -> Check[int | None]:
    return Check(lambda field, value: _optional_int(field, value, lo, hi, unit, none_means))


def int_or_auto(lo: int, hi: int, unit: str) -> Check[int | Literal["auto"]]:
    """``"auto"``, or an int within [lo, hi]."""
    return Check(lambda field, value: "auto" if value == "auto"
                 else _int(field, value, lo, hi, unit))


def enum_of(enum: type[_E]) -> Check[_E]:
    return Check(lambda field, value: _enum(field, value, enum),
                 choices=tuple(str(m.value) for m in enum))


def one_of(*allowed: str) -> Check[Any]:
    return Check(lambda field, value: _choice(field, value, allowed), choices=allowed)


def fraction(hi: float) -> Check[float]:
    return Check(lambda field, value: _fraction(field, value, hi))


def optional_path(none_means: str) -> Check[str | None]:
    return Check(lambda field, value: _optional_path(field, value, none_means))


def sub_config(cls: type[_S]) -> Check[_S]:
    return Check(lambda field, value: _sub_config(field, value, cls), config=cls)


def count_or_auto(text: str) -> int | str:
    """A flag's ``N|auto`` text: "auto" or an int (the range is the setting's check)."""
    return "auto" if text == "auto" else int(text)


BOOL: Check[bool] = Check(_bool)
RAM_BUDGET: Check[int | None] = Check(_ram_budget, size=True)
SIZE: Check[int] = Check(_size, size=True)
