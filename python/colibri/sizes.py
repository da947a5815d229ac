"""Byte sizes for people: parsing "6GiB" / "1.5GB" / "800M" and printing "3.1 GiB".

Used by the RAM budget (``EngineConfig.ram_budget``, :mod:`colibri.engine.budget`) and the CLI.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Literal

from .errors import ConfigError

__all__ = ["Rounding", "format_bytes", "parse_bytes"]

_BINARY = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)
_SIZE_HELP = ('use a number of bytes or a number with a unit, e.g. "6GiB", "512MiB", '
              '"1.5GB", "800M"')


def parse_bytes(text: str | int) -> int:
    """A byte count from an int or a size text; raises ConfigError (a ValueError) otherwise.

    Units are case-insensitive and follow GNU coreutils (``dd``, ``head -c``):

    - ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB`` (or ``Ki``, ``Mi``, ...) and the bare
      letters ``K``, ``M``, ``G``, ``T``, ``P`` are binary: ``"800M"`` is 800 x 2**20;
    - ``kB``, ``MB``, ``GB``, ``TB``, ``PB`` are decimal: ``"1.5GB"`` is 1 500 000 000;
    - no unit, or ``B``, is bytes.

    A fraction is allowed (``"1.5GiB"``); the result is rounded down to whole bytes.
    Spaces around the number and the unit are ignored (``"6 GiB"``). Negative numbers,
    exponents and other text are rejected; 0 is returned as 0 (callers decide whether it
    is allowed).
    """
    if isinstance(text, bool):
        raise ConfigError(f"expected a size, got bool {text!r}; {_SIZE_HELP}")
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"a size cannot be negative, got {text}")
        return text
    if not isinstance(text, str):
        raise ConfigError(f"expected a size, got {type(text).__name__} {text!r}; {_SIZE_HELP}")
    m = _SIZE.match(text)
    if m is None:
        raise ConfigError(f"{text!r} is not a size; {_SIZE_HELP}")
    number, prefix, binary, byte = m.group(1), m.group(2).lower(), m.group(3), m.group(4)
    if binary and not prefix:  # "5i", "5iB"
        raise ConfigError(f"{text!r} is not a size; {_SIZE_HELP}")
    if prefix and byte and not binary:
        unit = _DECIMAL[prefix]  # kB, MB, GB: SI
    else:
        unit = _BINARY[prefix]  # K, Ki, KiB: binary
    return int(Fraction(number) * unit)


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


Rounding = Literal["nearest", "up", "down"]


def format_bytes(n: int, *, rounding: Rounding = "nearest") -> str:
    """A byte count in binary units for people: ``"512 B"``, ``"17.5 MiB"``, ``"3.1 GiB"``,
    ``"120 GiB"`` (one decimal below 100 units, none above).

    rounding: ``"up"`` for a minimum that must be met (``"the minimum is 3.6 GiB"`` is then
    enough, never a hair too little), ``"down"`` for an amount that must not be overstated.
    """
    if n < 0:
        flip: dict[str, Rounding] = {"up": "down", "down": "up", "nearest": "nearest"}
        return "-" + format_bytes(-n, rounding=flip[rounding])
    i = 0
    while i + 1 < len(_UNITS) and n >= 1024 ** (i + 1):
        i += 1
    if i == 0:
        return f"{n} B"
    value = n / float(1 << (10 * i))

    def shown(digits: int) -> float:
        scale = 10.0**digits
        if rounding == "up":
            return math.ceil(value * scale - 1e-9) / scale
        if rounding == "down":
            return math.floor(value * scale + 1e-9) / scale
        return round(value * scale) / scale

    digits = 1 if shown(1) < 100 else 0
    if shown(digits) >= 1024 and i + 1 < len(_UNITS):  # 1023.99 MiB is shown as 1.0 GiB
        return f"1.0 {_UNITS[i + 1]}"
    return f"{shown(digits):.{digits}f} {_UNITS[i]}"
