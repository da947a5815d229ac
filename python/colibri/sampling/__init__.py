"""Sampling: choose the next token from NumPy logits, and decide when to stop.

Everything here is plain Python and NumPy, usable from a custom decoding loop::

    from colibri.sampling import Sampler, Sampling, StopChecker

    sampler = Sampler(Sampling(temperature=0.7, top_p=0.9, seed=1))
    token = sampler(session.forward(ids), history=ids)

The stages (see ``docs/sampling.md``) apply in llama.cpp's order: logit bias, penalties,
top-k, top-p, min-p, temperature, draw. Each is also a function of its own.
"""

from __future__ import annotations

from .filters import (
    Sampler,
    apply_logit_bias,
    apply_penalties,
    apply_temperature,
    draw,
    min_p_filter,
    probabilities,
    sample,
    softmax,
    top_k_filter,
    top_p_filter,
)
from .params import MAX_TOKEN_ID, LogitBias, Sampling
from .stop import FinishReason, StopChecker, StopStatus

__all__ = [
    "MAX_TOKEN_ID",
    "FinishReason",
    "LogitBias",
    "Sampler",
    "Sampling",
    "StopChecker",
    "StopStatus",
    "apply_logit_bias",
    "apply_penalties",
    "apply_temperature",
    "draw",
    "min_p_filter",
    "probabilities",
    "sample",
    "softmax",
    "top_k_filter",
    "top_p_filter",
]
