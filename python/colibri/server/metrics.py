"""The server's figures and their Prometheus text exposition (``GET /metrics``).

Counters and the time-to-first-token histogram are kept here by the scheduler and the
app; the engine's own figures (expert cache hits, bytes read, the RAM budget) are read
from ``Model.stats()`` when scraped, and the resident set size from /proc (or
``getrusage``'s peak where /proc is missing). Names follow Prometheus' conventions:
``_total`` counters, base units (seconds, bytes).
"""

from __future__ import annotations

import os
import resource
import sys
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .loop_monitor import LoopMonitor

if TYPE_CHECKING:
    from ..model import Model
    from .scheduler import Scheduler

# Time to first token: a long prompt on a streamed model takes seconds to minutes.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Histogram:
    """A cumulative Prometheus histogram."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts,
                                                                 strict=True)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count {self.count}")
        return out


class Metrics:
    """What the server counts (read by :func:`render`)."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()  # (route, status) -> count
        self.prompt_tokens_total = 0
        self.generated_tokens_total = 0
        self.decode_tokens_total = 0  # tokens after each generation's first
        self.decode_seconds_total = 0.0
        self.last_decode_tok_s = 0.0
        self.rejected_total = 0  # 429: the queue was full
        self.cancelled_total = 0  # the client went away mid-request
        self.timeouts_total = 0
        self.kv_waits_total = 0  # requests that waited for KV room with a slot free
        self.ttft = Histogram(TTFT_BUCKETS)
        self.loop = LoopMonitor()  # run by the app's lifespan

    def count_request(self, route: str, status: int) -> None:
        self.requests[(route, status)] += 1


