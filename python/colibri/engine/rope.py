"""RoPE as data: the inverse frequencies and attention factor for a model's config.

The core applies rotary embeddings from a table of inverse frequencies (rotate-half
convention); every scaling variant the supported families use is a different table,
computed here with the same float32 arithmetic as transformers' ``ROPE_INIT_FUNCTIONS``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ColibriError, ModelFormatError, UnsupportedError

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True)
class RopeTable:
    inv_freq: np.ndarray  # float32 [rotary_dim / 2]
    attention_factor: float  # multiplies cos and sin


def _base_inv_freq(base: float, dim: int) -> np.ndarray:
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv: np.ndarray = (np.float32(1.0) / np.power(np.float32(base), exponents)).astype(np.float32)
    return inv


def rope_table(
    head_dim: int,
    theta: float,
    scaling: Mapping[str, Any] | None,
    max_position_embeddings: int,
    partial_rotary_factor: float = 1.0,
) -> RopeTable:
    """The table for a config; ModelFormatError when its parameters are missing or give
    frequencies that are not finite and positive (they would make NaN logits). The
    sources check the parameters first (``sources.validate.check_rope_scaling``)."""
    try:
        with np.errstate(all="ignore"):  # non-finite results are reported below
            table = _rope_table(head_dim, theta, scaling, max_position_embeddings,
                                partial_rotary_factor)  # fmt: skip
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
        if isinstance(exc, ColibriError):
            raise
        raise ModelFormatError(
            f"the RoPE scaling parameters are invalid ({type(exc).__name__}: {str(exc)[:80]})"
        ) from exc
    inv = table.inv_freq
    if not (np.all(np.isfinite(inv)) and np.all(inv > 0)) or not (
        math.isfinite(table.attention_factor) and table.attention_factor > 0
    ):
        raise ModelFormatError(
            f"RoPE base {theta!r} with these scaling parameters gives frequencies that are "
            f"not finite and positive; the model's config is corrupt"
        )
    return table


def _rope_table(
    head_dim: int,
    theta: float,
    scaling: Mapping[str, Any] | None,
    max_position_embeddings: int,
    partial_rotary_factor: float,
) -> RopeTable:
    dim = int(head_dim * partial_rotary_factor)
    rope_type = "default"
    if scaling:
        rope_type = str(scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedError(
            f"RoPE scaling type {rope_type!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    inv_freq = _base_inv_freq(theta, dim)
    if rope_type in ("default", "dynamic") or not scaling:
        # Dynamic NTK only changes frequencies beyond the trained length; within it, and for
        # the context lengths colibri allocates by default, it equals the default table.
        return RopeTable(inv_freq, 1.0)
    factor = float(scaling["factor"])
    if rope_type == "linear":
        return RopeTable((inv_freq / np.float32(factor)).astype(np.float32), 1.0)
    if rope_type == "llama3":
        return RopeTable(_llama3(inv_freq, factor, scaling), 1.0)
    return _yarn(theta, dim, factor, scaling, max_position_embeddings)


def _llama3(inv_freq: np.ndarray, factor: float, s: Mapping[str, Any]) -> np.ndarray:
    low = float(s["low_freq_factor"])
    high = float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
    low_wavelen = old_ctx / low
    high_wavelen = old_ctx / high
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / np.float32(factor), inv_freq)
    smooth = (np.float32(old_ctx) / wavelen - np.float32(low)) / np.float32(high - low)
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(
    base: float, dim: int, factor: float, s: Mapping[str, Any], max_positions: int
) -> RopeTable:
    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        ms, ms_all = s.get("mscale"), s.get("mscale_all_dim")
        if ms and ms_all:
            attention_factor = mscale(factor, float(ms)) / mscale(factor, float(ms_all))
        else:
            attention_factor = mscale(factor)
    beta_fast = float(s.get("beta_fast") or 32)
    beta_slow = float(s.get("beta_slow") or 1)
    original = int(s.get("original_max_position_embeddings") or max_positions)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = (np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low)
    extrapolation_factor = 1 - np.clip(ramp, 0, 1)
    pos_freqs = np.power(
        np.float32(base), np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    )
    inv_extra = np.float32(1.0) / pos_freqs
    inv_inter = np.float32(1.0) / (np.float32(factor) * pos_freqs)
    inv_freq = inv_inter * (1 - extrapolation_factor) + inv_extra * extrapolation_factor
    return RopeTable(inv_freq.astype(np.float32), float(attention_factor))
