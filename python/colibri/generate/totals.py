"""A model's figures since load: the generations' running totals and ModelStats, the
record ``Model.stats()`` returns."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..display import Displayable, model_stats_rows
from ..engine.gpu_offload import GPUStats
from ..engine.stats import ExpertStats, MemoryStats, PhaseTimes
from ..speculative import SpecStats
from .generation import GenerationStats, rate

__all__ = ["ModelStats", "Totals"]


@dataclass(frozen=True, repr=False)
class ModelStats(Displayable):
    """Cumulative counters of a model since load, and the last generation's record.

    ``generations``, ``prompt_tokens``, ``generated_tokens`` and the seconds count every
    generation since load; ``experts`` and ``phases`` the streaming tier since load or
    :meth:`Model.reset_stats`; ``memory`` is the RAM split now; ``last`` is the most recent
    generation to finish, from any thread (a generation's own record is
    ``Generation.stats``)."""

    generations: int
    prompt_tokens: int
    generated_tokens: int
    prefill_seconds: float
    decode_seconds: float
    decode_tokens: int
    last: GenerationStats | None
    # The streaming tier, cumulative since load (reset_stats() zeroes them).
    memory: MemoryStats | None = None
    experts: ExpertStats = field(default_factory=ExpertStats)
    phases: PhaseTimes = field(default_factory=PhaseTimes)
    wait_policy: str = ""  # in effect now: "spin", "passive", "hybrid" or "auto (passive)"...
    prefetch: str = ""  # the lookahead now: "off", "on (accuracy 74%)", "paused (...)"
    io: str = ""  # expert-read workers, and the measured depth curve under workers="auto"
    # Speculative decoding summed over every generation that drafted (None: none did).
    spec: SpecStats | None = None
    # EngineConfig(device="gpu"): the GPU's share since load (None: the CPU only).
    gpu: GPUStats | None = None

    @property
    def prefill_tok_s(self) -> float:
        return rate(self.prompt_tokens, self.prefill_seconds)

    @property
    def decode_tok_s(self) -> float:
        return rate(self.decode_tokens, self.decode_seconds)

    def _display_rows(self) -> list[tuple[str, str]]:
        return model_stats_rows(self)


class Totals:
    """Every finished generation's figures added up, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0, 0, 0, 0.0, 0.0, 0]  # generations, prompt, generated, s, s, decodes
        self._last: GenerationStats | None = None
        self._spec: SpecStats | None = None

    def add(self, stats: GenerationStats) -> None:
        with self._lock:
            t = self._counts
            t[0] += 1
            t[1] += stats.prompt_tokens
            t[2] += stats.generated_tokens
            t[3] += stats.prefill_seconds
            t[4] += stats.decode_seconds
            t[5] += stats.decode_tokens if stats.spec is None else stats.spec.decode_tokens
            self._last = stats
            if stats.spec is not None:
                self._spec = stats.spec if self._spec is None else self._spec + stats.spec

    def model_stats(self, *, memory: MemoryStats | None, experts: ExpertStats,
                    phases: PhaseTimes, wait_policy: str, prefetch: str, io: str,
                    gpu: GPUStats | None = None) -> ModelStats:
        """The totals so far with the engine's figures of now."""
        with self._lock:
            g, p, n, ps, ds, nd = self._counts
            last, spec = self._last, self._spec
        return ModelStats(int(g), int(p), int(n), float(ps), float(ds), int(nd), last,
                          memory=memory, experts=experts, phases=phases,
                          wait_policy=wait_policy, prefetch=prefetch, io=io, spec=spec,
                          gpu=gpu)
