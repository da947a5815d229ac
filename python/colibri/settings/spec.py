"""SpecConfig: whether and how the decode loop drafts tokens to verify in one forward."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from ..errors import ConfigError
from .names import did_you_mean
from .table import Check, Setting, Settings

__all__ = ["MAX_DRAFT", "MAX_NGRAM", "SPEC", "SpecConfig", "as_spec"]

MAX_DRAFT = 64
"""Largest ``SpecConfig.max_draft``: a verify forward of more tokens than this costs far
more than the drafts it could save."""

MAX_NGRAM = 16
"""Largest n-gram size the lookup matches."""

DrafterName = Literal["off", "lookup", "mtp", "auto"]
_DRAFTERS: tuple[str, ...] = ("off", "lookup", "mtp", "auto")


def _drafter(field: str, drafter: object) -> DrafterName:
    if not (isinstance(drafter, str) and drafter.strip().lower() in _DRAFTERS):
        hint = did_you_mean(drafter.strip().lower() if isinstance(drafter, str) else drafter,
                            _DRAFTERS)
        raise ConfigError(f"{field}: {drafter!r} is not allowed{hint}; use one "
                          f"of {', '.join(repr(d) for d in _DRAFTERS)}")
    return drafter.strip().lower()  # type: ignore[return-value]


def _max_draft(field: str, max_draft: object) -> int:
    if isinstance(max_draft, bool) or not isinstance(max_draft, int):
        raise ConfigError(f"{field}: expected an integer (tokens), got "
                          f"{type(max_draft).__name__} {max_draft!r}")
    if not 1 <= max_draft <= MAX_DRAFT:
        raise ConfigError(f"{field}: {max_draft} is out of range; allowed "
                          f"1..{MAX_DRAFT} tokens (drafter='off' turns drafting off)")
    return max_draft


def _ngram_sizes(field: str, ngram_sizes: object) -> tuple[int, ...]:
    if isinstance(ngram_sizes, (str, bytes)) or not isinstance(ngram_sizes, Sequence):
        raise ConfigError(f"{field}: expected a sequence of integers such "
                          f"as (3, 2, 1), got {type(ngram_sizes).__name__} {ngram_sizes!r}")
    sizes = tuple(ngram_sizes)
    if not sizes:
        raise ConfigError(f"{field}: give at least one size, e.g. (3, 2, 1)")
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NGRAM:
            raise ConfigError(f"{field}: {n!r} is not allowed; each size "
                              f"is an integer in 1..{MAX_NGRAM}")
    if len(set(sizes)) != len(sizes):
        raise ConfigError(f"{field}: {sizes} repeats a size; give each once, longest first")
    return sizes


class SpecConfig(Settings):
    """Speculative decoding (``docs/speculative.md``). It never changes the tokens: greedy
    output is the same token for token, sampled output the same tokens for the same seed.

    ``EngineConfig(spec=...)`` sets it for a model; ``generate(..., spec=...)`` (and
    ``stream``, ``chat``, sessions) for one call.
    """

    drafter: Setting[DrafterName, DrafterName] = Setting(
        Check(_drafter, choices=_DRAFTERS), default="off",
        doc="off, lookup (prompt-lookup drafts), mtp (the model's MTP layer) or auto")
    """``"off"`` (default): one token per forward. ``"lookup"``: prompt-lookup drafts (the
    continuation of the latest earlier occurrence of the last n tokens, in the prompt or the
    generated text), verified in one batched forward. ``"mtp"``: the model's own
    multi-token-prediction layer (DeepSeek-V3, GLM-4.5, GLM-5: ``num_nextn_predict_layers``)
    drafts, chained for depth > 1; a model without one is refused. ``"auto"``: MTP when the
    model has it, else lookup, while it pays, as measured (accepted tokens per forward
    against the measured cost of drafting and verifying); it stops drafting when it loses
    and probes again later."""

    max_draft: Setting[int, int] = Setting(
        Check(_max_draft), default=8, doc="most tokens drafted per verify forward")
    """Most tokens drafted per verify forward, 1..MAX_DRAFT (default 8)."""

    ngram_sizes: Setting[Sequence[int], tuple[int, ...]] = Setting(
        Check(_ngram_sizes), default=(3, 2, 1), doc="the n-gram sizes the lookup tries")
    """The n-gram sizes the lookup tries, in order (default ``(3, 2, 1)``: the longest
    match first, as llama.cpp's lookup and vLLM's ngram drafter do); each 1..MAX_NGRAM."""

    @property
    def enabled(self) -> bool:
        return self.drafter != "off"


def as_spec(value: object, field: str = "spec") -> SpecConfig | None:
    """A SpecConfig from a SpecConfig, a mapping of its fields or a drafter name; None
    stays None (the caller's default)."""
    if value is None or isinstance(value, SpecConfig):
        return value
    if isinstance(value, str):
        return SpecConfig(drafter=value)  # type: ignore[arg-type]
    if isinstance(value, Mapping):
        return SpecConfig.from_dict(value)
    raise ConfigError(f"{field}: expected a colibri.SpecConfig, a mapping of its fields or a "
                      f"drafter name ('off', 'lookup', 'mtp', 'auto'), got {type(value).__name__}")


SPEC: Check[SpecConfig] = Check(lambda field, value: as_spec(value, field) or SpecConfig())
"""The check of a SpecConfig field (EngineConfig.spec): None is the default, off."""
