"""DeepSeek-V4 (V4-Flash, V4-Pro): a trunk of hyper-connected layers (the residual is
``hc_mult`` streams mixed by Sinkhorn-Knopp-projected matrices), attention with one shared
key-value head and a grouped output projection, MoE layers routed by sqrt(softplus)
scores, the first of them by a frozen token-id -> experts table (hash layers).

* ``deepseek_v4``: Hugging Face ``deepseek_v4`` / ``DeepseekV4ForCausalLM``. No GGUF.

What runs (colibri's first slice of V4): ``sliding_attention`` layers only: a q-LoRA
query normed per head without weight, one key-value head (K = V), partial interleaved
RoPE on the trailing ``qk_rope_head_dim`` values of each head with the plain "main" RoPE
(``rope_theta``), a learned sink per head, a window of ``sliding_window`` positions, the
rotation undone on the output, ``o_groups`` x ``o_lora_rank`` grouped output projection
(csrc/model/attn_v4.cpp). The compressed layer types (``compressed_sparse_attention``,
``heavily_compressed_attention``: the compressors and the lightning indexer) are refused
with an UnsupportedError naming them, as are the multi-token-prediction layers.

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

from ...errors import ModelFormatError, UnsupportedError
from ..fields import as_float, as_int, bad
from ..hash_tables import v4_hash_tables
from ..manifest import ModelConfig, RouterKind
from .spec import Family, GGUFInput, HFInput, NameRule

ARCH = "deepseek_v4"
SUPPORTED_LAYER_TYPES = ("sliding_attention",)
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
    (re.compile(_L + r"attn\.norm\.weight"), "blk.{0}.attn_kv_norm"),
    (re.compile(_L + r"attn\.wo_a\.weight"), "blk.{0}.attn_output_a"),
    (re.compile(_L + r"attn\.wo_b\.weight"), "blk.{0}.attn_output_b"),
    (re.compile(_L + r"attn\.attn_sink"), "blk.{0}.attn_sinks"),
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
    refused = sorted({t for t in attn if t not in SUPPORTED_LAYER_TYPES})
    if refused:
        raise UnsupportedError(f"{inp.d}: DeepSeek-V4 layer types {', '.join(refused)} are not "
                               f"implemented yet (colibri runs {', '.join(SUPPORTED_LAYER_TYPES)} "
                               f"layers)")  # fmt: skip
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
    hc = as_int(cfg.get("hc_mult", 4), "hc_mult", where, lo=1, hi=64)
    iters = as_int(cfg.get("hc_sinkhorn_iters", 20), "hc_sinkhorn_iters", where, lo=1, hi=1000)
    return ModelConfig(
        **{**inp.base, "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False))
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


def _no_gguf(inp: GGUFInput) -> ModelConfig:
    raise UnsupportedError(f"{inp.where}: DeepSeek-V4 GGUF files are not supported")


FAMILY = Family(
    name="deepseek_v4",
    archs=(ARCH,),
    attention=("v4_sliding",),
    routers=("sqrt_softplus", "sigmoid_grouped"),
    hf_model_types={"deepseek_v4": ARCH},
    hf_arch_classes={"DeepseekV4ForCausalLM": ARCH},
    hf_names=_NAMES,
    hf_config=_hf_config,
    gguf_architectures=(),
    gguf_config=_no_gguf,
    hf_experts=v4_hash_tables,
)
