"""MiMo-V2-Flash as llama.cpp's converter writes it (general.architecture ``mimo2``,
LLM_ARCH_MIMO2), mapped to the ModelConfig the Hugging Face path gives (mimo_v2_flash.py):

* Layer kinds: ``attention.sliding_window_pattern`` (1: sliding), KV heads per layer in
  ``attention.head_count_kv`` (a list: the full layers' count and the sliding layers'
  count), RoPE bases ``rope.freq_base`` / ``rope.freq_base_swa``, the rotated width
  ``rope.dimension_count`` (NEOX halves, no permuted rows), query/key heads
  ``attention.key_length``, values ``attention.value_length``, the value scale
  ``attention.value_scale`` (absent: 1, as llama.cpp reads it).
* Window: the converter copies the release's ``sliding_window``, which the release means
  as ``sliding_window_size``: the query attends that many earlier tokens and itself, as
  transformers reads it (``sliding_window_size + 1``) and as the release's reference
  implementation runs it. colibri's window is that + 1; llama.cpp's mask keeps one key
  fewer.
* Sinks ``attn_sinks`` on the sliding layers only (the release's
  ``add_full_attention_sink_bias`` is false); a full layer carrying them is refused.
* MoE: sigmoid routing with the selection bias ``exp_probs_b`` and the expert groups of
  ``expert_group_count`` / ``expert_group_used_count``; the converter writes no
  renormalization flag and no scaling factor: llama.cpp's mimo2 graph renormalizes and
  scales by ``expert_weights_scale`` when present (the release's factor is null: 1).
* The converter declares 3 multi-token-prediction layers (``nextn_predict_layers``) past
  the trunk, carried or not; colibri does not run them (as transformers does not) and
  leaves their tensors unread.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ...errors import ModelFormatError, UnsupportedError
from ..manifest import ModelConfig, TensorInfo
from .deepseek_moe import GGUF_MTP_KEY, gguf_moe
from .deepseek_moe import gguf_name as deepseek_moe_gguf_name
from .spec import GGUFInput

GGUF_ARCHS = ("mimo2",)
__all__ = ["GGUF_ARCHS", "GGUF_MTP_KEY", "gguf_config", "gguf_name", "gguf_tensors"]
_LAYER = re.compile(r"^blk\.(\d+)\.")


def gguf_name(arch: str, name: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """llama.cpp's names, the selection bias ``exp_probs_b.bias`` as ``exp_probs_b``."""
    return deepseek_moe_gguf_name(arch, name, shape)


def _per_layer(inp: GGUFInput, key: str, blocks: int) -> list[int]:
    raw = inp.meta.md.get(f"{inp.arch}.{key}")
    if not isinstance(raw, list) or len(raw) != blocks or any(
        not isinstance(v, (int, bool)) or v < 0 for v in raw
    ):  # fmt: skip
        raise ModelFormatError(f"{inp.where}: {inp.arch}.{key} must list {blocks} "
                               f"non-negative integers (one per block)")  # fmt: skip
    return [int(v) for v in raw]


def _one_count(counts: list[int], kind: str, where: Path) -> int:
    if len(set(counts)) > 1:
        raise UnsupportedError(f"{where}: {kind} layers with different KV head counts "
                               f"{sorted(set(counts))} are not supported")  # fmt: skip
    return counts[0] if counts else 0


def gguf_config(inp: GGUFInput) -> ModelConfig:
    a, meta, tensors, where = inp.arch, inp.meta, inp.tensors, inp.where
    blocks = inp.base["n_layers"]
    out: dict[str, Any] = gguf_moe(inp)  # n_layers: the trunk, without the MTP layers
    n_layers = out["n_layers"]
    pattern = _per_layer(inp, "attention.sliding_window_pattern", blocks)[:n_layers]
    kv = _per_layer(inp, "attention.head_count_kv", blocks)[:n_layers]
    sliding = tuple(p == 1 for p in pattern)
    full_kv = _one_count([k for k, s in zip(kv, sliding, strict=True) if not s], "full", where)
    swa_kv = _one_count([k for k, s in zip(kv, sliding, strict=True) if s], "sliding", where)
    for i in range(n_layers):
        if not sliding[i] and f"blk.{i}.attn_sinks" in tensors:
            raise UnsupportedError(f"{where}: attention sinks on full layer {i} are not "
                                   f"supported (MiMo-V2-Flash's are on sliding layers)")
    first_swa = next((i for i, s in enumerate(sliding) if s), None)
    window = meta.int(f"{a}.attention.sliding_window", lo=1) + 1 if any(sliding) else 0
    theta = out["rope_theta"]
    swa_theta = meta.f32(f"{a}.rope.freq_base_swa", theta) if any(sliding) else 0.0
    head_dim = meta.int(f"{a}.attention.key_length", lo=1)
    out.update(
        arch="mimo_v2_flash",
        n_kv_heads=full_kv or swa_kv,
        head_dim=head_dim,
        v_head_dim=meta.int(f"{a}.attention.value_length", head_dim, lo=1),
        rotary_dim=meta.int(f"{a}.rope.dimension_count", head_dim, lo=1),
        attention_bias="blk.0.attn_q.bias" in tensors,
        attention_sinks=first_swa is not None and f"blk.{first_swa}.attn_sinks" in tensors,
        sinks_sliding_only=True,
        sliding_window=window,
        sliding_layers=sliding,
        sliding_n_kv_heads=swa_kv if full_kv else 0,
        sliding_rope_theta=swa_theta if full_kv else 0.0,
        rope_theta=theta if full_kv else swa_theta,
        attention_value_scale=meta.f32(f"{a}.attention.value_scale", 1.0),  # > 0: validate.py
        norm_topk_prob=True,  # llama.cpp's mimo2 graph hard-codes it
        n_mtp_layers=0,
    )
    return ModelConfig(**out)


def gguf_tensors(
    tensors: dict[str, TensorInfo], cfg: ModelConfig, where: Path
) -> dict[str, TensorInfo]:
    """The trunk's tensors: those of the multi-token-prediction layers are not read."""
    out: dict[str, TensorInfo] = {}
    for name, t in tensors.items():
        m = _LAYER.match(name)
        if m is None or int(m.group(1)) < cfg.n_layers:
            out[name] = t
    return out
