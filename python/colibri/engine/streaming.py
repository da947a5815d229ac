"""The streaming tier's Python side: how a manifest and an EngineConfig become the core's
expert store settings, the RAM budget split, the routing history behind learned pins, and
the typed stats.

The core (csrc/model/expert_store.*) does the work: routed experts are never loaded at
``Model.load``; they are read on demand into a cache of ``cache_slots`` slots.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .. import _core
from ..errors import ModelIOError, UnsupportedError
from ..settings.config import EngineConfig, default_history_dir
from ..settings.table import copy_to_core
from ..sources import Manifest, ModelConfig
from ..sources.linear_attn import linear_state_bytes, linear_work_floats
from ..sources.v4_units import v4_compressed_state_bytes
from ..sources.validate import is_full_indexer_layer
from .budget import BudgetPlan, estimate_work_bytes, kv_layers_bytes, plan_budget
from .stats import ExpertStats, MemoryStats, PhaseTimes

_EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.(\d+)$")
_DIRECT_ALIGN = 4096  # csrc/io/direct_reader.hpp: kDirectAlign
_MERGE_GAP = 64 * 1024  # csrc/model/expert_store.cpp: kMergeGap

HISTORY_FORMAT = "colibri-routing-history"
HISTORY_VERSION = 1


def is_expert_tensor(name: str) -> bool:
    return _EXPERT_RE.match(name) is not None


def expert_blobs(manifest: Manifest) -> list[_core.ExpertBlob]:
    return [
        _core.ExpertBlob(layer, expert, _core.Extent(b.extent.file, b.extent.offset,
                                                     b.extent.length), b.crc32)
        for (layer, expert), b in manifest.expert_blobs.items()
    ]


def _slab_bytes(offset: int, length: int) -> int:
    return -(-(offset % _DIRECT_ALIGN + length) // _DIRECT_ALIGN) * _DIRECT_ALIGN


def expert_slot_bytes(manifest: Manifest) -> int:
    """Bytes of one expert cache slot, computed from the manifest the way the core lays
    slots out (csrc/model/expert_store.cpp, ExpertStore's constructor; a test checks they
    agree): the largest expert, each of its reads rounded out to 4 KiB boundaries. Lets
    the budget check state the minimum before any weight is read."""
    parts: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for t in manifest.tensors.values():
        m = _EXPERT_RE.match(t.name)
        if m and t.extents:
            key = (int(m.group(1)), int(m.group(3)))
            scale = getattr(t, "scale", None)  # an FP8 weight's block scales: read with it
            for e in (t.extents[0], *(scale.extents[:1] if scale is not None else ())):
                parts.setdefault(key, []).append((e.file, e.offset, e.length))
    best = 0
    for key, extents in parts.items():
        blob = manifest.expert_blobs.get(key)
        if blob is not None:
            best = max(best, _slab_bytes(blob.extent.offset, blob.extent.length))
            continue
        reads: list[list[int]] = []  # [file, offset, length], merged like the core does
        for f, off, n in sorted(extents):
            if reads and reads[-1][0] == f:
                end = reads[-1][1] + reads[-1][2]
                if 0 <= off - end <= _MERGE_GAP:
                    reads[-1][2] = max(end, off + n) - reads[-1][1]
                    continue
            reads.append([f, off, n])
        best = max(best, sum(_slab_bytes(off, n) for _, off, n in reads))
    return best


def resident_bytes(manifest: Manifest) -> int:
    """Bytes of the tensors that stay resident (everything but routed experts)."""
    return sum(t.nbytes for t in manifest.tensors.values() if not is_expert_tensor(t.name))


def _layer_kv_width(c: ModelConfig, layer: int) -> tuple[int, int]:
    """The (key, value) values one position keeps in layer `layer`'s KV cache."""
    if c.is_linear(layer):  # a fixed-size recurrent state instead (linear_state_bytes)
        return 0, 0
    if c.attention == "v4_sliding":  # DeepSeek-V4: one key-value row (K = V)
        return c.head_dim, 0
    if not c.is_mla:
        return c.kv_heads(layer) * c.head_dim, c.kv_heads(layer) * c.gqa_value_dim
    latent = c.kv_lora_rank + c.qk_rope_head_dim
    return latent, c.index_head_dim if is_full_indexer_layer(c, layer) else 0


