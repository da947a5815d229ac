"""``--quant q4_k_m`` / ``q5_k_m``: llama.cpp's Q4_K_M and Q5_K_M tensor-type mixes, and the
fallback of a 256-element super-block type for rows that are not whole super-blocks.

The rules are those of llama.cpp's quantizer (``src/llama-quant.cpp``,
``llama_tensor_get_type`` without an importance matrix, for the families colibri runs):

* every 2-D weight takes the mix's base type (Q4_K, or Q5_K for q5_k_m);
* ``output``, and ``token_embd`` when the embeddings are tied (it is the output then),
  take Q6_K;
* ``attn_v`` and every ``ffn_down`` (dense, routed experts, shared expert) take Q6_K in the
  layers where more bits pay most: the first and last eighth of the layers and every third
  layer in between (``use_more_bits``);
* with exactly 8 routed experts (Mixtral-like), ``attn_v`` and ``attn_k`` take Q8_0 and
  ``attn_output`` Q5_K (q4_k_m);
* a row length that is not a multiple of 256 falls back to a 32-element type of about the
  same precision: Q2_K and Q3_K to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0; a row
  that is not a multiple of 32 either is written F16.

So ``colibri convert --quant q4_k_m`` of a GGUF picks, tensor by tensor, the types
``llama-quantize ... Q4_K_M`` picks, and (quantizing through float32 with the same reference
quantizers) writes the same bytes for them; tests/convert/test_kquant_convert.py checks both against
a file written by llama.cpp itself.
"""

from __future__ import annotations

import re

from ..sources.manifest import ModelConfig

# A 256-element super-block type -> the 32-element type used when rows do not fit.
K_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
MIX_BASE = {"q4_k_m": "Q4_K", "q5_k_m": "Q5_K"}

_LAYER = re.compile(r"^blk\.(\d+)\.")


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's choice of layers for the higher-precision attn_v / ffn_down."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def mix_dtype(name: str, quant: str, config: ModelConfig | None) -> str:
    """The type a 2-D weight ``name`` takes in the mix, before the row-length fallback."""
    base = MIX_BASE[quant]
    tied = config is not None and config.tie_word_embeddings
    if name == "output" or (tied and name == "token_embd"):
        return "Q6_K"
    m = _LAYER.match(name)
    if m is None or config is None:
        return base
    layer, n_layers = int(m.group(1)), config.n_layers
    eight_experts = config.n_experts == 8
    kind = name[m.end() :]
    if kind == "attn_v":
        if eight_experts:
            return "Q8_0"
        return "Q6_K" if use_more_bits(layer, n_layers) else base
    if kind == "attn_k" and eight_experts:
        return "Q8_0"
    if kind == "attn_output" and eight_experts and quant == "q4_k_m":
        return "Q5_K"
    if kind.startswith("ffn_down"):
        return "Q6_K" if use_more_bits(layer, n_layers) else base
    return base
