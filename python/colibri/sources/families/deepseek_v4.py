"""DeepSeek-V4 (V4-Flash, V4-Pro): a trunk of hyper-connected layers (the residual is
``hc_mult`` streams mixed by Sinkhorn-Knopp-projected matrices), attention with one shared
key-value head and a grouped output projection, MoE layers routed by sqrt(softplus)
scores, the first of them by a frozen token-id -> experts table (hash layers).

* ``deepseek_v4``: Hugging Face ``deepseek_v4`` / ``DeepseekV4ForCausalLM``; GGUF
  ``deepseek4`` as llama.cpp's converter writes it (from the checkpoint as DeepSeek
  released it: routed experts MXFP4, the hash tables I32 ``ffn_gate_tid2eid``, hash
  layers without their unused gate bias; no tensor is permuted or rescaled).

What runs: every layer type of ``layer_types``. ``sliding_attention``: a q-LoRA query
normed per head without weight, one key-value head (K = V), partial interleaved RoPE on
the trailing ``qk_rope_head_dim`` values of each head with the plain "main" RoPE
(``rope_theta``, never scaled), a learned sink per head, a window of ``sliding_window``
positions, the rotation undone on the output, ``o_groups`` x ``o_lora_rank`` grouped
output projection (csrc/model/attn_v4.cpp). ``heavily_compressed_attention`` and
``compressed_sparse_attention`` add compressed entries of the whole past to that window
(``compress_rates``; CSA with the lightning indexer choosing ``index_topk`` of them), and
rotate with the "compress" RoPE (``compress_rope_theta``, YaRN where configured;
csrc/model/attn_v4_compressed.cpp). The multi-token-prediction layers are refused.

* Routing: ``scoring_func`` ``sqrtsoftplus`` (csrc/model/routers/sqrt_softplus.cpp) or
  ``sigmoid`` (DeepSeek-V3's rule with one group): top k of score +
  ``e_score_correction_bias`` (stored as ``ffn.gate.bias``), weights the scores of the
  chosen, always renormalized (transformers' modeling code does), times
  ``routed_scaling_factor``. ``softmax`` is refused (its V4 form selects with a bias the
  softmax router does not take).
* Hash layers (``mlp_layer_types`` "hash_moe"): ``ffn.gate.tid2eid`` (vocab x top-k
  integers) chooses the experts; the router's scores weigh them. The tables are checked
  against the vocabulary and the expert count and copied as F32 into a side file
  (sources/hash_tables.py).
* Experts and the shared expert: ``swiglu_limit`` clamps as
  silu(min(gate, limit)) * clamp(up, -limit, limit) (activation "swiglu_clamp"; not
  gpt-oss's formula), every FFN, shared expert included.
* Names: the checkpoint's own (``attn.wq_a``, ``ffn.experts.{e}.w1`` ...), with or
  without a leading ``model.``, as transformers' save_pretrained writes them.
"""

from __future__ import annotations

import re
from typing import Any

from ...errors import ModelFormatError, UnsupportedError
from ..fields import as_float, as_int, bad, f32_decimal
from ..hash_tables import v4_gguf_hash_tables, v4_hash_tables
from ..manifest import ModelConfig, RouterKind
from .spec import Family, GGUFInput, HFInput, NameRule, plain_gguf_name

ARCH = "deepseek_v4"
KNOWN_LAYER_TYPES = ("sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention")  # fmt: skip
MLP_LAYER_TYPES = ("hash_moe", "moe")
_SCORING: dict[str, RouterKind] = {"sqrtsoftplus": "sqrt_softplus", "sigmoid": "sigmoid_grouped"}

