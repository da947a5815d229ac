"""GLM-4.5 / 4.6 / 4.7 / 4.5-Air: the DeepSeek-V3 MoE block (deepseek_moe.py: sigmoid
routing with a selection bias in expert groups, shared experts, leading dense layers, MTP
layers) with grouped-query attention: partial RoPE, q/k/v biases, an optional per-head
QK-norm. (GLM-4.7-Flash and GLM-5 use MLA: deepseek.py.)

* ``glm4_moe``: Hugging Face ``glm4_moe`` / ``Glm4MoeForCausalLM``; GGUF ``glm4moe``.

* config.json: ``partial_rotary_factor`` (in ``rope_parameters`` or at the top level,
  default 0.5) of ``head_dim`` is rotated, as halves (NEOX); ``use_qk_norm``;
  ``attention_bias``.
* GGUF: ``rope.dimension_count`` is the rotated width; llama.cpp's GLM-4.5 tensor map
  calls the FFN norm ``post_attention_norm``.
"""

from __future__ import annotations

import re

from ...errors import ModelFormatError, UnsupportedError
from ..fields import as_float
from ..manifest import ModelConfig, QkNorm
from .common import DECODER_NAMES
from .deepseek_moe import (
    GGUF_MTP_KEY,
    MOE_NAMES,
    MTP_NAMES,
    ROUTERS,
    gguf_moe,
    gguf_name,
    hf_moe,
    hf_mtp_layers,
)
from .spec import Family, GGUFInput, HFInput

_POST_ATTENTION_NORM = re.compile(r"^(blk\.\d+)\.post_attention_norm$")


def _hf_config(inp: HFInput) -> ModelConfig:
    f, where = inp.fields, inp.fields.where
    out = hf_moe(inp, dense_lead=1, scaling=1.0)
    n_heads = out["n_heads"]
    head_dim = f.int("head_dim", out["hidden_size"] // n_heads, lo=1)
    rope_params = inp.cfg.get("rope_parameters")
    rope_params = rope_params if isinstance(rope_params, dict) else {}
    prf = as_float(rope_params.get("partial_rotary_factor",
                                   inp.cfg.get("partial_rotary_factor", 0.5)),
                   "partial_rotary_factor", where, lo=0.0, lo_open=True)  # fmt: skip
    if prf > 1:
        raise ModelFormatError(f"{where}: partial_rotary_factor {prf} > 1")
    qk: QkNorm = "head" if f.bool("use_qk_norm", False) else "none"
    out.update(
        head_dim=head_dim,
        n_kv_heads=f.int("num_key_value_heads", n_heads, lo=1),
        rotary_dim=int(head_dim * prf),
        qk_norm=qk,
        attention_bias=f.bool("attention_bias", False),
    )
    return ModelConfig(**out)


def _gguf_name(arch: str, name: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    cname, shape = gguf_name(arch, name, shape)
    return _POST_ATTENTION_NORM.sub(r"\1.ffn_norm", cname), shape


def _gguf_config(inp: GGUFInput) -> ModelConfig:
    a, meta = inp.arch, inp.meta
    out = gguf_moe(inp)
    rot = meta.int(f"{a}.rope.dimension_count", lo=0)
    head_dim = meta.int(f"{a}.attention.key_length", out["hidden_size"] // out["n_heads"],
                        lo=0)  # fmt: skip
    if meta.int(f"{a}.attention.value_length", head_dim, lo=0) != head_dim:
        raise UnsupportedError(f"{inp.where}: key and value head sizes differ")
    qk: QkNorm = "head" if "blk.0.attn_q_norm" in inp.tensors else "none"
    out.update(
        arch="glm4_moe", head_dim=head_dim, rotary_dim=rot, qk_norm=qk,
        attention_bias="blk.0.attn_q.bias" in inp.tensors,
    )  # fmt: skip
    return ModelConfig(**out)


FAMILY = Family(
    name="glm",
    archs=("glm4_moe",),
    attention=("gqa",),
    routers=ROUTERS,
    hf_model_types={"glm4_moe": "glm4_moe"},
    hf_arch_classes={"Glm4MoeForCausalLM": "glm4_moe"},
    hf_names=[*DECODER_NAMES, *MOE_NAMES, *MTP_NAMES],
    hf_config=_hf_config,
    hf_mtp_layers=hf_mtp_layers,
    gguf_architectures=("glm4moe",),
    gguf_config=_gguf_config,
    gguf_name=_gguf_name,
    gguf_mtp_key=GGUF_MTP_KEY,
)
