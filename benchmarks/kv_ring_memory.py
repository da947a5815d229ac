"""KV-cache bytes of one session of gpt-oss-20b and -120b at 4k and 64k tokens of context,
with every layer keeping every position (before sliding-window rings) and with the sliding
layers keeping a ring of their last window + 64 positions (csrc/model/kv_cache.hpp); and
of a DeepSeek-V4-Flash-shaped model's sliding-window attention at 4k, 64k and 1M tokens.

Pure arithmetic, no weights: each model's config.json as released (the fields that shape
the KV cache) goes through colibri's own config reader (the gpt_oss family), then the
budget's count (colibri.engine.budget.kv_layers_bytes, which tests check against the
core's allocation). Printed per KV type; docs/benchmarks.md quotes the table.

    python benchmarks/kv_ring_memory.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from colibri.engine.budget import kv_layers_bytes, kv_ring_positions
from colibri.engine.streaming import kv_layer_widths, kv_layer_windows
from colibri.sources.hf_config import hf_config
from colibri.sources.manifest import ModelConfig

# The KV-shaping fields of openai/gpt-oss-20b and -120b's config.json (both: 64 query and
# 8 KV heads of 64, a window of 128 on every other layer, 131072 positions).
_COMMON: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
    "sliding_window": 128, "vocab_size": 201088, "intermediate_size": 2880,
    "num_experts_per_tok": 4, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 150000, "attention_bias": True, "swiglu_limit": 7.0,
    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "truncate": False},
}  # fmt: skip
MODELS = {
    "gpt-oss-20b": {**_COMMON, "num_hidden_layers": 24, "num_local_experts": 32},
    "gpt-oss-120b": {**_COMMON, "num_hidden_layers": 36, "num_local_experts": 128},
}
CONTEXTS = (4096, 65536)
KV_TYPES = ("f16", "f32")

# DeepSeek-V4-Flash's shape as transformers' DeepseekV4Config defaults give it (5.25):
# 43 layers, one shared K = V row of head_dim 512 per position, sliding_window 128. Every
# V4 layer has this sliding-window branch; the released layers are compressed ones (CSA /
# HCA) that also keep compressed entries (and CSA an indexer's keys) in an F32 state
# (docs/deepseek.md): only the sliding branch's rows are counted here.
V4_LAYERS, V4_HEAD_DIM, V4_WINDOW = 43, 512, 128
V4_CONTEXTS = (4096, 65536, 1 << 20)


def model_config(cfg: dict[str, Any]) -> ModelConfig:
    n = cfg["num_hidden_layers"]
    cfg = {**cfg, "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                                  for i in range(n)]}  # fmt: skip
    names = {f"model.layers.{i}.self_attn.q_proj.weight" for i in range(n)} | {"lm_head.weight"}
    return hf_config(cfg, Path("/nonexistent") / "gpt-oss", names)


def rows() -> list[tuple[str, str, int, int, int]]:
    """(model, KV type, context, bytes with every position, bytes with the rings)."""
    out = []
    for name, raw in MODELS.items():
        c = model_config(raw)
        widths, windows = kv_layer_widths(c), kv_layer_windows(c)
        for kv_type in KV_TYPES:
            for ctx in CONTEXTS:
                out.append((name, kv_type, ctx, kv_layers_bytes(widths, ctx, kv_type),
                            kv_layers_bytes(widths, ctx, kv_type, windows)))
    return out


def v4_rows() -> list[tuple[str, int, int, int]]:
    """(KV type, context, bytes with every position, bytes with the rings) of the
    V4-Flash-shaped sliding-window attention: the widths and windows kv_layer_widths /
    kv_layer_windows give a V4 model (tests/oracle/test_oracle_deepseek_v4_ring.py)."""
    widths, windows = [(V4_HEAD_DIM, 0)] * V4_LAYERS, [V4_WINDOW] * V4_LAYERS
    return [(kv_type, ctx, kv_layers_bytes(widths, ctx, kv_type),
             kv_layers_bytes(widths, ctx, kv_type, windows))
            for kv_type in KV_TYPES for ctx in V4_CONTEXTS]  # fmt: skip


def main() -> None:
    print(f"sliding layers keep {kv_ring_positions(128, 1 << 20)} positions (window 128 + 64)")
    print(f"{'model':<14}{'KV':<5}{'context':>8}{'full MiB':>11}{'ring MiB':>11}{'saved':>8}")
    for name, kv_type, ctx, full, ring in rows():
        print(f"{name:<14}{kv_type:<5}{ctx:>8}{full / 2**20:>11.1f}{ring / 2**20:>11.1f}"
              f"{1 - ring / full:>8.0%}")
    print(f"\nDeepSeek-V4-Flash shape ({V4_LAYERS} layers, K = V rows of {V4_HEAD_DIM}, window "
          f"{V4_WINDOW}): the sliding-window branch only, compressed layers' state not counted")
    print(f"{'KV':<5}{'context':>9}{'full MiB':>12}{'ring MiB':>11}{'saved':>8}")
    for kv_type, ctx, full, ring in v4_rows():
        print(f"{kv_type:<5}{ctx:>9}{full / 2**20:>12.1f}{ring / 2**20:>11.1f}"
              f"{1 - ring / full:>8.2%}")


if __name__ == "__main__":
    main()