def kv_layer_widths(c: ModelConfig) -> list[tuple[int, int]]:
    """Per layer, the (key, value) values one position keeps in a session's KV cache (the
    core's Engine.kv_layouts; MTP layers keep none here: they do not run in plain decoding,
    and a session drafting with them keeps their one-layer cache apart, model/mtp.hpp, see
    :func:`mtp_kv_layer_widths`). GQA: keys and values of every KV head; MLA: the latent and
    the shared rope key as the key (kv_lora_rank + qk_rope_head_dim: 576 for DeepSeek-V3),
    and the DSA indexer's key as the value on full indexer layers (none on the others)."""
    return [_layer_kv_width(c, i) for i in range(c.n_layers)]


def kv_layer_windows(c: ModelConfig) -> list[int]:
    """Per layer, its sliding window (0: a full layer): a sliding layer keeps only a ring of
    its last positions in a session's KV cache (:func:`budget.kv_ring_positions`)."""
    marks = list(c.sliding_layers)
    return [c.sliding_window if i < len(marks) and marks[i] else 0 for i in range(c.n_layers)]


def mtp_kv_layer_widths(c: ModelConfig) -> list[tuple[int, int]]:
    """The (key, value) widths of the MTP layer's own KV cache, which a session drafting
    with MTP keeps beside its trunk cache (model/mtp.hpp; the core's
    Engine.mtp_kv_bytes_per_token): the first MTP layer's row, the one layer a draft runs
    (chained for depth > 1); empty for a model without MTP layers. MTP layers always run
    their own DSA indexer, so on a DSA model the row has the indexer key too."""
    return [_layer_kv_width(c, c.n_layers)] if c.n_mtp_layers else []


def kv_floats_per_token(c: ModelConfig) -> int:
    """Values one position takes in a session's KV cache, over all layers."""
    return sum(k + v for k, v in kv_layer_widths(c))


def _mla_work_floats(c: ModelConfig) -> int:
    """Per-token floats of the MLA work buffers (csrc/model/attn_mla.hpp)."""
    if not c.is_mla:
        return 0
    nh, r, rope = c.n_heads, c.kv_lora_rank, c.qk_rope_head_dim
    per_head = (c.qk_nope_head_dim + rope) + (r + rope) + r + c.v_head_dim
    indexer = c.index_n_heads * c.index_head_dim + c.index_head_dim + c.index_n_heads
    return nh * per_head + c.q_lora_rank + r + rope + indexer


