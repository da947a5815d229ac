"""SpecConfig: whether and how the decode loop drafts tokens to verify in one forward."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ..errors import ConfigError
from .names import check_names, checked_init, did_you_mean, settings_repr

__all__ = ["MAX_DRAFT", "MAX_NGRAM", "SpecConfig"]

MAX_DRAFT = 64
"""Largest ``SpecConfig.max_draft``: a verify forward of more tokens than this costs far
more than the drafts it could save."""

MAX_NGRAM = 16
"""Largest n-gram size the lookup matches."""

DrafterName = Literal["off", "lookup", "mtp", "auto"]
_DRAFTERS: tuple[str, ...] = ("off", "lookup", "mtp", "auto")


@dataclasses.dataclass(frozen=True, init=False)
class SpecConfig:
    """Speculative decoding (``docs/speculative.md``). It never changes the tokens: greedy
    output is the same token for token, sampled output the same tokens for the same seed.

    ``EngineConfig(spec=...)`` sets it for a model; ``generate(..., spec=...)`` (and
    ``stream``, ``chat``, sessions) for one call.
    """

    drafter: DrafterName
    """``"off"`` (default): one token per forward. ``"lookup"``: prompt-lookup drafts (the
    continuation of the latest earlier occurrence of the last n tokens, in the prompt or the
    generated text), verified in one batched forward. ``"mtp"``: the model's own
    multi-token-prediction layer (DeepSeek-V3, GLM-4.5, GLM-5: ``num_nextn_predict_layers``)
    drafts, chained for depth > 1; a model without one is refused. ``"auto"``: MTP when the
    model has it, else lookup, while it pays, as measured (accepted tokens per forward
    against the measured cost of drafting and verifying); it stops drafting when it loses
    and probes again later."""

    max_draft: int
    """Most tokens drafted per verify forward, 1..MAX_DRAFT (default 8)."""

    ngram_sizes: tuple[int, ...]
    """The n-gram sizes the lookup tries, in order (default ``(3, 2, 1)``: the longest
    match first, as llama.cpp's lookup and vLLM's ngram drafter do); each 1..MAX_NGRAM."""

    @checked_init
    def __init__(
        self,
        drafter: DrafterName = "off",
        max_draft: int = 8,
        ngram_sizes: Sequence[int] = (3, 2, 1),
    ) -> None:
        if not (isinstance(drafter, str) and drafter.strip().lower() in _DRAFTERS):
            hint = did_you_mean(drafter.strip().lower() if isinstance(drafter, str) else drafter,
                                _DRAFTERS)
            raise ConfigError(f"SpecConfig.drafter: {drafter!r} is not allowed{hint}; use one "
                              f"of {', '.join(repr(d) for d in _DRAFTERS)}")
        object.__setattr__(self, "drafter", drafter.strip().lower())
        if isinstance(max_draft, bool) or not isinstance(max_draft, int):
            raise ConfigError(f"SpecConfig.max_draft: expected an integer (tokens), got "
                              f"{type(max_draft).__name__} {max_draft!r}")
        if not 1 <= max_draft <= MAX_DRAFT:
            raise ConfigError(f"SpecConfig.max_draft: {max_draft} is out of range; allowed "
                              f"1..{MAX_DRAFT} tokens (drafter='off' turns drafting off)")
        object.__setattr__(self, "max_draft", max_draft)
        if isinstance(ngram_sizes, (str, bytes)) or not isinstance(ngram_sizes, Sequence):
            raise ConfigError(f"SpecConfig.ngram_sizes: expected a sequence of integers such "
                              f"as (3, 2, 1), got {type(ngram_sizes).__name__} {ngram_sizes!r}")
        sizes = tuple(ngram_sizes)
        if not sizes:
            raise ConfigError("SpecConfig.ngram_sizes: give at least one size, e.g. (3, 2, 1)")
        for n in sizes:
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NGRAM:
                raise ConfigError(f"SpecConfig.ngram_sizes: {n!r} is not allowed; each size "
                                  f"is an integer in 1..{MAX_NGRAM}")
        if len(set(sizes)) != len(sizes):
            raise ConfigError(f"SpecConfig.ngram_sizes: {sizes} repeats a size; give each "
                              "once, longest first")
        object.__setattr__(self, "ngram_sizes", sizes)

    @property
    def enabled(self) -> bool:
        return self.drafter != "off"

    def __repr__(self) -> str:
        """Only what differs from the defaults; ``eval(repr(c)) == c``."""
        return settings_repr(self)

    def replace(self, **changes: Any) -> SpecConfig:
        """A copy with `changes` applied and validated."""
        check_names("SpecConfig", changes, [f.name for f in dataclasses.fields(self)])
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpecConfig:
        """Builds from a mapping of field names; validates."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"SpecConfig: expected a mapping, got {type(d).__name__}")
        check_names("SpecConfig", d, [f.name for f in dataclasses.fields(cls)])
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Plain values; ``from_dict(to_dict())`` round-trips."""
        return {"drafter": self.drafter, "max_draft": self.max_draft,
                "ngram_sizes": list(self.ngram_sizes)}


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
