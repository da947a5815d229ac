"""The server's KV budget, inside the engine's RAM budget.

The RAM budget (``EngineConfig.ram_budget``, colibri.engine.budget) counts ONE session's KV cache
at the full context (with its MTP layer's cache on a model that has one: any request may
draft with MTP); the server runs ``--parallel`` sessions. :func:`slot_kv_budget` says
how many KV bytes all running requests may reserve (the scheduler makes a request wait
when its reservation does not fit, colibri.server.scheduler):

- by default, what the budget holds without touching the expert cache: the one session
  it counts plus what it left unused, at most ``parallel`` full-context sessions;
- with an explicit ``kv_budget`` larger than that, the difference is taken from the
  expert cache (fewer slots; the model's figures say so), or ConfigError when that would
  leave fewer slots than one token's experts, or when there is no expert cache to take it
  from.
"""

from __future__ import annotations

import dataclasses

from ..engine.streaming import store_settings
from ..errors import ConfigError
from ..model import Model
from ..sizes import format_bytes

__all__ = ["slot_kv_budget"]


def slot_kv_budget(model: Model, parallel: int, kv_budget: int | None = None) -> int:
    """The KV bytes `parallel` slots may reserve on `model` (see the module docstring);
    shrinks the expert cache when an explicit `kv_budget` needs it."""
    plan = model.runner.handle.plan
    full = model.stats().memory
    one = full.session_kv_bytes if full is not None else 0
    if plan is None or one <= 0:  # no budget plan: the slots' own bound
        return kv_budget if kv_budget is not None else parallel * max(one, 1)
    room = plan.session_kv_bytes + max(0, plan.unused_bytes)
    if kv_budget is None:
        return max(plan.session_kv_bytes, min(parallel * plan.session_kv_bytes, room))
    if kv_budget <= room:
        return kv_budget
    need = kv_budget - room
    min_slots = model.config.n_experts_per_tok if plan.cache_slots else 0
    slots = (plan.cache_bytes - need) // plan.slot_bytes if plan.slot_bytes else -1
    if plan.cache_slots == 0 or slots < min_slots:
        raise ConfigError(
            f"--kv-budget {format_bytes(kv_budget)} does not fit the RAM budget "
            f"({plan.describe()}; {format_bytes(room)} is free for KV"
            + (f", and the expert cache must keep {min_slots} slots" if plan.cache_slots
               else "") +
            "): lower --kv-budget, --parallel or --context-length, or raise --ram-budget")
    core = model._require_core()
    cache = int(slots) * plan.slot_bytes
    core.configure_store(store_settings(model.engine_config, cache))
    # The plan now counts all the slots' KV, MTP layers' included (the budget's split
    # stays true).
    model.runner.handle.plan = dataclasses.replace(
        plan, kv_bytes=kv_budget, mtp_kv_bytes=0, cache_bytes=cache, cache_slots=int(slots))
    return kv_budget