def _v4_work_floats(c: ModelConfig, context_length: int) -> int:
    """Per-token floats of DeepSeek-V4's extra buffers: the q-LoRA row and the grouped
    projection's middle (csrc/model/attn_v4.cpp), the residual's other hc_mult - 1
    streams (csrc/model/engine_hc.cpp); on compressed layers a compressor's projections,
    the indexer's queries and head weights and each query's list of entries
    (csrc/model/attn_v4_compressed.cpp)."""
    if c.attention != "v4_sliding":
        return 0
    base = c.q_lora_rank + c.o_groups * c.o_lora_rank + max(c.hc_mult - 1, 0) * c.hidden_size
    compressed = 0
    for i, rate in enumerate(c.compress_ratios):
        if not rate:
            continue
        entries = -(-context_length // rate)
        if i < len(c.csa_layers) and c.csa_layers[i]:
            width = 2 * max(c.head_dim, c.index_head_dim)
            extra = c.index_n_heads * (c.index_head_dim + 1) + min(entries, c.index_topk)
        else:
            width, extra = c.head_dim, entries
        compressed = max(compressed, 2 * width + extra)
    return base + compressed


_FLOAT_TYPES = ("F32", "F16", "BF16")


def float_weights(manifest: Manifest) -> bool:
    """Whether every matrix of the model is a float type (F32, F16, BF16): the exact path,
    on which ``kv_cache_type="auto"`` keeps an F32 KV cache."""
    return all(t.dtype in _FLOAT_TYPES for t in manifest.tensors.values() if len(t.shape) >= 2)


def with_resolved_precision(manifest: Manifest, engine: EngineConfig) -> EngineConfig:
    """`engine` with ``activation_precision="auto"`` resolved for this model's size."""
    weight_bytes = sum(t.nbytes for t in manifest.tensors.values())
    return engine.replace(activation_precision=engine.resolve_activation_precision(weight_bytes))


def session_kv_type(manifest: Manifest, engine: EngineConfig) -> str:
    """The KV-cache type sessions get under `engine` (``"auto"`` resolved for this model).
    Raises UnsupportedError for q8_0 when a cached row (a head; MLA's latent row) is not
    whole blocks of 32 values."""
    engine = with_resolved_precision(manifest, engine)
    kv_type = engine.resolve_kv_cache_type(float_weights(manifest))
    c = manifest.config
    if kv_type == "q8_0":
        if c.is_mla:
            rows = {k for k, _ in kv_layer_widths(c)} | {v for _, v in kv_layer_widths(c) if v}
            what = "cached rows (the latent and rope key; the DSA indexer key)"
        else:
            rows = {c.head_dim, c.gqa_value_dim}
            what = "heads"
        odd = sorted(w for w in rows if w % 32)
        if odd:
            raise UnsupportedError(
                f"EngineConfig.kv_cache_type='q8_0' stores each row in blocks of 32 values, "
                f"but this model's {what} have {', '.join(map(str, odd))}; use 'f16' or 'bf16'"
            )
    return kv_type


def _kv_and_work(manifest: Manifest, engine: EngineConfig,
                 context_length: int) -> tuple[int, int, int]:
    """(one session's KV cache, its MTP layer's KV cache, the work buffers), bytes."""
    c = manifest.config
    kv_type = session_kv_type(manifest, engine)
    # Linear-attention layers' recurrent state: per session, whatever the context.
    # V4's compressed layers: their compressors' state and entries, F32, per context.
    kv = (kv_layers_bytes(kv_layer_widths(c), context_length, kv_type, kv_layer_windows(c))
          + linear_state_bytes(c) + v4_compressed_state_bytes(c, context_length))
    mtp_kv = kv_layers_bytes(mtp_kv_layer_widths(c), context_length, kv_type)
    work = estimate_work_bytes(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, moe_intermediate_size=c.moe_intermediate_size,
        shared_expert_intermediate_size=c.shared_expert_intermediate_size,
        n_heads=c.n_heads, n_kv_heads=max(c.n_kv_heads, c.sliding_n_kv_heads),
        head_dim=c.head_dim,
        n_experts=c.n_experts, n_experts_per_tok=c.n_experts_per_tok,
        context_length=context_length, threads=engine.threads.team_size(),
        # a forward's batch is one prefill chunk (the whole prompt when chunking is off)
        batch=engine.prefill_chunk if engine.prefill_chunk is not None else context_length,
        extra_per_token=_mla_work_floats(c) + _v4_work_floats(c, context_length)
        + linear_work_floats(c),
        # MLA attends over the latent row (MQA: the latent and rope key, values the latent)
        attn_key_dim=c.kv_lora_rank + c.qk_rope_head_dim if c.is_mla else 0,
        attn_value_dim=c.kv_lora_rank if c.is_mla else 0,
    )  # fmt: skip
    return kv, mtp_kv, work


def plan_from_manifest(manifest: Manifest, engine: EngineConfig,
                       context_length: int) -> BudgetPlan:
    """The budget split from the manifest alone, before any weight is read (resident bytes
    and slot size as the manifest gives them; ``plan_store`` redoes it with the core's
    figures once loaded). Raises ConfigError (stating the minimum) when the budget cannot
    hold the resident part of the model and one layer's top-k experts."""
    kv, mtp_kv, work = _kv_and_work(manifest, engine, context_length)
    c = manifest.config
    total = sum(1 for t in manifest.tensors.values()
                if (m := _EXPERT_RE.match(t.name)) and m.group(2) == "gate")  # fmt: skip
    return plan_budget(
        budget=engine.ram_budget, dense_bytes=resident_bytes(manifest), kv_bytes=kv,
        work_bytes=work, slot_bytes=expert_slot_bytes(manifest), total_experts=total,
        min_slots=c.n_experts_per_tok if total else 0, prompt_cache_bytes=engine.prompt_cache,
        mtp_kv_bytes=mtp_kv,
    )  # fmt: skip


def check_resident_fits(manifest: Manifest, engine: EngineConfig, context_length: int) -> None:
    """Raises ConfigError (stating the minimum) before any weight is read when the budget
    cannot hold the resident part of the model and one layer's top-k experts."""
    plan_from_manifest(manifest, engine, context_length)


def plan_store(manifest: Manifest, engine: EngineConfig, core: _core.Engine,
               context_length: int) -> BudgetPlan:
    """Splits the budget with the core's real figures (resident bytes, slot size)."""
    kv, mtp_kv, work = _kv_and_work(manifest, engine, context_length)
    streamed = int(core.streamed_experts)
    return plan_budget(
        budget=engine.ram_budget, dense_bytes=int(core.weight_bytes), kv_bytes=kv,
        work_bytes=work, slot_bytes=int(core.expert_slot_bytes), total_experts=streamed,
        # One layer's top-k at once: fewer still runs (in waves) but stalls on every expert.
        min_slots=manifest.config.n_experts_per_tok if streamed else 0,
        prompt_cache_bytes=engine.prompt_cache, mtp_kv_bytes=mtp_kv,
    )  # fmt: skip


def store_settings(engine: EngineConfig, cache_bytes: int) -> _core.StoreSettings:
    """The core's copy of `engine`'s IOConfig and CacheConfig (their declared fields), with
    the expert cache's size from the budget."""
    s = _core.StoreSettings()
    s.cache_bytes = cache_bytes
    copy_to_core(engine.io, s)
    copy_to_core(engine.cache, s)
    return s


# --- routing history ----------------------------------------------------------------------


class RoutingHistory:
    """How often each (layer, expert) was routed, kept across runs in one JSON file per
    model. Only counts are stored. Written atomically (temporary file, fsync, rename), so
    a crash leaves the old file or the new one, never half of one."""

    def __init__(self, path: Path, n_layers: int, n_experts: int) -> None:
        self.path = path
        self.n_layers = n_layers
        self.n_experts = n_experts

    @classmethod
    def for_model(cls, manifest: Manifest, engine: EngineConfig) -> RoutingHistory | None:
        c = manifest.config
        if not engine.cache.history or c.n_experts == 0:
            return None
        if engine.cache.history_path is not None:
            path = Path(engine.cache.history_path).expanduser()
        else:
            ident = f"{manifest.path.resolve()}|{c.n_layers}|{c.n_experts}|{c.hidden_size}"
            digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
            path = default_history_dir() / f"{manifest.path.name}-{digest}.json"
        return cls(path, c.n_layers + c.n_mtp_layers, c.n_experts)  # the store's layers

    def load(self) -> npt.NDArray[np.uint64]:
        """Saved counts, [n_layers * n_experts]; zeros when there is no usable file (a
        history is a hint: a missing or stale one never stops a model from loading)."""
        zeros = np.zeros(self.n_layers * self.n_experts, dtype=np.uint64)
        try:
            doc: Any = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return zeros
        if (not isinstance(doc, dict) or doc.get("format") != HISTORY_FORMAT
                or doc.get("n_layers") != self.n_layers
                or doc.get("n_experts") != self.n_experts):
            return zeros
        counts = np.asarray(doc.get("counts", []), dtype=np.float64).reshape(-1)
        if counts.size != zeros.size or not np.all(np.isfinite(counts)) or np.any(counts < 0):
            return zeros
        return counts.astype(np.uint64)

    def save(self, counts: npt.NDArray[np.uint64]) -> None:
        doc = {
            "format": HISTORY_FORMAT, "version": HISTORY_VERSION,
            "n_layers": self.n_layers, "n_experts": self.n_experts,
            "counts": [int(x) for x in counts],
        }  # fmt: skip
        data = json.dumps(doc).encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".history-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            raise ModelIOError(f"cannot save the routing history to {self.path}: {exc}") from exc


def pin_order(counts: npt.NDArray[np.uint64]) -> list[int]:
    """Keys (layer * n_experts + expert) routed at least once, most routed first (ties to
    the lower key, so the order is deterministic)."""
    keys = np.nonzero(counts)[0]
    order = np.lexsort((keys, -counts[keys].astype(np.float64)))
    return [int(k) for k in keys[order]]


# --- stats ----------------------------------------------------------------------------------


def expert_stats(core: _core.Engine) -> ExpertStats:
    """The engine's cumulative counters since load (or reset_stats)."""
    return expert_stats_of(core.store_stats())


def expert_stats_of(s: _core.ExpertStoreStats) -> ExpertStats:
    return ExpertStats(
        hits=s.hits, misses=s.misses, ready_hits=s.ready_hits, reads=s.reads,
        bytes_read=s.bytes_read,
        read_seconds=s.read_seconds, stall_seconds=s.stall_seconds,
        prefetch_issued=s.prefetch_issued, prefetch_used=s.prefetch_used,
        prefetch_wasted=s.prefetch_wasted, prefetch_cancelled=s.prefetch_cancelled,
        prefetch_candidates=s.prefetch_candidates,
        prefetch_candidates_used=s.prefetch_candidates_used,
        prefetch_throttled=s.prefetch_throttled, prefetch_suppressed=s.prefetch_suppressed,
        prefetch_switched_off=s.prefetch_switched_off, prefetch_switched_on=s.prefetch_switched_on,
        first_candidates=s.first_candidates, first_candidates_used=s.first_candidates_used,
        first_issued=s.first_issued, first_used=s.first_used, first_wasted=s.first_wasted,
        predicted_routed=s.predicted_routed, routed_after_prediction=s.routed_after_prediction,
        evictions=s.evictions, checksum_failures=s.checksum_failures, read_errors=s.read_errors,
        cap_waits=s.cap_waits, busy_seconds=s.busy_seconds,
        io_and_compute_seconds=s.io_and_compute_seconds, io_only_seconds=s.io_only_seconds,
        compute_only_seconds=s.compute_only_seconds, neither_seconds=s.neither_seconds,
    )  # fmt: skip


def phase_times(core: _core.Engine) -> PhaseTimes:
    return PhaseTimes(*(float(x) for x in core.phase_seconds()))


def session_stats(core: _core.Session) -> tuple[ExpertStats, PhaseTimes]:
    """A session's own counters: the sum of what each of its forwards did, measured inside
    the engine lock (csrc/model/forward_stats.hpp), so another thread's generation on the
    same model never mixes in."""
    experts, phases, _ = core.forward_stats()
    return expert_stats_of(experts), PhaseTimes(*(float(x) for x in phases))


def memory_stats(plan: BudgetPlan, core: _core.Engine, kv_type: str) -> MemoryStats:
    return MemoryStats(
        budget=plan.budget, dense_bytes=plan.dense_bytes, kv_bytes=plan.kv_bytes,
        work_bytes=plan.work_bytes, cache_bytes=int(core.cache_slots) * plan.slot_bytes,
        cache_slots=int(core.cache_slots), slot_bytes=plan.slot_bytes,
        cached_experts=int(core.cached_experts), pinned_experts=int(core.pinned_experts),
        total_experts=int(core.streamed_experts), expert_bytes=int(core.expert_bytes),
        kv_cache_type=kv_type,
        prompt_cache_bytes=plan.prompt_cache_bytes, mtp_kv_bytes=plan.mtp_kv_bytes,
    )  # fmt: skip


def io_name(core: _core.Engine) -> str:
    """Workers, the cap on reads on the device, and the curve they were chosen from under
    "auto", e.g. "2 workers, 1 read in flight (auto; GB/s by reads in flight: 1: 2.61,
    2: 2.40, 4: 2.21, 8: 2.30)"."""
    n = int(core.io_workers)
    cap = int(core.io_max_in_flight)
    name = f"{n} workers"
    if cap > 0:
        name += f", {cap} read{'s' if cap != 1 else ''} in flight"
    curve = core.io_depth_curve
    if not curve:
        return name
    points = ", ".join(f"{d}: {g:.2f}" for d, g in curve)
    return f"{name} (auto; GB/s by reads in flight: {points})"


def prefetch_state_name(core: _core.Engine, enabled: bool) -> str:
    """The lookahead now: "off" (IOConfig.prefetch=False), else the governor's state and
    its recent accuracy, e.g. "on (accuracy 74%)" or "paused (accuracy 41%)"."""
    if not enabled or int(core.streamed_experts) == 0:
        return "off"
    state = "on" if core.prefetch_active else "paused"
    return f"{state} (accuracy {100 * float(core.prefetch_accuracy):.0f}%)"


def wait_policy_name(core: _core.Engine) -> str:
    """The policy in effect; "auto (passive)" style when auto chose it."""
    name = str(core.thread_settings.policy.name).lower()
    return f"auto ({name})" if core.auto_wait_policy else name
