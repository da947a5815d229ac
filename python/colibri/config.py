"""Typed engine settings.

Every setting is a field of a frozen dataclass, validated when the object is built: an
unknown name or a bad value raises :class:`colibri.errors.ConfigError` (a ``ValueError``)
whose message names the field and says what is allowed. Strings are accepted wherever an
enum is expected (``wait_policy="spin"``). Objects never change; ``cfg.replace(...)``
returns a new, validated one. Nothing here reads the environment.

The defaults, and why, are documented in ``docs/tuning.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import Enum
from typing import Any, Literal, TypeVar

from .errors import ConfigError

__all__ = [
    "DEFAULT_CONTEXT_CAP",
    "MAX_SPIN_US",
    "MAX_THREADS",
    "ActivationPrecision",
    "EngineConfig",
    "ThreadConfig",
    "WaitPolicy",
]

MAX_THREADS = 1024
"""Largest team size the core accepts (csrc/threadpool: kMaxThreads)."""

MAX_SPIN_US = 1_000_000
"""Largest hybrid spin time in microseconds (csrc/threadpool: kMaxSpinUs), i.e. 1 s."""

DEFAULT_CONTEXT_CAP = 4096
"""KV-cache positions used when ``context_length`` is None and the model allows more."""


class WaitPolicy(str, Enum):
    """How the compute threads wait between the parallel regions of one computation.

    Outside a computation (between calls) every policy sleeps: an idle model uses no CPU.
    """

    SPIN = "spin"
    """Busy-wait. Lowest hand-off latency; each waiting thread keeps a core at 100 %."""
    PASSIVE = "passive"
    """Sleep on a condition variable. No CPU while waiting; a wake-up costs ~5-50 µs."""
    HYBRID = "hybrid"
    """Spin for ``spin_us`` microseconds, then sleep."""


WaitPolicyName = Literal["spin", "passive", "hybrid"]


class ActivationPrecision(str, Enum):
    """How activations meet quantized weights (Q8_0, Q4_0, Q4_1) in matrix products.
    Float weights (F32, F16, BF16) always meet float32 activations."""

    INT8 = "int8"
    """Round each activation row to 8-bit blocks and use integer dot products (AVX-512
    VNNI / AVX2), as llama.cpp does. The fastest; logits differ from an F32 evaluation of
    the dequantized weights by the activation rounding (~1-4 % relative on SmolLM2)."""
    FLOAT32 = "float32"
    """Dequantize each weight row and use float dot products, as transformers does with a
    GGUF. Matches it to float rounding; slower."""

_E = TypeVar("_E", bound=Enum)
_C = TypeVar("_C")


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


def _check_names(cls: type, names: Mapping[str, object] | set[str]) -> None:
    """Raises ConfigError for a name that is not a field of dataclass `cls`."""
    allowed = [f.name for f in dataclasses.fields(cls)]
    for name in names:
        if name not in allowed:
            raise ConfigError(
                f"{cls.__name__}: unknown setting {name!r}; allowed: {', '.join(allowed)}"
            )


def _replace(obj: _C, changes: Mapping[str, Any]) -> _C:
    _check_names(type(obj), set(changes))
    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]


# --- settings -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, init=False)
class ThreadConfig:
    """The compute team: how many threads run a forward pass and how they wait.

    ``ThreadConfig(n=None, wait_policy="hybrid", spin_us=100)`` is the default: one thread
    per performance core, spinning at most 100 µs between regions before sleeping.
    """

    n: int | None
    """Team size, the calling thread included, 1..MAX_THREADS. ``None`` = the number of
    performance cores this process may use (:func:`colibri.plan.performance_cores`: physical
    cores, no SMT siblings, no efficiency cores, within the affinity mask and CPU quota)."""

    wait_policy: WaitPolicy
    """How threads wait between the parallel regions of one computation (see WaitPolicy);
    between calls every policy sleeps. Default HYBRID: the fast spinning hand-off between
    back-to-back regions, without burning cores through waits for the disk or the GPU.
    SPIN suits a dedicated, compute-bound x86 host; PASSIVE suits Apple Silicon, GPU
    offload, disk-bound runs and shared machines (docs/tuning.md, with the seed figures)."""

    spin_us: int
    """HYBRID only: microseconds a waiting thread spins before it sleeps, 0..MAX_SPIN_US.
    Default 100 µs, the order of a sleep plus wake-up: spinning about as long as blocking
    would cost never costs more than ~2x the best choice made in hindsight, and a wait for
    the disk or the GPU (milliseconds) stops burning the cores the I/O threads and the
    GPU's power budget need. 0 behaves like PASSIVE."""

    def __init__(
        self,
        n: int | None = None,
        wait_policy: WaitPolicy | WaitPolicyName = WaitPolicy.HYBRID,
        spin_us: int = 100,
    ) -> None:
        object.__setattr__(self, "n", _optional_int(
            "ThreadConfig.n", n, 1, MAX_THREADS, "threads", "one per performance core"
        ))
        object.__setattr__(
            self, "wait_policy", _enum("ThreadConfig.wait_policy", wait_policy, WaitPolicy)
        )
        object.__setattr__(
            self, "spin_us", _int("ThreadConfig.spin_us", spin_us, 0, MAX_SPIN_US, "microseconds")
        )

    def replace(self, **changes: Any) -> ThreadConfig:
        """A copy with `changes` applied and validated."""
        return _replace(self, changes)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ThreadConfig:
        """Builds from a mapping of field names (e.g. parsed JSON/TOML); validates."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"ThreadConfig: expected a mapping, got {type(d).__name__}")
        _check_names(cls, d)
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (enums as strings); ``from_dict(to_dict())`` round-trips."""
        return {"n": self.n, "wait_policy": self.wait_policy.value, "spin_us": self.spin_us}

    def team_size(self) -> int:
        """The team size to use: ``n``, or the performance-core count when n is None."""
        if self.n is not None:
            return self.n
        from .plan import performance_cores  # probes only when asked to

        return min(performance_cores(), MAX_THREADS)