_P = r"(?:model\.)?"
_L = _P + r"layers\.(\d+)\."
_NAMES: list[NameRule] = [
    (re.compile(_P + r"embed(?:_tokens)?\.weight"), "token_embd"),
    (re.compile(_P + r"norm\.weight"), "output_norm"),
    (re.compile(r"(?:lm_)?head\.weight"), "output"),
    (re.compile(_P + r"hc_head[._]hc_(fn|base|scale)"), "output_hc_{0}"),
    (re.compile(_P + r"hc_head_(fn|base|scale)"), "output_hc_{0}"),
    (re.compile(_L + r"attn_norm\.weight"), "blk.{0}.attn_norm"),
    (re.compile(_L + r"ffn_norm\.weight"), "blk.{0}.ffn_norm"),
    (re.compile(_L + r"hc_(attn|ffn)_(fn|base|scale)"), "blk.{0}.hc_{1}_{2}"),
    (re.compile(_L + r"attn\.wq_a\.weight"), "blk.{0}.attn_q_a"),
    (re.compile(_L + r"attn\.q_norm\.weight"), "blk.{0}.attn_q_a_norm"),
    (re.compile(_L + r"attn\.wq_b\.weight"), "blk.{0}.attn_q_b"),
    (re.compile(_L + r"attn\.wkv\.weight"), "blk.{0}.attn_kv"),
    # attn.kv_norm as llama.cpp's converter reads the released checkpoint, attn.norm as
    # transformers' save_pretrained writes it
    (re.compile(_L + r"attn\.(?:kv_)?norm\.weight"), "blk.{0}.attn_kv_norm"),
    (re.compile(_L + r"attn\.wo_a\.weight"), "blk.{0}.attn_output_a"),
    (re.compile(_L + r"attn\.wo_b\.weight"), "blk.{0}.attn_output_b"),
    (re.compile(_L + r"attn\.attn_sink"), "blk.{0}.attn_sinks"),
    # the compressed layers' compressors (and CSA's lightning indexer with its own), as
    # llama.cpp's converter names them
    (re.compile(_L + r"attn\.compressor\.w(kv|gate)\.weight"), "blk.{0}.attn_compressor_{1}"),
    (re.compile(_L + r"attn\.compressor\.ape"), "blk.{0}.attn_compressor_ape"),
    (re.compile(_L + r"attn\.compressor\.norm\.weight"), "blk.{0}.attn_compressor_norm"),
    (re.compile(_L + r"attn\.indexer\.compressor\.w(kv|gate)\.weight"),
     "blk.{0}.indexer_compressor_{1}"),
    (re.compile(_L + r"attn\.indexer\.compressor\.ape"), "blk.{0}.indexer_compressor_ape"),
    (re.compile(_L + r"attn\.indexer\.compressor\.norm\.weight"),
     "blk.{0}.indexer_compressor_norm"),
    (re.compile(_L + r"attn\.indexer\.wq_b\.weight"), "blk.{0}.indexer.attn_q_b"),
    (re.compile(_L + r"attn\.indexer\.weights_proj\.weight"), "blk.{0}.indexer.proj"),
    (re.compile(_L + r"ffn\.gate\.weight"), "blk.{0}.ffn_gate_inp"),
    (re.compile(_L + r"ffn\.gate\.bias"), "blk.{0}.exp_probs_b"),
    (re.compile(_L + r"ffn\.experts\.(\d+)\.w1\.weight"), "blk.{0}.ffn_gate_exps.{1}"),
    (re.compile(_L + r"ffn\.experts\.(\d+)\.w2\.weight"), "blk.{0}.ffn_down_exps.{1}"),
    (re.compile(_L + r"ffn\.experts\.(\d+)\.w3\.weight"), "blk.{0}.ffn_up_exps.{1}"),
    (re.compile(_L + r"ffn\.shared_experts\.w1\.weight"), "blk.{0}.ffn_gate_shexp"),
    (re.compile(_L + r"ffn\.shared_experts\.w2\.weight"), "blk.{0}.ffn_down_shexp"),
    (re.compile(_L + r"ffn\.shared_experts\.w3\.weight"), "blk.{0}.ffn_up_shexp"),
]


def _layer_types(inp: HFInput, key: str, known: tuple[str, ...], n: int) -> list[str]:
    types = inp.cfg.get(key)
    if not isinstance(types, list) or len(types) != n or \
            not all(isinstance(t, str) for t in types):  # fmt: skip
        raise bad(inp.fields.where, key, types, f"a list of {n} layer types")
    unknown = sorted({t for t in types if t not in known})
    if unknown:
        raise ModelFormatError(f"{inp.fields.where}: {key} names unknown layer types "
                               f"{', '.join(unknown)} (DeepSeek-V4 has "
                               f"{', '.join(known)})")  # fmt: skip
    return types


