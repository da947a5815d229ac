"""The core's view of a model: a :class:`~colibri.sources.Manifest` and the engine
settings turned into the native ``ModelSpec``, ``TensorSpec`` list and ``ThreadSettings``
that ``_core.Engine`` is built from (model.py loads with them). Architecture differences
arrive here as data (the normalized ModelConfig); nothing in this file reads weights
except the small ``rope_freqs`` tensor that is folded into the spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .. import _core
from ..errors import ModelFormatError, UnsupportedError
from ..settings.config import ActivationPrecision, EngineConfig, ThreadConfig
from ..settings.table import copy_to_core
from ..sources import Manifest, ModelConfig, TensorInfo
from ..sources.fp8_parts import part_scales
from ..sources.hf_source import Fp8TensorInfo
from ..sources.validate import is_full_indexer_layer
from .rope import rope_table

__all__ = ["ACT_PRECISION", "model_spec", "resolved_context_length", "tensor_specs",
           "thread_settings"]


_QK_NORM = {"none": _core.QkNorm.none, "head": _core.QkNorm.head, "full": _core.QkNorm.full}
_ROUTER = {
    "softmax": _core.RouterKind.softmax_topk,
    "sigmoid_grouped": _core.RouterKind.sigmoid_grouped,
    "softmax_group_limited": _core.RouterKind.softmax_group_limited,
    "sqrt_softplus": _core.RouterKind.sqrt_softplus,
}
_ACTIVATION = {"silu": _core.FfnActivation.silu, "swiglu_oai": _core.FfnActivation.swiglu_oai,
               "swiglu_clamp": _core.FfnActivation.swiglu_clamp}


def thread_settings(cfg: ThreadConfig) -> _core.ThreadSettings:
    """The core's copy of `cfg` (ThreadConfig's declared fields). A wait policy of "auto" goes
    through as AUTO: the core decides it (csrc/model/engine.cpp, decide_wait) and reports
    the choice (``Engine.auto_wait_policy``, ``Engine.thread_settings``)."""
    settings = _core.ThreadSettings()
    copy_to_core(cfg, settings)
    return settings


ACT_PRECISION = {
    ActivationPrecision.INT8: _core.ActPrecision.int8,
    ActivationPrecision.FLOAT32: _core.ActPrecision.float32,
}


def resolved_context_length(cfg: ModelConfig, engine: EngineConfig) -> int:
    # The KV cache is allocated per session for the whole context (see EngineConfig).
    return engine.resolve_context_length(cfg.max_position_embeddings)


# Tensors the source provides that the core does not load: they are folded into the spec.
_SPEC_TENSORS = ("rope_freqs",)


def _rope_freq_factors(manifest: Manifest) -> npt.NDArray[np.float32] | None:
    """GGUF files of llama3-scaled models carry the scaling as a `rope_freqs` tensor of
    per-frequency divisors (llama.cpp divides the base frequencies by it)."""
    t = manifest.tensors.get("rope_freqs")
    if t is None:
        return None
    if t.dtype != "F32":
        raise UnsupportedError(f"rope_freqs must be F32, not {t.dtype}")
    chunks = []
    for e in t.extents:
        with open(manifest.files[e.file], "rb") as f:
            f.seek(e.offset)
            chunks.append(f.read(e.length))
    factors = np.frombuffer(b"".join(chunks), dtype=np.float32).copy()
    if not (np.all(np.isfinite(factors)) and np.all(factors > 0)):
        # llama.cpp divides the frequencies by them: zeros or NaN would make NaN logits.
        raise ModelFormatError(
            f"{manifest.files[t.extents[0].file]}: rope_freqs must hold finite values > 0; "
            f"the file is corrupt"
        )
    return factors


def model_spec(manifest: Manifest, context_length: int) -> _core.ModelSpec:
    cfg = manifest.config
    spec = _core.ModelSpec()
    spec.arch = cfg.arch
    spec.vocab_size = cfg.vocab_size
    spec.hidden_size = cfg.hidden_size
    spec.n_layers = cfg.n_layers
    spec.n_heads = cfg.n_heads
    spec.n_kv_heads = cfg.n_kv_heads
    spec.head_dim = cfg.head_dim
    spec.intermediate_size = cfg.intermediate_size
    spec.rms_norm_eps = cfg.rms_norm_eps
    rope = rope_table(
        cfg.rotary_dim or cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
        cfg.max_position_embeddings,
    )
    inv_freq = rope.inv_freq
    factors = _rope_freq_factors(manifest)
    if factors is not None:
        if factors.shape != inv_freq.shape:
            raise ModelFormatError(
                f"rope_freqs has {factors.size} entries, the heads need {inv_freq.size}"
            )
        inv_freq = (inv_freq / factors).astype(np.float32)
    spec.rope_inv_freq = inv_freq.tolist()
    spec.rope_attention_factor = rope.attention_factor
    spec.qk_norm = _QK_NORM[cfg.qk_norm]
    spec.attention_bias = cfg.attention_bias
    spec.attention_sinks = cfg.attention_sinks
    spec.sliding_window = cfg.sliding_window
    spec.sliding_layers = [1 if s else 0 for s in cfg.sliding_layers]
    spec.attention_out_bias = cfg.attention_out_bias
    spec.n_experts = cfg.n_experts
    spec.n_experts_per_tok = cfg.n_experts_per_tok
    spec.moe_intermediate_size = cfg.moe_intermediate_size
    spec.norm_topk_prob = cfg.norm_topk_prob
    spec.shared_expert_intermediate_size = cfg.shared_expert_intermediate_size
    spec.moe_layers = [1 if m else 0 for m in cfg.moe_layers]
    spec.tie_word_embeddings = cfg.tie_word_embeddings
    spec.context_length = context_length
    spec.rope_interleaved = cfg.rope_interleaved
    spec.attention_scale = cfg.attention_scale
    spec.router = _ROUTER[cfg.router]
    spec.routed_scaling_factor = cfg.routed_scaling_factor
    spec.n_group = cfg.n_group
    spec.topk_group = cfg.topk_group
    spec.n_mtp_layers = cfg.n_mtp_layers
    _ffn_fields(cfg, spec)
    _linear_fields(cfg, spec)
    _sliding_overrides(cfg, spec, factors)
    if cfg.is_mla:
        spec.attention_kind = _core.AttentionKind.mla
        spec.q_lora_rank = cfg.q_lora_rank
        spec.kv_lora_rank = cfg.kv_lora_rank
        spec.qk_nope_head_dim = cfg.qk_nope_head_dim
        spec.qk_rope_head_dim = cfg.qk_rope_head_dim
        spec.v_head_dim = cfg.v_head_dim
        spec.mla_norm_eps = cfg.mla_norm_eps
        spec.mla_no_rope = cfg.mla_no_rope
    if cfg.attention == "v4_sliding":
        spec.attention_kind = _core.AttentionKind.v4_sliding
        spec.q_lora_rank = cfg.q_lora_rank
        spec.qk_rope_head_dim = cfg.qk_rope_head_dim
        spec.o_groups = cfg.o_groups
        spec.o_lora_rank = cfg.o_lora_rank
        if any(cfg.compress_ratios):  # the compressed layers (attn_v4_compressed.hpp)
            spec.compress_ratios = list(cfg.compress_ratios)
            spec.csa_layers = [1 if c else 0 for c in cfg.csa_layers]
            rope_c = rope_table(cfg.rotary_dim or cfg.head_dim, cfg.compress_rope_theta,
                                cfg.compress_rope_scaling, cfg.max_position_embeddings)  # fmt: skip
            spec.compress_rope_inv_freq = rope_c.inv_freq.tolist()
            spec.compress_rope_attention_factor = rope_c.attention_factor
            spec.index_n_heads = cfg.index_n_heads
            spec.index_head_dim = cfg.index_head_dim
            spec.index_topk = cfg.index_topk
    spec.hc_mult = cfg.hc_mult
    spec.hc_sinkhorn_iters = cfg.hc_sinkhorn_iters
    spec.hc_eps = cfg.hc_eps
    spec.hash_layers = [1 if h else 0 for h in cfg.hash_layers]
    if cfg.has_indexer and cfg.is_mla:
        spec.index_n_heads = cfg.index_n_heads
        spec.index_head_dim = cfg.index_head_dim
        spec.index_topk = cfg.index_topk
        spec.indexer_full = [1 if is_full_indexer_layer(cfg, i) else 0
                             for i in range(cfg.n_layers)]  # fmt: skip
        spec.index_rope_interleaved = cfg.index_rope_interleaved
    return spec


def _sliding_overrides(cfg: ModelConfig, spec: _core.ModelSpec,
                       factors: npt.NDArray[np.float32] | None) -> None:
    """GQA per-layer-type overrides (MiMo-V2-Flash): the sliding layers' KV heads, RoPE
    base and sinks; the value head size and scale. Unset fields leave the global values."""
    spec.sliding_n_kv_heads = cfg.sliding_n_kv_heads
    spec.sinks_sliding_only = cfg.sinks_sliding_only
    spec.attention_value_scale = cfg.attention_value_scale
    if cfg.attention == "gqa":
        spec.v_head_dim = cfg.v_head_dim
    if cfg.sliding_rope_theta:
        rope = rope_table(cfg.rotary_dim or cfg.head_dim, cfg.sliding_rope_theta,
                          cfg.rope_scaling, cfg.max_position_embeddings)  # fmt: skip
        inv = rope.inv_freq if factors is None else (rope.inv_freq / factors).astype(np.float32)
        spec.sliding_rope_inv_freq = inv.tolist()


def _ffn_fields(cfg: ModelConfig, spec: _core.ModelSpec) -> None:
    """The gpt-oss FFN pieces (router logit bias, expert biases, clamped SwiGLU)."""
    spec.router_logit_bias = cfg.router_logit_bias
    spec.expert_bias = cfg.expert_bias
    spec.activation = _ACTIVATION[cfg.activation]
    spec.swiglu_limit = cfg.swiglu_limit
    spec.swiglu_alpha = cfg.swiglu_alpha


def _tensor_spec(t: TensorInfo, checksums: bool, files: Sequence[Path]) -> _core.TensorSpec:
    """The core's view of one tensor. A native container's dense tensors carry their crc32,
    which the core checks as it loads them (IOConfig.checksums "off" skips that); an FP8
    block-scaled weight carries its scale matrix (docs/format.md, "FP8 block-scaled
    weights"); MLA's W_UK (from kv_b_proj) its head count to transpose at load."""
    extents = [_core.Extent(e.file, e.offset, e.length) for e in t.extents]
    crc32 = t.crc32 if checksums else None
    if not isinstance(t, Fp8TensorInfo):
        return _core.TensorSpec(t.name, t.dtype, list(t.shape), extents, t.rope_unpermute_heads,
                                crc32, transpose_heads=t.transpose_heads)
    if t.transpose_heads or t.row_origin:
        # MLA's kv_b_proj split into attn_k_b / attn_v_b: their rows are a per-head subset
        # of the FP8 weight's, so they get scales re-blocked per row (sources/fp8_parts.py).
        values, block = part_scales(t, files)
        return _core.TensorSpec(t.name, t.dtype, list(t.shape), extents, 0, crc32, [],
                                list(block), t.transpose_heads, values.reshape(-1))  # fmt: skip
    if t.scale.dtype != "F32":
        raise UnsupportedError(
            f"FP8 weight {t.name!r} has {t.scale.dtype} block scales; colibri runs F32 scales "
            f"directly (the DeepSeek-V3 layout). Convert it: colibri convert --quant q8_0."
        )
    scales = [_core.Extent(e.file, e.offset, e.length) for e in t.scale.extents]
    return _core.TensorSpec(t.name, t.dtype, list(t.shape), extents, t.rope_unpermute_heads,
                            crc32, scales, list(t.block))


def tensor_specs(manifest: Manifest, checksums: bool = True) -> list[_core.TensorSpec]:
    return [_tensor_spec(t, checksums, manifest.files) for t in manifest.tensors.values()
            if t.name not in _SPEC_TENSORS]


def _linear_fields(cfg: ModelConfig, spec: _core.ModelSpec) -> None:
    """Hybrid linear attention (Qwen3-Next): the Gated DeltaNet layers and their sizes, the
    attention output gate and the norm weight offset."""
    spec.linear_layers = [1 if cfg.is_linear(i) else 0 for i in range(cfg.n_layers)]
    spec.linear_num_key_heads = cfg.linear_num_key_heads
    spec.linear_num_value_heads = cfg.linear_num_value_heads
    spec.linear_key_head_dim = cfg.linear_key_head_dim
    spec.linear_value_head_dim = cfg.linear_value_head_dim
    spec.linear_conv_kernel = cfg.linear_conv_kernel
    spec.linear_kda = cfg.linear_kda
    spec.attention_output_gate = cfg.attention_output_gate
    spec.norm_weight_offset = cfg.norm_weight_offset
    spec.linear_a_neg_exp = cfg.linear_a_neg_exp
    spec.linear_v_tiled = cfg.linear_v_tiled