@dataclasses.dataclass(frozen=True, init=False)
class EngineConfig:
    """Everything that shapes how a model runs. Outputs are the same bits under every
    setting here except ``activation_precision``, which picks the arithmetic."""

    threads: ThreadConfig
    """The compute team (size and wait policy). A mapping is accepted and converted."""

    context_length: int | None
    """KV-cache positions per session, >= 1. ``None`` = the model's maximum context capped
    at DEFAULT_CONTEXT_CAP (4096), so a 128k-context model does not reserve a 128k cache
    unless asked to. See :meth:`resolve_context_length`."""

    activation_precision: ActivationPrecision
    """``"int8"`` (default, llama.cpp's arithmetic) or ``"float32"`` (transformers'). Unlike
    the other settings this one changes the numbers (see :class:`ActivationPrecision`);
    the result is still bit-identical across threads and policies for each choice."""

    def __init__(
        self,
        threads: ThreadConfig | Mapping[str, Any] | None = None,
        context_length: int | None = None,
        activation_precision: ActivationPrecision | str = ActivationPrecision.INT8,
    ) -> None:
        if threads is None:
            threads = ThreadConfig()
        elif isinstance(threads, Mapping):
            threads = ThreadConfig.from_dict(threads)
        elif not isinstance(threads, ThreadConfig):
            raise ConfigError(
                "EngineConfig.threads: expected a ThreadConfig or a mapping of its fields, "
                f"got {type(threads).__name__}"
            )
        object.__setattr__(self, "threads", threads)
        object.__setattr__(
            self,
            "activation_precision",
            _enum("EngineConfig.activation_precision", activation_precision, ActivationPrecision),
        )
        object.__setattr__(
            self,
            "context_length",
            _optional_int("EngineConfig.context_length", context_length, 1, 1 << 30, "positions",
                          "the model's maximum, at most 4096"),
        )

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with `changes` applied and validated (``threads`` may be a mapping)."""
        return _replace(self, changes)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EngineConfig:
        """Builds from nested mappings, e.g. ``{"threads": {"n": 4}, "context_length": 2048}``."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"EngineConfig: expected a mapping, got {type(d).__name__}")
        _check_names(cls, d)
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain values; ``from_dict(to_dict())`` round-trips."""
        return {
            "threads": self.threads.to_dict(),
            "context_length": self.context_length,
            "activation_precision": self.activation_precision.value,
        }

    def resolve_context_length(self, model_max: int) -> int:
        """KV-cache positions for a model whose maximum context is `model_max`.

        None gives ``min(model_max, DEFAULT_CONTEXT_CAP)``; an explicit value larger than
        the model's maximum raises ConfigError (positions past it were never trained).
        """
        model_max = _int("model maximum context", model_max, 1, 1 << 30, "positions")
        if self.context_length is None:
            return min(model_max, DEFAULT_CONTEXT_CAP)
        if self.context_length > model_max:
            raise ConfigError(
                f"EngineConfig.context_length: {self.context_length} exceeds the model's "
                f"maximum context of {model_max}; use at most {model_max} (or None)"
            )
        return self.context_length
