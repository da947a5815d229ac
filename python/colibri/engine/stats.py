"""Typed counters of the streaming tier: the RAM split, the expert cache and I/O, and the
time spent per phase of the forward pass.

The core keeps cumulative counters since load; a generation's record is the difference of
two snapshots (:meth:`ExpertStats.minus`, :meth:`PhaseTimes.minus`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

from ..display import Displayable, duration, percent, size

_T = TypeVar("_T")


def _minus(a: _T, b: _T) -> _T:
    """Field-wise a - b of two snapshots of the same counter dataclass."""
    return type(a)(**{f.name: getattr(a, f.name) - getattr(b, f.name) for f in fields(a)})  # type: ignore[arg-type]


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


@dataclass(frozen=True, repr=False)
class ExpertStats(Displayable):
    """Expert cache and expert I/O counters (cumulative, or one generation's delta)."""

    hits: int = 0  # routed experts found in the cache (ready, or loading by a prefetch)
    misses: int = 0  # routed experts that had to be read when they were needed
    ready_hits: int = 0  # of the hits, those already read (not waiting on a prefetch)
    reads: int = 0  # read requests finished: one per expert from a native container, one
    # per contiguous run of its matrices otherwise (a GGUF's three stacks: three requests)
    bytes_read: int = 0  # bytes of those reads
    read_seconds: float = 0.0  # time inside reads, summed over reads (and workers)
    stall_seconds: float = 0.0  # time the compute waited for an expert it needed
    prefetch_issued: int = 0  # reads started for experts predicted for the next layer
    prefetch_used: int = 0  # predicted experts the next layer did route to
    prefetch_wasted: int = 0  # predicted experts it did not route to (read, or cancelled)
    prefetch_cancelled: int = 0  # of the wasted, dropped before their read started
    prefetch_candidates: int = 0  # predicted experts not cached when predicted
    prefetch_candidates_used: int = 0  # of those, the ones the layer routed to
    prefetch_throttled: int = 0  # candidates not read: no idle I/O capacity in time
    prefetch_suppressed: int = 0  # candidates not read: the governor had prefetch off
    prefetch_switched_off: int = 0  # governor decisions (docs/streaming.md, prefetch policy)
    prefetch_switched_on: int = 0
    # The first-layer guess (IOConfig.first_layer_guess), a subset of the prefetch_* figures:
    first_candidates: int = 0  # guessed experts of the first MoE layer not cached then
    first_candidates_used: int = 0  # of those, the ones the layer routed to
    first_issued: int = 0  # reads started for the guess
    first_used: int = 0  # of those, experts the layer routed to
    first_wasted: int = 0  # guessed experts (read or queued) it did not route to
    predicted_routed: int = 0  # routed experts (after a prediction) that were predicted
    routed_after_prediction: int = 0  # routed experts in layers that had a prediction
    evictions: int = 0  # cached experts dropped to make room
    checksum_failures: int = 0  # reads whose bytes did not match the container's crc32
    read_errors: int = 0  # reads that failed (I/O error, short read, checksum)
    cap_waits: int = 0  # demand reads that waited for a place under IOConfig.max_in_flight
    busy_seconds: float = 0.0  # wall time with at least one expert read on the device
    # The wall time split by what ran (csrc/io/activity_clock.hpp): an expert read on the
    # device and the forward thread computing (outside its waits for experts), only the
    # read, only the compute, neither (sampling, Python between forwards, a gap).
    io_and_compute_seconds: float = 0.0
    io_only_seconds: float = 0.0
    compute_only_seconds: float = 0.0
    neither_seconds: float = 0.0

    @property
    def hit_rate(self) -> float:
        """Fraction of routed experts that were in the cache when needed."""
        return _ratio(self.hits, self.hits + self.misses)

    @property
    def ready_hit_rate(self) -> float:
        """Fraction of routed experts already in RAM when needed: the cache's own hit
        rate, comparable between prefetch on and off (hit_rate counts a prefetch still
        being read as a hit)."""
        return _ratio(self.ready_hits, self.hits + self.misses)

    @property
    def read_throughput(self) -> float:
        """Bytes per second of one read, on average (bytes_read / read_seconds)."""
        return _ratio(self.bytes_read, self.read_seconds)

    @property
    def busy_throughput(self) -> float:
        """Bytes per second while at least one read was on the device (bytes_read /
        busy_seconds): what the device delivered at the reads in flight it was given."""
        return _ratio(self.bytes_read, self.busy_seconds)

    @property
    def disk_busy_seconds(self) -> float:
        """Wall time with at least one expert read on the device (from the activity clock)."""
        return self.io_and_compute_seconds + self.io_only_seconds

    @property
    def compute_seconds(self) -> float:
        """Wall time the forward thread computed (a forward, less its waits for experts)."""
        return self.io_and_compute_seconds + self.compute_only_seconds

    @property
    def wall_seconds(self) -> float:
        """The time the four activity buckets cover: the wall time of the span measured."""
        return (self.io_and_compute_seconds + self.io_only_seconds
                + self.compute_only_seconds + self.neither_seconds)

    @property
    def prefetch_recall(self) -> float:
        """Fraction of the experts a layer routed to that the lookahead had predicted."""
        return _ratio(self.predicted_routed, self.routed_after_prediction)

    @property
    def prefetch_accuracy(self) -> float:
        """Fraction of the prefetch candidates (predicted, not cached) that the layer then
        routed to, issued or not: what the governor turns prefetch off and on by."""
        return _ratio(self.prefetch_candidates_used, self.prefetch_candidates)

    @property
    def first_guess_accuracy(self) -> float:
        """Fraction of the first-layer guess's candidates that the layer routed to."""
        return _ratio(self.first_candidates_used, self.first_candidates)

    def minus(self, earlier: ExpertStats) -> ExpertStats:
        return _minus(self, earlier)

    @property
    def lookups(self) -> int:
        """Routed experts looked up in the cache (hits + misses)."""
        return self.hits + self.misses

    def summary(self) -> str:
        """One line: hits, misses and the hit rate, bytes read."""
        if not self.lookups and not self.reads:
            return "no routed experts"
        return (f"{self.hits} hits, {self.misses} misses ({percent(self.hit_rate)}), "
                f"read {size(self.bytes_read)}")

    def _display_rows(self) -> list[tuple[str, str]]:
        if not self.lookups and not self.reads:
            return [("", "no routed experts looked up")]
        rows = [
            ("hits", f"{self.hits} of {self.lookups} ({percent(self.hit_rate)}; "
                     f"{self.ready_hits} already in RAM)"),
            ("read", f"{size(self.bytes_read)} in {self.reads} reads, "
                     f"{duration(self.read_seconds)}"
                     + (f" ({size(int(self.read_throughput))}/s)" if self.read_seconds else "")),
            ("stalled", duration(self.stall_seconds)),
        ]
        if self.prefetch_issued or self.routed_after_prediction:
            rows.append(("prefetch", f"{self.prefetch_issued} issued, {self.prefetch_used} used, "
                                     f"{self.prefetch_wasted} wasted (recall "
                                     f"{percent(self.prefetch_recall)}, accuracy "
                                     f"{percent(self.prefetch_accuracy)}); not read: "
                                     f"{self.prefetch_throttled} no idle I/O, "
                                     f"{self.prefetch_suppressed} governor off"))
        if self.first_issued or self.first_candidates:
            # The accuracy is over every uncached guess, read or not (the governor decides
            # by it even while it holds the reads back), so the row says both counts.
            rows.append(("first layer", f"{self.first_candidates} uncached experts guessed "
                                        f"({percent(self.first_guess_accuracy)} routed to); "
                                        f"{self.first_issued} read: {self.first_used} used, "
                                        f"{self.first_wasted} wasted"))
        rows.append(("evictions", str(self.evictions)))
        if self.wall_seconds > 0:
            w = self.wall_seconds
            rows.append(("time", f"disk busy {percent(self.disk_busy_seconds / w)}, compute "
                                 f"{percent(self.compute_seconds / w)}, neither "
                                 f"{percent(self.neither_seconds / w)} of {duration(w)}"))
        if self.read_errors or self.checksum_failures:
            rows.append(("errors", f"{self.read_errors} read errors, "
                                   f"{self.checksum_failures} checksum failures"))
        return rows

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(hit_rate=self.hit_rate, ready_hit_rate=self.ready_hit_rate,
                 read_throughput=self.read_throughput,
                 prefetch_recall=self.prefetch_recall,
                 prefetch_accuracy=self.prefetch_accuracy,
                 first_guess_accuracy=self.first_guess_accuracy,
                 disk_busy_seconds=self.disk_busy_seconds, compute_seconds=self.compute_seconds,
                 wall_seconds=self.wall_seconds)
        return d


@dataclass(frozen=True, repr=False)
class PhaseTimes(Displayable):
    """Wall-clock seconds per phase of the forward pass (cumulative, or a delta)."""

    attention: float = 0.0  # norms, Q/K/V/O projections, RoPE, attention
    dense: float = 0.0  # dense FFN layers, shared experts, embeddings
    router: float = 0.0  # router matmuls, top-k, and the lookahead prediction
    expert_matmul: float = 0.0  # routed experts' gate/up/down
    expert_wait: float = 0.0  # waiting for expert reads (stall)
    lm_head: float = 0.0  # final norm and output projection
    hyper_conn: float = 0.0  # hyper-connections' collapse and expansion (DeepSeek-V4)

    @property
    def total(self) -> float:
        return (self.attention + self.dense + self.router + self.expert_matmul
                + self.expert_wait + self.lm_head + self.hyper_conn)

    def minus(self, earlier: PhaseTimes) -> PhaseTimes:
        return _minus(self, earlier)

    def _display_rows(self) -> list[tuple[str, str]]:
        rows = [(f.name.replace("_", " "), duration(getattr(self, f.name)))
                for f in fields(self) if getattr(self, f.name) > 0]
        return [*rows, ("total", duration(self.total))]

    def to_dict(self) -> dict[str, float]:
        d = asdict(self)
        d["total"] = self.total
        return d


@dataclass(frozen=True, repr=False)
class MemoryStats(Displayable):
    """How the RAM budget is split (bytes)."""

    budget: int  # EngineConfig.ram_budget, resolved
    dense_bytes: int  # resident non-expert weights
    kv_bytes: int  # one session's KV cache at the full context length, at kv_cache_type
    work_bytes: int  # work buffers (activations, logits, scratch), estimated
    cache_bytes: int  # the expert cache: slots x slot_bytes
    cache_slots: int  # experts the cache can hold at once
    slot_bytes: int  # bytes of one slot (one expert's gate+up+down, 4 KiB-aligned reads)
    cached_experts: int  # slots holding an expert now
    pinned_experts: int  # slots pinned by the learned policy
    total_experts: int  # routed experts in the model (layers x experts)
    expert_bytes: int  # bytes of all routed experts on disk
    kv_cache_type: str = "f32"  # how sessions store keys and values: f32, f16, bf16, q8_0
    prompt_cache_bytes: int = 0  # the prompt cache's capacity (EngineConfig.prompt_cache)
    # One session's MTP-layer KV cache at the full context, at kv_cache_type (0 without MTP
    # layers): what a session drafting with MTP keeps beside kv_bytes, counted in the budget.
    mtp_kv_bytes: int = 0

    @property
    def session_kv_bytes(self) -> int:
        """One session's KV state at the full context: kv_bytes + mtp_kv_bytes."""
        return self.kv_bytes + self.mtp_kv_bytes

    def to_dict(self) -> dict[str, int | str]:
        return asdict(self)

    @property
    def planned_bytes(self) -> int:
        """What the parts take: at most the budget (a dense model leaves the rest unused)."""
        return (self.dense_bytes + self.session_kv_bytes + self.work_bytes
                + self.prompt_cache_bytes + self.cache_bytes)

    def summary(self) -> str:
        """One line: what the parts take, of how large a budget, and the parts."""
        prompts = (f" + prompt cache {size(self.prompt_cache_bytes)}"
                   if self.prompt_cache_bytes else "")
        mtp = f" + MTP KV {size(self.mtp_kv_bytes)}" if self.mtp_kv_bytes else ""
        return (f"{size(self.planned_bytes)} of a {size(self.budget)} budget: dense "
                f"{size(self.dense_bytes)} + KV {size(self.kv_bytes)}{mtp} + work "
                f"{size(self.work_bytes)}{prompts} + expert cache {size(self.cache_bytes)}")

    def _display_rows(self) -> list[tuple[str, str]]:
        rows = [("budget", self.summary())]
        if self.total_experts:
            rows += [
                ("expert cache", f"{self.cache_slots} slots of {size(self.slot_bytes)}; "
                                 f"{self.cached_experts} in use, {self.pinned_experts} pinned"),
                ("experts", f"{self.total_experts} routed, {size(self.expert_bytes)} on disk"),
            ]
        return rows
