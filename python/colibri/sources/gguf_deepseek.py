"""The DeepSeek-V3 / GLM family in GGUF files as llama.cpp's converter writes them:
metadata -> ModelConfig and tensor names -> canonical ones.

=================  ==================================  ======================================
GGUF architecture  family (ModelConfig.arch)           what llama.cpp converts to it
=================  ==================================  ======================================
``deepseek2``      ``deepseek_v3`` (sigmoid gating)    DeepSeek-V3/R1, Kimi-K2, GLM-4.7-Flash
                   ``deepseek_v2`` (softmax gating)    DeepSeek-V2, V2-Lite
``deepseek32``     ``deepseek_v32``                    DeepSeek-V3.2 (MLA + DSA)
``glm-dsa``        ``glm_moe_dsa``                     GLM-5.x (MLA + DSA)
``glm4moe``        ``glm4_moe``                        GLM-4.5/4.6/4.7 (GQA)
=================  ==================================  ======================================

The keys follow llama.cpp's loaders (``src/models/<arch>.cpp``), and a file computes what
llama.cpp computes from it:

* MLA: ``attention.kv_lora_rank``, ``attention.q_lora_rank`` (absent: a direct ``attn_q``,
  V2-Lite), ``attention.key_length_mla`` = nope + rope, ``attention.value_length_mla``,
  ``rope.dimension_count`` = rope; ``attention.key_length`` / ``value_length`` are the
  absorbed widths (kv_lora + rope, kv_lora) and are checked. ``attn_k_b`` / ``attn_v_b``
  are 3-D ``[heads, kv_lora, nope]`` / ``[heads, v, kv_lora]`` and read as matrices.
  Files with only the unsplit ``attn_kv_b`` (written before llama.cpp split it) are
  refused with a request to reconvert. RoPE is llama.cpp's "NORM" (adjacent pairs) for
  MLA, "NEOX" for glm4moe; the q-LoRA and latent norms use ``rms_norm_epsilon`` (as
  llama.cpp does; transformers uses 1e-6, so the two differ for GLM's 1e-5).
* YaRN: the converter stores ``0.1 * mscale_all_dim`` as ``rope.scaling.yarn_log_multiplier``
  (llama.cpp divides it back); the softmax scale is ``mscale(factor, mscale_all_dim)^2 /
  sqrt(nope + rope)`` and cos/sin are not rescaled (DeepSeek's mscale == mscale_all_dim).
* Routing: ``expert_gating_func`` 2 (sigmoid) with ``exp_probs_b`` and the groups of
  ``expert_group_count`` / ``expert_group_used_count``; 1 (softmax): greedy top-k, or with
  groups DeepSeek-V2's group-limited greedy (a group scores its best expert; llama.cpp
  scores every grouped rule by its best two). Absent: softmax for deepseek2 (llama.cpp's
  default for old V2 files), sigmoid for glm4moe / glm-dsa. ``expert_weights_scale``,
  ``expert_weights_norm`` as named; which layers are dense and the expert / shared-expert
  widths come from the tensors themselves (``ffn_gate_inp`` present or not).
* DSA: ``attention.indexer.head_count``, ``.key_length``, ``.top_k`` and, for glm-dsa,
  ``.types`` (true: full); without it every layer is full, except that a file trained
  for a million-token context gets GLM-5.2's pattern (llama.cpp's rule).
* MTP: ``nextn_predict_layers`` layers at the end of ``block_count`` (the converter keeps
  them for glm4moe, deepseek32 and glm-dsa and drops them for deepseek2).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError, UnsupportedError
from .fields import as_bool, as_float, as_int
from .hf_deepseek import MLA_NORM_EPS, mla_softmax_scale
from .manifest import IndexerType, ModelConfig, QkNorm, RouterKind, TensorInfo

ARCHITECTURES = ("deepseek2", "deepseek32", "glm-dsa", "glm4moe")
_MLA = ("deepseek2", "deepseek32", "glm-dsa")
_DSA = ("deepseek32", "glm-dsa")

# GLM-5.2's indexer pattern (llama.cpp's GLM_5_2_DEFAULT_INDEXER_TYPES): 2 full layers, then
# one full layer every 4.
def _glm52_types(n_layers: int) -> tuple[IndexerType, ...]:
    return tuple("full" if i < 2 or (i - 2) % 4 == 0 else "shared" for i in range(n_layers))


_RENAMES = [
    (re.compile(r"^(blk\.\d+)\.exp_probs_b\.bias$"), r"\1.exp_probs_b"),
    (re.compile(r"^(blk\.\d+)\.indexer\.k_norm\.bias$"), r"\1.indexer.k_norm.bias"),
]


def canonical_name(gguf_arch: str, name: str) -> str:
    """A deepseek-family GGUF tensor name -> the canonical one (``.weight`` dropped)."""
    for pat, repl in _RENAMES:
        if pat.match(name):
            return pat.sub(repl, name)
    base = name[: -len(".weight")] if name.endswith(".weight") else name
    if gguf_arch == "glm4moe":  # llama.cpp's GLM-4.5 map calls the FFN norm a post-attention norm
        base = re.sub(r"^(blk\.\d+)\.post_attention_norm$", r"\1.ffn_norm", base)
    return base


def reshape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """MLA's 3-D attn_k_b / attn_v_b [heads, rows, cols] as the matrix [heads*rows, cols]."""
    if name.endswith(("attn_k_b", "attn_v_b")) and len(shape) == 3:
        return (shape[0] * shape[1], shape[2])
    return shape


