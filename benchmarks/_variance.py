"""Run-to-run spread of a benchmark's repeats, and whether two configurations can be ranked.

A shared VM's disk and CPUs drift: one child against another says little. Every
configuration runs >= 5 children (alternating with the others); a figure is quoted as its
median with the range of the children, and two configurations are **rankable** only when
their ranges do not overlap (the slowest child of the faster one beats the fastest child of
the slower one). Otherwise the benchmark prints that the spread is too large to rank them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median, min, max, n and the relative spread (max - min) / median of ``values``
    (None entries, failed children, left out)."""
    v = sorted(float(x) for x in values if x is not None)
    if not v:
        return {"n": 0, "median": None, "min": None, "max": None, "rel_spread": None}
    n = len(v)
    med = v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
    return {"n": n, "median": med, "min": v[0], "max": v[-1],
            "rel_spread": (v[-1] - v[0]) / med if med else None}  # fmt: skip


def rankable(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when the two spreads' ranges do not overlap (and each has >= 2 values)."""
    if a.get("n", 0) < 2 or b.get("n", 0) < 2 or a["min"] is None or b["min"] is None:
        return False
    return bool(a["min"] > b["max"] or b["min"] > a["max"])


def verdict(name_a: str, a: dict[str, Any], name_b: str, b: dict[str, Any]) -> str:
    """One line: which is faster, or that the spread is too large to say."""
    if a.get("median") is None or b.get("median") is None:
        return f"{name_a} vs {name_b}: missing figures"
    ratio = a["median"] / b["median"] if b["median"] else float("inf")
    if min(a["n"], b["n"]) < 2:
        return f"{name_a} / {name_b}: {ratio:.2f}x (one child: not ranked)"
    if rankable(a, b):
        return f"{name_a} / {name_b}: {ratio:.2f}x (ranges do not overlap: rankable)"
    return (f"{name_a} / {name_b}: {ratio:.2f}x, but the spread is too large to rank them "
            f"({a['min']:.3g}-{a['max']:.3g} vs {b['min']:.3g}-{b['max']:.3g})")


def fmt_spread(s: dict[str, Any], digits: int = 3) -> str:
    """``median (min-max)``."""
    if s.get("median") is None:
        return "-"
    return f"{s['median']:.{digits}g} ({s['min']:.{digits}g}-{s['max']:.{digits}g})"
