"""The RAM budget: how ``EngineConfig.ram_budget`` is split between the resident part of a
model and its expert cache.

One budget covers the whole engine::

    budget = dense weights + KV cache + work buffers + expert cache (+ what is left unused)

The dense weights (embeddings, attention, norms, router, shared experts, the output head),
one session's KV cache at the full context length (with, on a model with MTP layers, the
MTP layer's own cache that a session drafting with it keeps) and the work buffers stay
resident.
The expert cache gets the rest, as whole slots of one expert each (a slot holds one
routed expert's gate, up and down matrices), across all layers, and never more slots
than the model has experts.

Everything here is pure arithmetic on byte counts, except that :func:`plan_budget` probes
the available memory (:func:`colibri.hardware.available_memory`) when neither a budget nor
the available memory is given. The numbers are documented in docs/tuning.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..errors import ConfigError
from ..settings.config import format_bytes, parse_bytes

__all__ = [
    "KV_TYPE_BYTES",
    "MIN_SAFETY_MARGIN",
    "SAFETY_MARGIN_FRACTION",
    "BudgetPlan",
    "attention_work_floats",
    "default_budget",
    "estimate_work_bytes",
    "format_bytes",
    "kv_bytes",
    "kv_layers_bytes",
    "kv_ring_positions",
    "kv_row_bytes",
    "parse_bytes",
    "plan_budget",
    "safety_margin",
]

SAFETY_MARGIN_FRACTION = 0.10
"""Share of the available memory left out of the default budget (see :func:`safety_margin`)."""

MIN_SAFETY_MARGIN = 512 << 20
"""The smallest margin left out of the default budget: 512 MiB."""

_F32 = 4  # bytes per float32


def safety_margin(available: int) -> int:
    """Bytes the default budget leaves free: 10 % of `available` or 512 MiB, whichever is
    larger. It covers what the budget does not count — the Python interpreter and its
    modules, the tokenizer, the NumPy arrays a caller keeps, allocator slack and the page
    cache other processes need — and memory other processes take after the probe."""
    return max(int(available * SAFETY_MARGIN_FRACTION), MIN_SAFETY_MARGIN)


def default_budget(available: int) -> int:
    """The budget used when ``ram_budget`` is None: `available` minus :func:`safety_margin`
    (may be <= 0 on a machine with less than 512 MiB free)."""
    return available - safety_margin(available)


@dataclass(frozen=True)
class BudgetPlan:
    """How one RAM budget is split (bytes). ``cache_bytes == cache_slots * slot_bytes``."""

    budget: int  # the whole budget: ram_budget, or the default from the available memory
    dense_bytes: int  # resident non-expert weights
    kv_bytes: int  # one session's KV cache at the full context length
    work_bytes: int  # work buffers (activations, logits, scratch), estimated
    cache_bytes: int  # the expert cache: cache_slots x slot_bytes
    cache_slots: int  # experts the cache holds at once, <= the model's routed experts
    slot_bytes: int  # one slot: one routed expert's gate + up + down, as read
    available: int | None = None  # the memory probed for the default budget; None if given
    prompt_cache_bytes: int = 0  # EngineConfig.prompt_cache (Model.prompt_cache's KV)
    # One session's MTP-layer KV cache at the full context length (0 without MTP layers):
    # what a session drafting with MTP keeps beside kv_bytes (speculative decoding).
    mtp_kv_bytes: int = 0

    @property
    def session_kv_bytes(self) -> int:
        """One session's KV state at the full context: its KV cache and its MTP layer's."""
        return self.kv_bytes + self.mtp_kv_bytes

    @property
    def resident_bytes(self) -> int:
        """Dense weights + KV caches (MTP layer's included) + work buffers + prompt cache:
        what stays whatever is routed."""
        return (self.dense_bytes + self.session_kv_bytes + self.work_bytes
                + self.prompt_cache_bytes)

    @property
    def unused_bytes(self) -> int:
        """Budget left over: less than one slot, or more when every expert fits."""
        return self.budget - self.resident_bytes - self.cache_bytes

    def describe(self) -> str:
        """One line for people: ``"budget 12.0 GiB: dense 3.1 GiB, KV 512 MiB, work
        120 MiB, expert cache 8.2 GiB (672 slots of 12.5 MiB)"``."""
        return (
            f"budget {format_bytes(self.budget)}: dense {format_bytes(self.dense_bytes)}, "
            f"KV {format_bytes(self.kv_bytes)}{_mtp_part(self.mtp_kv_bytes)}, "
            f"work {format_bytes(self.work_bytes)}, "
            f"expert cache {format_bytes(self.cache_bytes)} ({self.cache_slots} slots of "
            f"{format_bytes(self.slot_bytes)})"
        )

    def to_dict(self) -> dict[str, int | None]:
        return asdict(self)


def _mtp_part(mtp_kv_bytes: int) -> str:
    return f" + MTP KV {format_bytes(mtp_kv_bytes)}" if mtp_kv_bytes else ""


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"plan_budget: {name} must be an int >= 0, got {value!r}")
    return value


