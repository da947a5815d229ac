"""Routing regimes for the synthetic MoE writers (synthetic_moe.py, synthetic_deepseek.py).

Random weights route very locally: the residual stream of a random network is dominated
by a slowly varying part (attention averages its whole context, and nothing forgets), so a
Gaussian router, which reads the whole hidden state, keeps choosing the same experts from
token to token and a few experts per layer win most of the time. Real MoE routing is far
closer to uniform in popularity, with moderate temporal locality (issue 14).
A *regime* sets how much of the router's decision comes from that slow part and how much
from the current token alone:

* a **token channel**: the last ``channel`` hidden dimensions (whole Q4_0 blocks) are
  written by the token embedding only. Every matrix that writes into the residual stream
  (``attn_output``, ``ffn_down_exps``, ``ffn_down_shexp``, dense ``ffn_down``) gets its rows
  for those dimensions set to zero (Q4_0 scale 0), so at every layer those dimensions of
  the hidden state are exactly the current token's embedding. RMSNorm divides the whole
  vector by one positive number per token, which never changes a top-k, so router columns
  that read only the channel make a choice that depends on the token and nothing else: a
  fresh random choice per distinct token, the same experts for every expert popularity
  (isotropic Gaussian rows), no memory of the context;
* the router's other columns read everything else, as before: that part carries the slow,
  local component.

``full`` scales the router columns outside the channel (1 = today's weights, 0 = none);
``token`` is the standard deviation of the channel's contribution to a router logit
relative to the full part's (a logit from the full part has a standard deviation of about
1 here; the channel's is ``token`` / rms of the hidden state, so the token's weight fades a
little with depth as the residual stream grows, as in the real models where deep layers
are the more local ones). The draws are the same as without a regime: the regime only
rescales router columns and zeroes residual rows, so *local* (no channel) writes exactly
the bytes generator v2 always wrote.

* ``local``: today's routing, no channel (moe-8g: 41-46 distinct experts of 128 per layer
  per 32 tokens, a global LRU of 478 slots hits 0.65-0.73);
* ``realistic``: channel of 64 dimensions, ``token`` calibrated so that per-layer LRUs of
  25 % / 50 % of a layer's experts hit about 60-70 % / 80 %, previous-token reuse about
  40 %, popularity near uniform (docs/benchmarks.md, "Routing regimes", has the measured
  statistics);
* ``uniform``: the channel alone (``full`` = 0): each token's experts are a random
  function of the token id; nothing is shared between different tokens, so the only
  locality left is the text repeating its tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from synthetic_moe import TensorSpec

QK = 32  # Q4_0 block width
BLOCK_BYTES = 18
# Tensors whose output rows are hidden dimensions of the residual stream.
RESIDUAL_WRITERS = ("attn_output.weight", "ffn_down_exps.weight", "ffn_down_shexp.weight",
                    "ffn_down.weight")  # fmt: skip
# F32 biases added to the residual stream (gpt-oss): their last dimension is the hidden one.
RESIDUAL_BIASES = ("attn_output.bias", "ffn_down_exps.bias")
ROUTER = "ffn_gate_inp.weight"
# The residual stream's variance grows by about two sublayer outputs per layer, so the
# channel's share of a router's input falls as 1/sqrt(1 + 2 * layer): the token weight of
# layer l is multiplied by sqrt(1 + DEPTH_GROWTH * l) to keep the mix the same at depth.
DEPTH_GROWTH = 2.0


def _layer_of(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else 0


@dataclass(frozen=True)
class Routing:
    name: str
    full: float  # scale of the router columns outside the token channel
    token: float  # logit standard deviation from the channel, relative to the full part
    channel: int  # hidden dimensions reserved for the token (0: no channel)

    def channel_for(self, hidden: int) -> int:
        """The channel's width for a model of this hidden size: at most 1/8 of it."""
        if not self.channel:
            return 0
        return max(QK, min(self.channel, hidden // 8 // QK * QK))


REGIMES: dict[str, Routing] = {
    r.name: r
    for r in (
        Routing("local", full=1.0, token=0.0, channel=0),
        Routing("realistic", full=1.0, token=0.5, channel=64),
        Routing("uniform", full=0.0, token=1.0, channel=64),
    )
}


def regime(name: str) -> Routing:
    try:
        return REGIMES[name]
    except KeyError:
        raise ValueError(f"unknown routing regime {name!r}; choose from "
                         f"{', '.join(REGIMES)}") from None  # fmt: skip


def shape_specs(specs: list[TensorSpec], routing: str, hidden: int) -> list[TensorSpec]:
    """``specs`` with the regime's changes: residual writers zero their channel rows, the
    routers rescale their columns. ``local`` returns them unchanged."""
    r = regime(routing)
    width = r.channel_for(hidden)
    if not width:
        return specs
    scale_in = r.token * float(np.sqrt(hidden / width))
    out = []
    for t in specs:
        if t.name.endswith(RESIDUAL_WRITERS) and t.shape[-2] == hidden:
            t = dataclasses.replace(t, zero_rows=width)
        elif t.name.endswith(RESIDUAL_BIASES) and t.shape[-1] == hidden:
            t = dataclasses.replace(t, zero_rows=width)
        elif t.name.endswith(ROUTER):
            grow = float(np.sqrt(1.0 + DEPTH_GROWTH * _layer_of(t.name)))
            t = dataclasses.replace(t, col_scale=(width, r.full, scale_in * grow))
        out.append(t)
    return out


def reshape_chunks(spec: TensorSpec, chunks: Iterator[npt.NDArray[Any]]
                   ) -> Iterator[npt.NDArray[Any]]:  # fmt: skip
    """Apply a spec's ``zero_rows`` / ``col_scale`` to the chunks the generator draws (same
    draws, so every other byte is what the regime-free file holds)."""
    block_t = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
    if spec.zero_rows and spec.kind in ("router", "norm"):  # a bias: its last entries
        cols = spec.shape[-1]
        start = 0
        for vals in chunks:
            col = np.arange(start, start + vals.size) % cols
            start += vals.size
            yield np.where(col >= cols - spec.zero_rows, np.float32(0), vals).astype("<f4")
    elif spec.zero_rows and spec.kind == "mxfp4":  # every code 0 (+0.0) in those rows
        rows, bpr = spec.shape[-2], spec.shape[-1] // QK
        mx_t = np.dtype([("e", "u1"), ("qs", "u1", (16,))])
        start = 0
        for raw in chunks:
            blocks = raw.view(mx_t)
            row = (np.arange(start, start + blocks.size) // bpr) % rows
            blocks["qs"][row >= rows - spec.zero_rows] = 0
            start += blocks.size
            yield raw
    elif spec.zero_rows:
        rows, bpr = spec.shape[-2], spec.shape[-1] // QK
        start = 0
        for raw in chunks:
            blocks = raw.view(block_t)
            row = (np.arange(start, start + blocks.size) // bpr) % rows
            blocks["d"][row >= rows - spec.zero_rows] = 0
            start += blocks.size
            yield raw
    elif spec.col_scale is not None:
        width, full, inside = spec.col_scale
        cols = spec.shape[-1]
        start = 0
        for vals in chunks:
            col = np.arange(start, start + vals.size) % cols
            scale = np.where(col >= cols - width, inside, full).astype(np.float32)
            out = (vals * scale).astype("<f4")
            start += vals.size
            yield out
    else:
        yield from chunks
