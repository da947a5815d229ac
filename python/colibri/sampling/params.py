"""The :class:`Sampling` settings: a frozen, validated dataclass.

Built like the settings in :mod:`colibri.settings.config`: every field is validated when the object
is built, an unknown name or a bad value raises :class:`colibri.errors.ConfigError` (a
``ValueError``) naming the field and what is allowed, objects never change, and
``s.replace(...)`` returns a new, validated one. ``from_dict``/``to_dict`` round-trip
through JSON (logit-bias keys may be decimal strings there, as in OpenAI's API).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError
from ..settings.names import check_names, checked_init, settings_repr

__all__ = ["MAX_TOKEN_ID", "MAX_TOP_LOGPROBS", "LogitBias", "LogprobsMode", "Sampling"]

LogprobsMode = Literal["raw", "processed"]

MAX_TOKEN_ID = (1 << 31) - 1
"""Largest token id accepted anywhere in sampling settings (ids are int32 in the core)."""

MAX_TOP_LOGPROBS = 1024
"""Most alternatives ``top_logprobs``/``prompt_logprobs`` may ask for per token."""

_Number = (int, float, np.integer, np.floating)


# --- validation helpers (same messages as colibri.settings.config) -----------------------


def _int(field: str, value: object, lo: int, hi: int, meaning: str = "") -> int:
    """An int (or NumPy integer) within [lo, hi]; bool is rejected."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(
            f"{field}: expected an integer{meaning and ' (' + meaning + ')'}, "
            f"got {type(value).__name__} {value!r}"
        )
    v = int(value)
    if not lo <= v <= hi:
        suffix = f" ({meaning})" if meaning else ""
        raise ConfigError(f"{field}: {v} is out of range; allowed {lo}..{hi}{suffix}")
    return v


def _float(
    field: str,
    value: object,
    allowed: str,
    *,
    lo: float = -math.inf,
    lo_open: bool = False,
    hi: float = math.inf,
) -> float:
    """A finite real number (int accepted, bool rejected) within the bounds; `allowed`
    describes the valid values for the error message."""
    if isinstance(value, bool) or not isinstance(value, _Number):
        raise ConfigError(f"{field}: expected a number ({allowed}), got {type(value).__name__} "
                          f"{value!r}")
    v = float(value)
    if not math.isfinite(v) or v < lo or (lo_open and v == lo) or v > hi:
        raise ConfigError(f"{field}: {value!r} is not allowed; use {allowed}")
    return v


def _check_names(names: Mapping[str, object] | set[str]) -> None:
    check_names("Sampling", names, [f.name for f in dataclasses.fields(Sampling)])


# --- logit bias ---------------------------------------------------------------------------


class LogitBias(Mapping[int, float]):
    """An immutable, hashable ``token id -> bias`` mapping (``Sampling.logit_bias``).

    Keys are token ids (ints >= 0); values are finite numbers or ``-inf`` (the token is
    never chosen). Compares equal to any mapping with the same items, dicts included.
    """

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[Any, Any] | None = None, *, field: str = "logit_bias",
                 string_keys: bool = False) -> None:
        if items is None:
            items = {}
        if not isinstance(items, Mapping):
            raise ConfigError(
                f"{field}: expected a mapping of token id -> bias, got {type(items).__name__}"
            )
        d: dict[int, float] = {}
        for key, value in items.items():
            k = key
            if string_keys and isinstance(key, str) and key.strip().isdigit():
                k = int(key)
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
                raise ConfigError(
                    f"{field}: keys must be integer token ids, got {type(key).__name__} {key!r}"
                )
            tid = _int(f"{field} key", k, 0, MAX_TOKEN_ID, "a token id")
            if isinstance(value, bool) or not isinstance(value, _Number):
                raise ConfigError(
                    f"{field}[{tid}]: expected a number (finite, or -inf to ban the token), "
                    f"got {type(value).__name__} {value!r}"
                )
            v = float(value)
            if math.isnan(v) or v == math.inf:
                raise ConfigError(
                    f"{field}[{tid}]: {value!r} is not allowed; use a finite number, "
                    "or -inf to ban the token"
                )
            d[tid] = v
        self._items: dict[int, float] = dict(sorted(d.items()))
        self._hash = hash(frozenset(self._items.items()))

    def __getitem__(self, key: int) -> float:
        return self._items[key]

    def __iter__(self) -> Iterator[int]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return self._items == dict(other.items())

    def __repr__(self) -> str:
        return f"LogitBias({self._items!r})"

    def to_dict(self) -> dict[int, float]:
        """A plain (mutable) copy."""
        return dict(self._items)


