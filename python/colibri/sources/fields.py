"""Typed reads of metadata values (GGUF key/values, config.json, manifest.json).

Metadata is data from a stranger: a count can be a string, a list, ``true``, ``NaN`` or
2**63. These helpers turn a value into the type a field needs or raise ModelFormatError
naming the field and saying why, so that no ``int()``/``float()`` on metadata ever raises
a bare TypeError or ValueError.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ModelFormatError
from .paths import shown

# Dimensions and counts go to the core as int64 and are multiplied together (rows x
# cols, layers x experts): bound each one well inside that.
MAX_DIM = 2**31 - 1


def bad(where: object, field: str, value: Any, want: str) -> ModelFormatError:
    return ModelFormatError(f"{where}: {field} must be {want}, not {shown(value)}")


def as_int(
    value: Any, field: str, where: object, *, lo: int = 0, hi: int = MAX_DIM,
    floats: bool = False,
) -> int:  # fmt: skip
    """An integer in [lo, hi]; bools are not. ``floats``: integral floats (4096.0, which
    hand-edited config.json files have) are accepted too."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(where, field, value, f"an integer in [{lo}, {hi}]")
    if isinstance(value, float):
        if not floats or not value.is_integer():
            raise bad(where, field, value, f"an integer in [{lo}, {hi}]")
        value = int(value)
    if not lo <= value <= hi:
        raise bad(where, field, value, f"an integer in [{lo}, {hi}]")
    return int(value)


def as_float(
    value: Any, field: str, where: object, *, lo: float = -math.inf, lo_open: bool = False
) -> float:
    """A finite real number >= lo (> lo when ``lo_open``); ints are accepted."""
    want = f"a finite number {'>' if lo_open else '>='} {lo:g}" if lo > -math.inf else "finite"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(where, field, value, want)
    try:
        v = float(value)
    except OverflowError:  # an int beyond float range
        raise bad(where, field, value, want) from None
    if not math.isfinite(v) or v < lo or (lo_open and v == lo):
        raise bad(where, field, value, want)
    return v


def as_bool(value: Any, field: str, where: object) -> bool:
    """A boolean; 0 and 1 (GGUF writers that store flags as integers) are accepted."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise bad(where, field, value, "true or false")


def as_str(value: Any, field: str, where: object) -> str:
    if not isinstance(value, str):
        raise bad(where, field, value, "a string")
    return value


def as_list(value: Any, field: str, where: object) -> list[Any]:
    if not isinstance(value, list):
        raise bad(where, field, value, "a list")
    return value


def as_dict(value: Any, field: str, where: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad(where, field, value, "an object")
    return value