def _hf_config(inp: HFInput) -> ModelConfig:
    cfg, f, where = inp.cfg, inp.fields, inp.fields.where
    n_layers = inp.base["n_layers"]
    attn = _layer_types(inp, "layer_types", KNOWN_LAYER_TYPES, n_layers)
    mlp = _layer_types(inp, "mlp_layer_types", MLP_LAYER_TYPES, n_layers)
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)):
        if cfg.get(key, want) != want:
            raise UnsupportedError(f"{inp.d}: DeepSeek-V4 with {key} {cfg.get(key)!r}")
    scoring = cfg.get("scoring_func", "sqrtsoftplus")
    if scoring not in _SCORING:
        raise UnsupportedError(f"{inp.d}: DeepSeek-V4 with scoring_func {scoring!r} is not "
                               f"implemented ({', '.join(_SCORING)})")  # fmt: skip
    head_dim = inp.base["head_dim"]
    prf = as_float(cfg.get("partial_rotary_factor", 64 / 512), "partial_rotary_factor", where,
                   lo=0.0, lo_open=True)  # fmt: skip
    rope_dim = int(head_dim * prf)
    window = f.int("sliding_window", 128)
    n_exp = f.int("n_routed_experts")
    n_shared = f.int("n_shared_experts", 1, lo=0)
    if n_shared > 1:
        raise UnsupportedError(f"{inp.d}: DeepSeek-V4 with {n_shared} shared experts")
    moe_ffn = f.int("moe_intermediate_size")
    names = inp.names
    scaling = as_float(cfg.get("routed_scaling_factor", 1.5), "routed_scaling_factor", where,
                       lo=0.0, lo_open=True)  # fmt: skip
    limit = as_float(cfg.get("swiglu_limit", 10.0), "swiglu_limit", where, lo=0.0, lo_open=True)
    compressed = _compressed_fields(inp, attn)
    hc = as_int(cfg.get("hc_mult", 4), "hc_mult", where, lo=1, hi=64)
    iters = as_int(cfg.get("hc_sinkhorn_iters", 20), "hc_sinkhorn_iters", where, lo=1, hi=1000)
    return ModelConfig(
        **{**inp.base, **compressed,
           "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False))
           or not any(n in names for n in ("head.weight", "lm_head.weight"))},
        arch=ARCH,
        intermediate_size=0,
        rotary_dim=rope_dim,
        rope_interleaved=True,
        attention="v4_sliding",
        q_lora_rank=f.int("q_lora_rank"),
        qk_rope_head_dim=rope_dim,
        attention_sinks=True,
        sliding_window=window,
        sliding_layers=tuple(True for _ in range(n_layers)),
        o_groups=f.int("o_groups"),
        o_lora_rank=f.int("o_lora_rank"),
        n_experts=n_exp,
        n_experts_per_tok=f.int("num_experts_per_tok"),
        moe_intermediate_size=moe_ffn,
        shared_expert_intermediate_size=moe_ffn * n_shared,
        shared_expert_gated=False,
        norm_topk_prob=True,  # transformers' V4 routers always renormalize
        moe_layers=tuple(True for _ in range(n_layers)),
        hash_layers=tuple(t == "hash_moe" for t in mlp),
        router=_SCORING[scoring],
        routed_scaling_factor=scaling,
        router_bias=any(re.fullmatch(_L + r"ffn\.gate\.bias", n) for n in names),
        activation="swiglu_clamp",
        swiglu_limit=limit,
        hc_mult=hc,
        hc_sinkhorn_iters=iters,
        hc_eps=as_float(cfg.get("hc_eps", 1e-6), "hc_eps", where, lo=0.0),
    )


def _compress_rope(inp: HFInput) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) of the compressed layers' RoPE: ``rope_parameters["compress"]``, or
    as transformers builds it from a flat config: ``compress_rope_theta`` with the top-level
    scaling (YaRN's attention factor 1 unless given)."""
    cfg, where = inp.cfg, inp.fields.where
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rp, dict):
        raise bad(where, "rope_parameters", rp, "an object")
    if isinstance(rp.get("compress"), dict):
        params = dict(rp["compress"])
    else:
        params = {k: v for k, v in rp.items() if k not in ("main", "compress", "rope_theta")}
        params["rope_theta"] = cfg.get("compress_rope_theta", 160000.0)
        if params.get("rope_type", params.get("type")) == "yarn":
            params.setdefault("attention_factor", 1.0)
    theta = as_float(params.get("rope_theta", 160000.0), "compress rope_theta", where, lo=0.0,
                     lo_open=True)  # fmt: skip
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    scaling = {k: v for k, v in params.items()
               if k not in ("rope_theta", "type", "partial_rotary_factor")}  # fmt: skip
    scaling["rope_type"] = kind
    scaling.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    return theta, scaling


