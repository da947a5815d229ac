"""Complementary halves of a dense FFN, for the demo MoE's ``experts="halves"`` layout.

A SwiGLU FFN is a sum over its neurons: ``down @ (silu(gate x) * up x)`` adds one column of
``down`` per neuron. Split the neurons into two disjoint halves A and B and the FFN is
``FFN_A(x) + FFN_B(x)``. The demo's paired router gives the two experts of a pair weight 0.5
each, so each expert holds its half with ``down`` doubled: ``0.5 * 2 FFN_A + 0.5 * 2 FFN_B``.
Doubling is exact in every block format (the fp16 scale, and the Q4_1 block minimum, times
2), and so is the 0.5 weight; only the summation order differs from the dense FFN (two
partial sums instead of one), a float rounding difference.

Neurons are split in groups of 32 (one quantized block of ``down``'s row), so every block is
kept whole and no weight is requantized. Each pair of a layer gets its own random split, so
the experts of a layer are all different and a mix-up between experts of two pairs changes
the output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ModelFormatError, UnsupportedError

GROUP = 32  # neurons per group: one Q4_0/Q4_1/Q8_0 block of a down row

# Bytes at the start of each block that hold fp16 values scaling the block (d; d and m for
# Q4_1): doubling them doubles the block. Float types double their values instead.
_SCALE_HALVES = {"Q4_0": 1, "Q4_1": 2, "Q8_0": 1}
_FLOAT = {"F32": np.float32, "F16": np.float16}


def halves(n_groups: int, n_pairs: int, rng: np.random.Generator) -> list[tuple[Any, Any]]:
    """For each pair, two disjoint sorted arrays of group indices covering 0..n_groups-1."""
    out = []
    for _ in range(n_pairs):
        perm = rng.permutation(n_groups)
        out.append((np.sort(perm[: n_groups // 2]), np.sort(perm[n_groups // 2 :])))
    return out


def neuron_rows(data: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Rows (neurons) of a gate or up matrix stored [ffn, ...] belonging to `groups`."""
    idx = (groups[:, None] * GROUP + np.arange(GROUP)).reshape(-1)
    return np.ascontiguousarray(data[idx])


def doubled_down_columns(
    data: np.ndarray, qtype: str, groups: np.ndarray, n_groups: int
) -> np.ndarray:
    """The down matrix (rows = hidden, columns = `n_groups` x 32 neurons) restricted to the
    columns of `groups`, every value doubled exactly (scales doubled in block formats)."""
    rows = data.shape[0]
    if qtype in _FLOAT:
        cols = data.reshape(rows, -1, GROUP)[:, groups, :].reshape(rows, -1)
        doubled = cols.astype(_FLOAT[qtype]) * _FLOAT[qtype](2)
        if not np.all(np.isfinite(doubled)):
            raise ModelFormatError("demo MoE: doubling the down matrix overflows")
        return np.ascontiguousarray(doubled)
    if qtype not in _SCALE_HALVES:
        raise UnsupportedError(
            f"demo MoE experts='halves': down matrices in {qtype} are not supported "
            f"({', '.join([*_SCALE_HALVES, *_FLOAT])} are)"
        )
    blocks = data.reshape(rows, -1)  # raw bytes of each row
    per_group = blocks.shape[1] // n_groups  # one block: 32 weights
    out = blocks.reshape(rows, n_groups, per_group)[:, groups, :].copy()
    n_scales = _SCALE_HALVES[qtype]
    scales = out[:, :, : 2 * n_scales].copy().view(np.float16)
    doubled = scales * np.float16(2)
    if not np.all(np.isfinite(doubled)):
        raise ModelFormatError("demo MoE: doubling a block scale overflows fp16")
    out[:, :, : 2 * n_scales] = doubled.view(np.uint8)
    return np.ascontiguousarray(out.reshape(rows, -1))
