"""Typed reads of metadata values (GGUF key/values, config.json, manifest.json).

Metadata is data from a stranger: a count can be a string, a list, ``true``, ``NaN`` or
2**63. These helpers turn a value into the type a field needs or raise ModelFormatError
naming the field and saying why, so that no ``int()``/``float()`` on metadata ever raises
a bare TypeError or ValueError. :class:`ConfigFields` and :class:`GGUFFields` read keys of
a config.json / a GGUF header with them (the format readers and the family modules share
them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
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


class ConfigFields:
    """Typed reads of a Hugging Face ``config.json``'s keys, named in messages as
    ``<dir>/config.json: key``. Integral floats (4096.0) are accepted for integers."""

    def __init__(self, cfg: Mapping[str, Any], where: Path) -> None:
        self.cfg = cfg
        self.where = where  # the config.json path

    def int(self, key: str, default: int | None = None, *, lo: int = 1) -> int:
        v = self.cfg.get(key)
        if v is None:
            if default is None:
                raise ModelFormatError(f"{self.where}: key {key!r} is missing")
            return default
        return as_int(v, key, self.where, lo=lo, floats=True)

    def bool(self, key: str, default: bool = False) -> bool:
        v = self.cfg.get(key)
        return default if v is None else as_bool(v, key, self.where)

    def positive(self, key: str, default: float) -> float:
        """A finite number > 0."""
        v = self.cfg.get(key)
        return default if v is None else as_float(v, key, self.where, lo=0.0, lo_open=True)


class GGUFFields:
    """Typed reads of a GGUF file's metadata keys, named in messages as ``GGUF metadata
    key``. A list value (a per-layer setting) is accepted only when every layer agrees."""

    def __init__(self, md: Mapping[str, Any], where: Path) -> None:
        self.md = md
        self.where = where

    def get(self, key: str, default: Any = None) -> Any:
        v = self.md.get(key, default)
        if v is None:
            raise ModelFormatError(f"{self.where}: GGUF metadata key {key!r} is missing")
        return v

    def optional_int(self, key: str) -> int | None:
        v = self.md.get(key)
        return None if v is None else as_int(v, f"GGUF metadata {key}", self.where)

    def int(self, key: str, default: int | None = None, *, lo: int = 1) -> int:
        v = self.get(key, default)
        if isinstance(v, list):
            if not v or any(x != v[0] for x in v):
                raise UnsupportedError(
                    f"{self.where}: per-layer values for {key!r} are not supported"
                )
            v = v[0]
        return as_int(v, f"GGUF metadata {key}", self.where, lo=lo)

    def f32(self, key: str, default: float | None = None) -> float:
        """A float32 value as the decimal it was written from (1e-05, not 9.99e-06)."""
        return f32_decimal(self.get(key, default), key, self.where)

    def positive(self, key: str, default: float) -> float:
        """A finite number > 0."""
        v = self.md.get(key)
        return default if v is None else as_float(v, f"GGUF metadata {key}", self.where,
                                                        lo=0.0, lo_open=True)  # fmt: skip

    def bool(self, key: str, default: bool = False) -> bool:
        return as_bool(self.md.get(key, default), f"GGUF metadata {key}", self.where)


def f32_decimal(v: Any, key: str, where: object) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99e-06)."""
    x = as_float(v, f"GGUF metadata {key}", where)
    with np.errstate(over="ignore"):
        y = float(str(np.float32(x)))
    if not math.isfinite(y):
        raise bad(where, f"GGUF metadata {key}", v, "a finite float32")
    return y