# --- Sampling -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, init=False)
class Sampling:
    """How the next token is chosen from the logits.

    ``Sampling()`` is greedy decoding (argmax, ties to the lowest id). The stages apply in
    llama.cpp's order: logit bias, penalties, top-k, top-p, min-p, temperature, draw (see
    ``docs/sampling.md``). Every default leaves its stage off.
    """

    temperature: float
    """>= 0. 0 = greedy (argmax of the biased, penalized logits, ties to the lowest id);
    otherwise the kept logits are divided by it before the softmax."""

    top_k: int
    """Keep the k most likely tokens (ties to the lowest ids); 0 = off."""

    top_p: float
    """Nucleus sampling, in (0, 1]: keep the smallest set of most likely tokens whose
    probability reaches top_p; 1 = off."""

    min_p: float
    """In [0, 1]: drop tokens whose probability is below ``min_p`` times the most likely
    token's; 0 = off."""

    repetition_penalty: float
    """> 0; 1 = off. For each distinct token in the penalty window, a positive logit is
    divided by it and a negative one multiplied (llama.cpp / transformers semantics)."""

    presence_penalty: float
    """Subtracted once from the logit of every token present in the window (OpenAI
    semantics; OpenAI allows -2..2, any finite value is accepted here)."""

    frequency_penalty: float
    """Subtracted from a token's logit once per occurrence in the window (OpenAI)."""

    penalty_last_n: int
    """The penalty window: the last n tokens of the history; -1 = all of it, 0 = none
    (penalties off)."""

    logit_bias: LogitBias
    """``token id -> bias`` added to the logits first; ``-inf`` bans a token. Any mapping is
    accepted and stored as an immutable :class:`LogitBias`."""

    seed: int | None
    """Seeds the random generator of :class:`colibri.sampling.Sampler`: the same seed gives
    the same tokens (for the same logits and NumPy version). None = fresh OS entropy."""

    # Log-probabilities: reported by the decode loop (Model.generate/stream, sessions), not
    # used by the Sampler (see colibri.generate.logprobs).

    logprobs: bool
    """Report each generated token's log-probability (``Chunk.logprobs``,
    ``Generation.logprobs``). Default False."""

    top_logprobs: int
    """With ``logprobs``: also the ``k`` most likely alternatives at each step (token id,
    text, log-probability), most likely first, ties to the lower id; 0 = none."""

    logprobs_mode: LogprobsMode
    """Which distribution the log-probabilities are of: ``"raw"`` (default) the
    log-softmax of the model's logits, what OpenAI and vLLM report, at temperature 0 too;
    ``"processed"`` the distribution the token was drawn from, after logits processors,
    logit bias, penalties, filters and temperature (``-inf`` for filtered tokens; greedy
    decoding is one-hot: 0 for the chosen token)."""

    prompt_logprobs: int | None
    """Score the prompt: the raw log-probability of every prompt token given the ones
    before it (``Generation.prompt_logprobs``; the first token has none), with the ``k``
    most likely alternatives at each position. None = off; 0 = the prompt tokens only."""

    @checked_init
    def __init__(
        self,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        penalty_last_n: int = 64,
        logit_bias: Mapping[int, float] | None = None,
        seed: int | None = None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        logprobs_mode: LogprobsMode = "raw",
        prompt_logprobs: int | None = None,
    ) -> None:
        def put(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        put("temperature", _float("Sampling.temperature", temperature,
                                  "a finite number >= 0 (0 = greedy)", lo=0.0))
        put("top_k", _int("Sampling.top_k", top_k, 0, MAX_TOKEN_ID, "0 = off"))
        put("top_p", _float("Sampling.top_p", top_p, "a number in (0, 1] (1 = off)",
                            lo=0.0, lo_open=True, hi=1.0))
        put("min_p", _float("Sampling.min_p", min_p, "a number in [0, 1] (0 = off)",
                            lo=0.0, hi=1.0))
        # Bounded: logits are divided or multiplied by it, and 1e-308 made them infinite.
        put("repetition_penalty", _float("Sampling.repetition_penalty", repetition_penalty,
                                         "a number in [0.001, 1000] (1 = off)", lo=1e-3, hi=1e3))
        put("presence_penalty", _float("Sampling.presence_penalty", presence_penalty,
                                       "a finite number (0 = off)"))
        put("frequency_penalty", _float("Sampling.frequency_penalty", frequency_penalty,
                                        "a finite number (0 = off)"))
        put("penalty_last_n", _int("Sampling.penalty_last_n", penalty_last_n, -1, MAX_TOKEN_ID,
                                   "-1 = all, 0 = none"))
        put("logit_bias", logit_bias if isinstance(logit_bias, LogitBias)
            else LogitBias(logit_bias, field="Sampling.logit_bias"))
        put("seed", None if seed is None else _int("Sampling.seed", seed, 0, (1 << 128) - 1,
                                                    "or None"))
        if not isinstance(logprobs, bool):
            raise ConfigError(f"Sampling.logprobs: expected True or False, got {logprobs!r}")
        put("logprobs", logprobs)
        put("top_logprobs", _int("Sampling.top_logprobs", top_logprobs, 0, MAX_TOP_LOGPROBS,
                                 "alternatives per token, 0 = none"))
        if top_logprobs and not logprobs:
            raise ConfigError("Sampling.top_logprobs: needs logprobs=True")
        if logprobs_mode not in ("raw", "processed"):
            raise ConfigError(f"Sampling.logprobs_mode: {logprobs_mode!r} is not allowed; use "
                              "'raw' or 'processed'")
        put("logprobs_mode", logprobs_mode)
        put("prompt_logprobs", None if prompt_logprobs is None else _int(
            "Sampling.prompt_logprobs", prompt_logprobs, 0, MAX_TOP_LOGPROBS,
            "alternatives per prompt token, or None = off"))

    @property
    def greedy(self) -> bool:
        """True when the choice is deterministic argmax (temperature 0 or top_k 1)."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalties_active(self) -> bool:
        """True when any penalty changes the logits (and the window is not empty)."""
        return self.penalty_last_n != 0 and (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    def __repr__(self) -> str:
        """Only what differs from the defaults (greedy): ``Sampling(temperature=0.7,
        seed=1)``; ``eval(repr(s)) == s``."""
        return settings_repr(self)

    def replace(self, **changes: Any) -> Sampling:
        """A copy with `changes` applied and validated."""
        _check_names(set(changes))
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sampling:
        """Builds from a mapping of field names (e.g. parsed JSON/TOML); validates.

        ``logit_bias`` keys may be decimal strings here (JSON object keys are strings).
        """
        if not isinstance(d, Mapping):
            raise ConfigError(f"Sampling: expected a mapping, got {type(d).__name__}")
        _check_names(d)
        kwargs = dict(d)
        if kwargs.get("logit_bias") is not None:
            kwargs["logit_bias"] = LogitBias(kwargs["logit_bias"], field="Sampling.logit_bias",
                                             string_keys=True)
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Plain values; ``from_dict(to_dict())`` round-trips (also through JSON)."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "penalty_last_n": self.penalty_last_n,
            "logit_bias": self.logit_bias.to_dict(),
            "seed": self.seed,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
            "logprobs_mode": self.logprobs_mode,
            "prompt_logprobs": self.prompt_logprobs,
        }