def _get(md: dict[str, Any], key: str, where: Path, default: Any = None) -> Any:
    v = md.get(key, default)
    if v is None:
        raise ModelFormatError(f"{where}: GGUF metadata key {key!r} is missing")
    return v


def _int(md: dict[str, Any], key: str, where: Path, default: int | None = None,
         lo: int = 0) -> int:  # fmt: skip
    v = _get(md, key, where, default)
    if isinstance(v, list):
        if not v or any(x != v[0] for x in v):
            raise UnsupportedError(f"{where}: per-layer values for {key!r} are not supported")
        v = v[0]
    return as_int(v, f"GGUF metadata {key}", where, lo=lo)


def _float(md: dict[str, Any], key: str, where: Path, default: float) -> float:
    v = md.get(key)
    return default if v is None else as_float(v, f"GGUF metadata {key}", where, lo=0.0,
                                                    lo_open=True)  # fmt: skip


def _router(arch: str, md: dict[str, Any], a: str, where: Path) -> RouterKind:
    gating = _int(md, f"{a}.expert_gating_func", where, 1 if arch == "deepseek2" else 2)
    if gating == 2:
        return "sigmoid_grouped"
    if gating == 1:
        groups = _int(md, f"{a}.expert_group_count", where, 1, lo=1)
        used = _int(md, f"{a}.expert_group_used_count", where, groups, lo=1)
        return "softmax_group_limited" if 1 < groups and used < groups else "softmax"
    raise UnsupportedError(
        f"{where}: expert_gating_func {gating} is not supported (1: softmax, 2: sigmoid)"
    )


def _indexer_types(arch: str, md: dict[str, Any], a: str, n_layers: int, ctx: int,
                   where: Path) -> tuple[IndexerType, ...]:  # fmt: skip
    raw = md.get(f"{a}.attention.indexer.types")
    if arch == "deepseek32" or (raw is None and ctx < 1048576):
        return tuple("full" for _ in range(n_layers))
    if raw is None:
        return _glm52_types(n_layers)
    if not isinstance(raw, list) or len(raw) < n_layers:
        raise ModelFormatError(f"{where}: {a}.attention.indexer.types needs {n_layers} entries")
    types: tuple[IndexerType, ...] = tuple("full" if x else "shared" for x in raw[:n_layers])
    if types[0] != "full":
        raise ModelFormatError(f"{where}: the first layer's indexer must be full")
    return types