def plan_budget(
    *,
    budget: int | None,
    dense_bytes: int,
    kv_bytes: int,
    work_bytes: int,
    slot_bytes: int,
    total_experts: int,
    min_slots: int,
    available: int | None = None,
    prompt_cache_bytes: int = 0,
    mtp_kv_bytes: int = 0,
) -> BudgetPlan:
    """Splits a RAM budget between the resident part and the expert cache.

    budget: ``EngineConfig.ram_budget`` in bytes, or None for the default:
        ``available - safety_margin(available)``.
    dense_bytes, kv_bytes, work_bytes: the resident part (see :func:`kv_bytes` and
        :func:`estimate_work_bytes`).
    slot_bytes: bytes one cached expert takes (the largest expert, as read).
    total_experts: routed experts in the model (MoE layers x experts per layer); 0 for a
        dense model, which then gets no cache.
    min_slots: the fewest slots the engine can run with (at least the experts one layer
        routes a token to, top-k); capped at total_experts.
    available: the memory this process may use; None probes it
        (:func:`colibri.hardware.available_memory`). Only used when `budget` is None.
    prompt_cache_bytes: the prompt cache's capacity (``EngineConfig.prompt_cache``):
        resident too, taken before the expert cache.
    mtp_kv_bytes: one session's MTP-layer KV cache at the full context (a model with MTP
        layers: a session drafting with them keeps it), resident like kv_bytes.

    The cache gets ``(budget - resident) // slot_bytes`` slots, at most total_experts.
    Raises ConfigError, stating the minimum budget and what takes the space, when the
    budget cannot hold the resident part plus `min_slots` experts.
    """
    dense_bytes = _count("dense_bytes", dense_bytes)
    kv_bytes = _count("kv_bytes", kv_bytes)
    work_bytes = _count("work_bytes", work_bytes)
    prompt_cache_bytes = _count("prompt_cache_bytes", prompt_cache_bytes)
    mtp_kv_bytes = _count("mtp_kv_bytes", mtp_kv_bytes)
    slot_bytes = _count("slot_bytes", slot_bytes)
    total_experts = _count("total_experts", total_experts)
    min_slots = min(_count("min_slots", min_slots), total_experts)
    if total_experts and not slot_bytes:
        raise ValueError("plan_budget: slot_bytes must be > 0 when the model has experts")

    probed: int | None = None
    if budget is None:
        if available is None:
            from ..hardware import available_memory

            available = available_memory()
        probed = _count("available", available)
        resolved = default_budget(probed)
    else:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise ConfigError(f"EngineConfig.ram_budget: expected bytes > 0, got {budget!r}")
        resolved = budget

    resident = dense_bytes + kv_bytes + mtp_kv_bytes + work_bytes + prompt_cache_bytes
    minimum = resident + min_slots * slot_bytes
    if resolved < minimum:
        raise ConfigError(_too_small(resolved, probed, dense_bytes, kv_bytes, work_bytes,
                                     min_slots, slot_bytes, minimum, prompt_cache_bytes,
                                     mtp_kv_bytes))
    slots = min((resolved - resident) // slot_bytes, total_experts) if total_experts else 0
    return BudgetPlan(
        budget=resolved,
        dense_bytes=dense_bytes,
        kv_bytes=kv_bytes,
        work_bytes=work_bytes,
        cache_bytes=slots * slot_bytes,
        cache_slots=slots,
        slot_bytes=slot_bytes,
        available=probed,
        prompt_cache_bytes=prompt_cache_bytes,
        mtp_kv_bytes=mtp_kv_bytes,
    )


def _too_small(budget: int, available: int | None, dense: int, kv: int, work: int,
               min_slots: int, slot_bytes: int, minimum: int, prompt_cache: int = 0,
               mtp_kv: int = 0) -> str:
    def down(n: int) -> str:
        return format_bytes(n, rounding="down")

    def up(n: int) -> str:
        return format_bytes(n, rounding="up")

    parts = f"dense weights {up(dense)} + KV cache {up(kv)}"
    if mtp_kv:
        parts += f" + MTP-layer KV cache {up(mtp_kv)}"
    parts += f" + work buffers {up(work)}"
    if prompt_cache:
        parts += f" + prompt cache {up(prompt_cache)}"
    if min_slots:
        what = f"the resident part and the smallest expert cache: {parts}"
        room = (f"the resident part plus room for {min_slots} "
                f"expert{'s' if min_slots != 1 else ''} of {up(slot_bytes)}; ")
    else:
        what = f"the resident part: {parts}"
        room = ""
    need = f"the minimum is {up(minimum)} ({room}{minimum} bytes)"
    if available is None:
        return (f"EngineConfig.ram_budget: {down(budget)} cannot hold {what}; {need}; "
                "raise EngineConfig.ram_budget or lower EngineConfig.context_length")
    return (f"EngineConfig.ram_budget: the default budget, {down(budget)} (available memory "
            f"{down(available)} less a safety margin of {up(available - budget)}), cannot "
            f"hold {what}; {need}; free memory, lower EngineConfig.context_length, or set "
            "EngineConfig.ram_budget explicitly (an explicit budget is used as given, margin "
            "or not)")


KV_TYPE_BYTES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34),
}
"""Per KV-cache type: (values per block, bytes per block), as GGUF lays them out."""