def rss_bytes() -> int:
    """The process' resident set size now (its peak where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


def _metric(out: list[str], name: str, kind: str, help_: str, value: float | int) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")
    out.append(f"{name} {value:.6g}" if isinstance(value, float) else f"{name} {value}")


def render(metrics: Metrics, scheduler: Scheduler, model: Model) -> str:
    """The Prometheus text format (version 0.0.4) of every figure."""
    m = metrics
    out: list[str] = []
    _metric(out, "colibri_queue_depth", "gauge", "Requests waiting for a slot.",
            scheduler.waiting)
    _metric(out, "colibri_running_requests", "gauge",
            "Requests generating now (holding a slot).", scheduler.running)
    _metric(out, "colibri_max_running_requests", "gauge",
            "Slots: requests that may generate at once.", scheduler.max_running)
    _metric(out, "colibri_max_queue_depth", "gauge", "Queue places beyond the slots.",
            scheduler.max_queue)
    _metric(out, "colibri_kv_budget_bytes", "gauge",
            "KV bytes all running requests may reserve (--kv-budget).", scheduler.kv_budget)
    _metric(out, "colibri_kv_reserved_bytes", "gauge",
            "KV bytes reserved by the running requests (prompt + max_tokens positions).",
            scheduler.kv_reserved)
    _metric(out, "colibri_kv_waits_total", "counter",
            "Requests that waited in the queue for KV room while a slot was free.",
            m.kv_waits_total)
    b = scheduler.batcher
    _metric(out, "colibri_batch_steps_total", "counter",
            "Batched forwards run (continuous batching; 0 with one slot).",
            b.steps if b is not None else 0)
    _metric(out, "colibri_batch_rows_total", "counter",
            "Sequences advanced by the batched forwards (rows / steps: the mean batch).",
            b.rows if b is not None else 0)
    out.append("# HELP colibri_requests_total HTTP requests answered, by route and status.")
    out.append("# TYPE colibri_requests_total counter")
    for (route, status), n in sorted(m.requests.items()):
        out.append(f'colibri_requests_total{{route="{route}",status="{status}"}} {n}')
    _metric(out, "colibri_rejected_requests_total", "counter",
            "Requests refused with 429 because the queue was full.", m.rejected_total)
    _metric(out, "colibri_cancelled_requests_total", "counter",
            "Generations cancelled because the client disconnected.", m.cancelled_total)
    _metric(out, "colibri_timed_out_requests_total", "counter",
            "Requests that ran past their timeout.", m.timeouts_total)
    _metric(out, "colibri_prompt_tokens_total", "counter", "Prompt tokens of generations.",
            m.prompt_tokens_total)
    pc = model.prompt_cache.stats()
    _metric(out, "colibri_prefill_tokens_total", "counter",
            "Prompt tokens prefilled (the prompt tokens less those the prompt cache reused "
            "or copied from a running request).",
            m.prompt_tokens_total - pc.reused_tokens - pc.shared_tokens)
    _metric(out, "colibri_prompt_cache_hits_total", "counter",
            "Generations that reused a cached prompt prefix (--prompt-cache).", pc.hits)
    _metric(out, "colibri_prompt_cache_reused_tokens_total", "counter",
            "Prompt tokens not prefilled because the prompt cache held them.",
            pc.reused_tokens)
    _metric(out, "colibri_prompt_shares_total", "counter",
            "Generations that copied a prompt prefix from a request running at the same "
            "time (--prompt-cache).", pc.shares)
    _metric(out, "colibri_prompt_shared_tokens_total", "counter",
            "Prompt tokens not prefilled because a running request's session held them.",
            pc.shared_tokens)
    _metric(out, "colibri_prompt_cache_bytes", "gauge",
            "KV bytes the prompt cache holds.", pc.bytes)
    _metric(out, "colibri_generated_tokens_total", "counter", "Tokens generated.",
            m.generated_tokens_total)
    _metric(out, "colibri_decode_tokens_total", "counter",
            "Tokens generated after each generation's first (the decode phase).",
            m.decode_tokens_total)
    _metric(out, "colibri_decode_seconds_total", "counter",
            "Wall-clock seconds of the decode phases.", m.decode_seconds_total)
    _metric(out, "colibri_decode_tokens_per_second", "gauge",
            "Decode rate of the last generation to finish.", m.last_decode_tok_s)
    out.append("# HELP colibri_time_to_first_token_seconds From admission (queue wait "
               "included) to the first generated token.")
    out.append("# TYPE colibri_time_to_first_token_seconds histogram")
    out.extend(m.ttft.lines("colibri_time_to_first_token_seconds"))
    stats = model.stats()
    e = stats.experts
    _metric(out, "colibri_expert_hits_total", "counter", "Routed-expert lookups in cache.",
            e.hits)
    _metric(out, "colibri_expert_misses_total", "counter",
            "Routed-expert lookups read from disk.", e.misses)
    _metric(out, "colibri_expert_hit_rate", "gauge",
            "Expert cache hit rate since load (0 for a dense model).", float(e.hit_rate))
    _metric(out, "colibri_expert_bytes_read_total", "counter",
            "Bytes of routed experts read from disk.", e.bytes_read)
    if stats.memory is not None:
        _metric(out, "colibri_ram_budget_bytes", "gauge", "The engine's RAM budget.",
                stats.memory.budget)
    _metric(out, "colibri_event_loop_lag_max_seconds", "gauge",
            f"The latest the event loop woke a {m.loop.interval * 1000:g} ms timer since start "
            "(work run on the loop delays every request, /health included).",
            float(m.loop.max_lag))
    _metric(out, "colibri_event_loop_stalls_total", "counter",
            f"Event-loop wake-ups later than {m.loop.stall * 1000:g} ms.", m.loop.stalls)
    _metric(out, "colibri_gc_pause_max_seconds", "gauge",
            "The longest pause of Python's cyclic garbage collector since start (it stops "
            "every thread, the event loop's included).", float(m.loop.gc_max_pause))
    _metric(out, "colibri_gc_stalls_total", "counter",
            f"Garbage collections longer than {m.loop.stall * 1000:g} ms.", m.loop.gc_stalls)
    _metric(out, "colibri_process_resident_memory_bytes", "gauge",
            "Resident set size of the server process.", rss_bytes())
    return "\n".join(out) + "\n"