def family_config(
    arch: str, md: dict[str, Any], tensors: dict[str, TensorInfo], where: Path,
    base: dict[str, Any],
) -> ModelConfig:
    """The ModelConfig of a deepseek2 / deepseek32 / glm-dsa / glm4moe file. ``base`` holds
    what every architecture shares (vocab, hidden, heads, eps, RoPE, ids) as load_gguf read
    it, with n_layers the whole block_count."""
    a = arch
    declared = _int(md, f"{a}.nextn_predict_layers", where, 0)
    n_layers = base["n_layers"] - declared  # block_count counts the MTP layers
    # A "trunk-only" file declares them but carries none (llama.cpp accepts it too).
    n_mtp = declared if f"blk.{n_layers}.nextn.eh_proj" in tensors else 0
    if n_layers <= 0:
        raise ModelFormatError(f"{where}: {a}.block_count leaves no trunk layers")
    hidden = base["hidden_size"]
    moe_layers = tuple(f"blk.{i}.ffn_gate_inp" in tensors for i in range(n_layers))
    first_moe = next((i for i, m in enumerate(moe_layers) if m), None)
    if first_moe is None:
        raise ModelFormatError(f"{where}: a {a} model without router tensors (ffn_gate_inp)")
    first_dense = next((i for i, m in enumerate(moe_layers) if not m), None)
    moe_ffn = tensors[f"blk.{first_moe}.ffn_gate_exps.0"].shape[0]
    shexp = tensors.get(f"blk.{first_moe}.ffn_gate_shexp")
    dense_ffn = tensors[f"blk.{first_dense}.ffn_gate"].shape[0] if first_dense is not None else 0
    router = _router(arch, md, a, where)
    groups = _int(md, f"{a}.expert_group_count", where, 1, lo=1)
    used = _int(md, f"{a}.expert_group_used_count", where, groups, lo=1)
    if router == "softmax":
        groups = used = 1
    eps = base["rms_norm_eps"]
    out: dict[str, Any] = dict(base)
    out.update(
        n_layers=n_layers,
        intermediate_size=dense_ffn,
        n_experts=_int(md, f"{a}.expert_count", where),
        n_experts_per_tok=_int(md, f"{a}.expert_used_count", where),
        moe_intermediate_size=moe_ffn,
        norm_topk_prob=as_bool(md.get(f"{a}.expert_weights_norm", False),
                               f"GGUF metadata {a}.expert_weights_norm", where),
        shared_expert_intermediate_size=shexp.shape[0] if shexp is not None else 0,
        shared_expert_gated=False,
        moe_layers=moe_layers,
        router=router,
        router_bias=f"blk.{first_moe}.exp_probs_b" in tensors,
        routed_scaling_factor=_float(md, f"{a}.expert_weights_scale", where, 1.0),
        n_group=groups,
        topk_group=used,
        n_mtp_layers=n_mtp,
    )
    rot = _int(md, f"{a}.rope.dimension_count", where)
    if arch == "glm4moe":
        head_dim = _int(md, f"{a}.attention.key_length", where, hidden // base["n_heads"])
        if _int(md, f"{a}.attention.value_length", where, head_dim) != head_dim:
            raise UnsupportedError(f"{where}: key and value head sizes differ")
        qk: QkNorm = "head" if "blk.0.attn_q_norm" in tensors else "none"
        out.update(
            arch="glm4_moe", head_dim=head_dim, rotary_dim=rot, qk_norm=qk,
            attention_bias="blk.0.attn_q.bias" in tensors,
        )  # fmt: skip
        return ModelConfig(**out)

    if any(n.endswith(".attn_kv_b") for n in tensors) and not any(
        n.endswith(".attn_k_b") for n in tensors
    ):
        raise UnsupportedError(
            f"{where}: this GGUF stores MLA's kv_b unsplit (attn_kv_b), as llama.cpp wrote "
            f"before splitting it into attn_k_b/attn_v_b; convert the model again with a "
            f"current convert_hf_to_gguf.py"
        )
    kv_lora = _int(md, f"{a}.attention.kv_lora_rank", where)
    qk_dim = _int(md, f"{a}.attention.key_length_mla", where)
    v_dim = _int(md, f"{a}.attention.value_length_mla", where)
    if _int(md, f"{a}.attention.key_length", where) != kv_lora + rot or _int(
        md, f"{a}.attention.value_length", where
    ) != kv_lora:
        raise ModelFormatError(
            f"{where}: attention.key_length/value_length are not the absorbed MLA widths "
            f"kv_lora_rank + rope ({kv_lora + rot}) / kv_lora_rank ({kv_lora})"
        )
    scaling = base["rope_scaling"]
    if scaling and "mscale_all_dim" in scaling:
        scaling = dict(scaling)
        scaling["mscale_all_dim"] = as_float(scaling["mscale_all_dim"], "yarn_log_multiplier",
                                             where, lo=0.0) / 0.1  # see the docstring
        scaling.setdefault("mscale", scaling["mscale_all_dim"])
    family = {"deepseek32": "deepseek_v32", "glm-dsa": "glm_moe_dsa"}.get(
        arch, "deepseek_v3" if router == "sigmoid_grouped" else "deepseek_v2"
    )
    out.update(
        arch=family,
        attention="mla",
        n_kv_heads=base["n_heads"],
        head_dim=qk_dim,
        rotary_dim=rot,
        rope_interleaved=True,
        rope_scaling=scaling,
        attention_scale=mla_softmax_scale(qk_dim, scaling),
        q_lora_rank=_int(md, f"{a}.attention.q_lora_rank", where, 0),
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=qk_dim - rot,
        qk_rope_head_dim=rot,
        v_head_dim=v_dim,
        mla_norm_eps=as_float(eps, "rms_norm_eps", where, lo=0.0) if eps else MLA_NORM_EPS,
    )
    if arch in _DSA:
        ctx = base["max_position_embeddings"]
        out.update(
            index_n_heads=_int(md, f"{a}.attention.indexer.head_count", where),
            index_head_dim=_int(md, f"{a}.attention.indexer.key_length", where),
            index_topk=_int(md, f"{a}.attention.indexer.top_k", where),
            indexer_types=_indexer_types(arch, md, a, n_layers, ctx, where),
            index_rope_interleaved=arch == "glm-dsa",
        )
    return ModelConfig(**out)