def kv_row_bytes(kv_type: str, n: int) -> int:
    """Bytes of ``n`` values at a KV-cache type (Q8_0: blocks of 32 values, 34 bytes)."""
    if kv_type not in KV_TYPE_BYTES:
        raise ValueError(f"kv_row_bytes: unknown KV type {kv_type!r}; use one of "
                         f"{', '.join(KV_TYPE_BYTES)}")
    block, size = KV_TYPE_BYTES[kv_type]
    if n % block:
        raise ValueError(f"kv_row_bytes: {n} values are not whole {kv_type} blocks of {block}")
    return n // block * size


def kv_bytes(n_layers: int, n_kv_heads: int, head_dim: int, context_length: int,
             kv_type: str = "f32") -> int:
    """Bytes of one session's KV cache at the full context: keys and values for every
    layer, KV head and position, stored at ``kv_type`` (``"f32"``, ``"f16"``, ``"bf16"``,
    ``"q8_0"``): ``2 * n_layers * row_bytes(n_kv_heads * head_dim) * context_length``,
    e.g. 4 bytes a value at f32, 2 at f16, 34/32 at q8_0. (The core grows a session's cache
    as it fills; the budget reserves the full context so a long conversation never runs
    out.) The core's count is ``_core.Session.kv_bytes``; a test checks they agree."""
    for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads),
                    ("head_dim", head_dim), ("context_length", context_length)):
        _count(name, v)
    return 2 * n_layers * kv_row_bytes(kv_type, n_kv_heads * head_dim) * context_length