def _compressed_fields(inp: HFInput, attn: list[str]) -> dict[str, Any]:
    """The compressed layers' fields (ModelConfig.compress_ratios ...), none when every
    layer is sliding; a flat config's scaling is the compressed layers' only (transformers
    builds the sliding layers' "main" RoPE unscaled)."""
    cfg, f, where = inp.cfg, inp.fields, inp.fields.where
    rp = cfg.get("rope_parameters")
    nested = isinstance(rp, dict) and isinstance(rp.get("main"), dict)
    out: dict[str, Any] = {} if nested else {"rope_scaling": None}
    if all(t == "sliding_attention" for t in attn):
        return out
    rates = cfg.get("compress_rates") or {}
    if not isinstance(rates, dict):
        raise bad(where, "compress_rates", rates, "an object of layer type -> rate")
    ratios = []
    for t in attn:
        if t == "sliding_attention":
            ratios.append(0)
            continue
        ratios.append(as_int(rates.get(t, 4 if t == "compressed_sparse_attention" else 128),
                             f"compress_rates.{t}", where, lo=1, hi=1 << 20))  # fmt: skip
    theta, scaling = _compress_rope(inp)
    out.update(compress_ratios=tuple(ratios),
               csa_layers=tuple(t == "compressed_sparse_attention" for t in attn),
               compress_rope_theta=theta, compress_rope_scaling=scaling)  # fmt: skip
    if "compressed_sparse_attention" in attn:
        out.update(index_n_heads=f.int("index_n_heads", 64),
                   index_head_dim=f.int("index_head_dim", 128),
                   index_topk=f.int("index_topk", 512))  # fmt: skip
    return out


_GGUF_GATING: dict[int, RouterKind] = {4: "sqrt_softplus", 2: "sigmoid_grouped"}


def _gguf_clamp(inp: GGUFInput, n_layers: int) -> float:
    """swiglu_clamp_exp / _shexp: one limit per layer, the same everywhere (config.json's
    one swiglu_limit, which is all the converter writes)."""
    values: list[float] = []
    for key in ("swiglu_clamp_exp", "swiglu_clamp_shexp"):
        v = inp.meta.get(f"{inp.arch}.{key}")
        v = v if isinstance(v, list) else [v] * n_layers
        if len(v) != n_layers:
            raise bad(inp.where, f"{inp.arch}.{key}", v, f"{n_layers} values, one per layer")
        values += [f32_decimal(x, f"{inp.arch}.{key}", inp.where) for x in v]
    if any(x != values[0] for x in values) or values[0] <= 0:
        raise UnsupportedError(f"{inp.where}: DeepSeek-V4 with per-layer or non-positive "
                               f"SwiGLU limits {values}")  # fmt: skip
    return values[0]


def _gguf_config(inp: GGUFInput) -> ModelConfig:
    """llama.cpp's ``deepseek4`` keys, as its converter writes them (conversion/deepseek.py)."""
    a, meta, tensors, base = inp.arch, inp.meta, inp.tensors, inp.base
    n_layers = base["n_layers"]
    ratios = meta.get(f"{a}.attention.compress_ratios", [0] * n_layers)
    ratios = ratios if isinstance(ratios, list) else [ratios] * n_layers
    if len(ratios) != n_layers:
        raise bad(inp.where, f"{a}.attention.compress_ratios", ratios,
                  f"{n_layers} values, one per layer")  # fmt: skip
    compressed = _gguf_compressed(inp, [as_int(r, f"{a}.attention.compress_ratios", inp.where,
                                               lo=0, hi=1 << 20) for r in ratios])  # fmt: skip
    if meta.int(f"{a}.nextn_predict_layers", 0, lo=0):
        raise UnsupportedError(f"{inp.where}: DeepSeek-V4's multi-token-prediction layers are "
                               f"not implemented")  # fmt: skip
    gating = meta.int(f"{a}.expert_gating_func", 4)
    if gating not in _GGUF_GATING:
        raise UnsupportedError(f"{inp.where}: DeepSeek-V4 with expert_gating_func {gating} "
                               f"(4: sqrt-softplus, 2: sigmoid)")  # fmt: skip
    n_shared = meta.int(f"{a}.expert_shared_count", 1, lo=0)
    if n_shared > 1:
        raise UnsupportedError(f"{inp.where}: DeepSeek-V4 with {n_shared} shared experts")
    head_dim = meta.int(f"{a}.attention.key_length")
    if meta.int(f"{a}.attention.value_length", head_dim) != head_dim:
        raise UnsupportedError(f"{inp.where}: key and value head sizes differ")
    n_hash = meta.int(f"{a}.hash_layer_count", 0, lo=0)
    if n_hash > n_layers:
        raise bad(inp.where, f"{a}.hash_layer_count", n_hash, f"at most {n_layers}")
    rope_dim = meta.int(f"{a}.rope.dimension_count")
    moe_ffn = meta.int(f"{a}.expert_feed_forward_length")
    return ModelConfig(
        **{**base, **compressed},
        arch=ARCH,
        head_dim=head_dim,
        intermediate_size=0,
        rotary_dim=rope_dim,
        rope_interleaved=True,
        attention="v4_sliding",
        q_lora_rank=meta.int(f"{a}.attention.q_lora_rank"),
        qk_rope_head_dim=rope_dim,
        attention_sinks=True,
        sliding_window=meta.int(f"{a}.attention.sliding_window"),
        sliding_layers=tuple(True for _ in range(n_layers)),
        o_groups=meta.int(f"{a}.attention.output_group_count"),
        o_lora_rank=meta.int(f"{a}.attention.output_lora_rank"),
        n_experts=meta.int(f"{a}.expert_count"),
        n_experts_per_tok=meta.int(f"{a}.expert_used_count"),
        moe_intermediate_size=moe_ffn,
        shared_expert_intermediate_size=moe_ffn * n_shared,
        shared_expert_gated=False,
        norm_topk_prob=True,  # as on the HF path (the file's expert_weights_norm aside)
        moe_layers=tuple(True for _ in range(n_layers)),
        # The converter writes tid2eid for the first hash_layer_count layers, and drops
        # their gate bias (a hash layer selects by table, never by biased score).
        hash_layers=tuple(i < n_hash for i in range(n_layers)),
        router=_GGUF_GATING[gating],
        routed_scaling_factor=meta.positive(f"{a}.expert_weights_scale", 1.0),
        router_bias=any(n.endswith(".exp_probs_b") for n in tensors),
        activation="swiglu_clamp",
        swiglu_limit=_gguf_clamp(inp, n_layers),
        hc_mult=meta.int(f"{a}.hyper_connection.count"),
        hc_sinkhorn_iters=meta.int(f"{a}.hyper_connection.sinkhorn_iterations"),
        hc_eps=meta.f32(f"{a}.hyper_connection.epsilon"),
    )