def attention_work_floats(n_heads: int, dk: int, dv: int, threads: int) -> int:
    """Floats the attention kernels' working memory grows to at most (the core's
    ``_core.attention.workspace_floats``, mirrored so the budget can be checked before
    the model loads; a test compares): per compute thread, tiles of 64 keys of F32 keys and
    values, up to 64 query rows with their scores and softmax states; and for decode the
    partial states of up to 32 key chunks per query head (csrc/attention/attention.cpp)."""
    def up(n: int) -> int:
        return -(-n // 16) * 16

    block, rows, wave = 64, 64, 32
    per_thread = (up(block * dk) + up(block * dv) + up(rows * dk) + up(rows * block)
                  + 5 * up(rows) + 2 * up(rows * dv))
    return up((wave + 1) * n_heads * (dv + 2)) + threads * up(per_thread)


KV_RING_SLACK = 64
"""Positions a sliding-window layer's ring keeps beyond its window (csrc/model/kv_cache.hpp
kRingSlack): how far a session can roll back past its last forward."""


def kv_ring_positions(window: int, context_length: int) -> int:
    """Positions a sliding-window layer keeps in a session's KV cache (the core's
    ``kv_ring_positions``): ``window + 64`` rounded up to a multiple of 64 (the attention's
    key block), or 0 (every position: a full layer) without a window or when that ring would
    not be smaller than the context."""
    if window <= 0:
        return 0
    ring = -(-(window + KV_RING_SLACK) // 64) * 64
    return ring if ring < context_length else 0


def kv_layers_bytes(widths: Sequence[tuple[int, int]], context_length: int,
                    kv_type: str = "f32", windows: Sequence[int] = ()) -> int:
    """Bytes of one session's KV cache at the full context for per-layer rows of
    ``(key width, value width)`` values per position, each row stored at ``kv_type``
    (:func:`kv_row_bytes`). GQA: ``n_kv_heads * head_dim`` both (:func:`kv_bytes`); MLA: the
    latent and the shared rope key (``kv_lora_rank + qk_rope_head_dim``) as the key and no
    value, or the DSA indexer's key as the value on a full indexer layer. `windows`: per
    layer, its sliding window (0 or absent: a full layer); a sliding layer keeps a ring of
    :func:`kv_ring_positions` positions, not the whole context."""
    _count("context_length", context_length)
    total = 0
    for i, (k, v) in enumerate(widths):
        _count("key width", k)
        _count("value width", v)
        ring = kv_ring_positions(windows[i], context_length) if i < len(windows) else 0
        total += (kv_row_bytes(kv_type, k) + kv_row_bytes(kv_type, v)) * (ring or context_length)
    return total


def estimate_work_bytes(
    *,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int = 0,
    moe_intermediate_size: int = 0,
    shared_expert_intermediate_size: int = 0,
    n_heads: int = 0,
    n_kv_heads: int = 0,
    head_dim: int = 0,
    n_experts: int = 0,
    n_experts_per_tok: int = 0,
    context_length: int = 0,
    threads: int,
    batch: int = 512,
    extra_per_token: int = 0,
    attn_key_dim: int = 0,
    attn_value_dim: int = 0,
) -> int:
    """Bytes of the engine's work buffers for a forward of up to `batch` tokens (a prefill
    chunk; decode is a batch of 1). The names are :class:`colibri.sources.ModelConfig`'s.
    Counted, as float32 unless said otherwise (n = batch, d = hidden_size, F = the widest
    FFN of dense, routed and shared expert):

    - activations: the residual stream and its normed copy, the attention and FFN outputs,
      an expert's gathered inputs and outputs: 6 x n x d; queries and attention output:
      2 x n x n_heads x head_dim; new keys and values: 2 x n x n_kv_heads x head_dim
      (n_heads / head_dim of 0 mean d, n_kv_heads of 0 means n_heads);
    - the FFN's gate and up: 2 x n x F;
    - MoE: router logits n x n_experts, per-(token, slot) expert outputs
      n x n_experts_per_tok x d;
    - logits: 2 x vocab_size (the core's row for the last position and the NumPy copy
      handed to Python);
    - attention kernels: :func:`attention_work_floats` for n_heads heads of head_dim, or of
      `attn_key_dim` / `attn_value_dim` where those are set (MLA attends over the latent
      row: kv_lora_rank + qk_rope_head_dim keys, kv_lora_rank values), `threads` compute
      threads; it does not grow with the context (online softmax);
    - matmul scratch: activations quantized to 8-bit blocks, up to two formats at once,
      ~1.125 bytes per element: 2 x n x max(d, F, n_heads x head_dim) x 9/8 bytes;
    - `extra_per_token` floats per token of attention-specific buffers (MLA: the query,
      absorbed query rows, latent outputs and value heads, the q-LoRA and latent rows, the
      DSA indexer's query, key and weights; see colibri.engine.streaming).

    Small per-call vectors (RoPE tables, top-k indices) are left out; the safety margin of
    the default budget covers them. ``context_length`` is accepted for older callers and
    not used.
    """
    names = {
        "vocab_size": vocab_size, "hidden_size": hidden_size,
        "intermediate_size": intermediate_size, "moe_intermediate_size": moe_intermediate_size,
        "shared_expert_intermediate_size": shared_expert_intermediate_size,
        "n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim,
        "n_experts": n_experts, "n_experts_per_tok": n_experts_per_tok,
        "context_length": context_length, "threads": threads, "batch": batch,
        "extra_per_token": extra_per_token, "attn_key_dim": attn_key_dim,
        "attn_value_dim": attn_value_dim,
    }
    for name, v in names.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"estimate_work_bytes: {name} must be an int >= 0, got {v!r}")
    n, d = batch, hidden_size
    q_dim = n_heads * head_dim if n_heads and head_dim else d
    kv_heads = n_kv_heads or n_heads
    kv_dim = kv_heads * head_dim if kv_heads and head_dim else d
    ffn = max(intermediate_size, moe_intermediate_size, shared_expert_intermediate_size)
    floats = (
        6 * n * d
        + 2 * n * q_dim
        + 2 * n * kv_dim
        + 2 * n * ffn
        + n * n_experts
        + n * n_experts_per_tok * d
        + 2 * vocab_size
        + attention_work_floats(n_heads or 1, attn_key_dim or head_dim or d,
                                attn_value_dim or head_dim or d, threads)
        + n * extra_per_token
    )
    scratch = 2 * n * max(d, ffn, q_dim) * 9 // 8
    return floats * _F32 + scratch