def _gguf_compressed(inp: GGUFInput, ratios: list[int]) -> dict[str, Any]:
    """The compressed layers' fields from a ``deepseek4`` file: the converter's
    compress_ratios (0: sliding), CSA where the layer has the indexer's tensors, the
    indexer's keys, compress_rope_freq_base, and the file's RoPE scaling (the compressed
    layers' only, as transformers applies it)."""
    a, meta = inp.arch, inp.meta
    if not any(ratios):
        return {}
    names = set(inp.tensors)
    csa = tuple(any(f"blk.{i}.indexer.proj{x}" in names for x in ("", ".weight"))
                for i in range(len(ratios)))  # fmt: skip
    out: dict[str, Any] = dict(
        compress_ratios=tuple(ratios), csa_layers=csa,
        compress_rope_theta=meta.positive(f"{a}.attention.compress_rope_freq_base", 160000.0),
        compress_rope_scaling=inp.base.get("rope_scaling"), rope_scaling=None,
    )  # fmt: skip
    if any(csa):
        out.update(index_n_heads=meta.int(f"{a}.attention.indexer.head_count"),
                   index_head_dim=meta.int(f"{a}.attention.indexer.key_length"),
                   index_topk=meta.int(f"{a}.attention.indexer.top_k"))  # fmt: skip
    return out


def _gguf_name(arch: str, name: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """llama.cpp's names, canonical once ``.weight`` / ``.bias`` is dropped, but for the
    key-value norm (``attn_kv_a_norm``, as MLA's) and the correction bias."""
    if name.endswith(".exp_probs_b.bias"):
        return name[: -len(".bias")], shape
    cname, shape = plain_gguf_name(arch, name, shape)
    return re.sub(r"^(blk\.\d+\.)attn_kv_a_norm$", r"\1attn_kv_norm", cname), shape


FAMILY = Family(
    name="deepseek_v4",
    archs=(ARCH,),
    attention=("v4_sliding",),
    routers=("sqrt_softplus", "sigmoid_grouped"),
    hf_model_types={"deepseek_v4": ARCH},
    hf_arch_classes={"DeepseekV4ForCausalLM": ARCH},
    hf_names=_NAMES,
    hf_config=_hf_config,
    gguf_architectures=("deepseek4",),
    gguf_config=_gguf_config,
    gguf_name=_gguf_name,
    hf_experts=v4_hash_tables,
    gguf_side_names=re.compile(r"blk\.\d+\.ffn_gate_tid2eid\.weight"),
    gguf_side=v4_gguf_hash_tables,
)
