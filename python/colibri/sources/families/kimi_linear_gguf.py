"""Kimi-Linear as llama.cpp's converter writes it (general.architecture ``kimi-linear``;
conversion/kimi_linear.py), mapped to the tensors and ModelConfig the Hugging Face path
gives (kimi_linear.py), every transformation the converter applies undone or told to the
core:

* ``A_log`` is stored as ``ssm_a`` = -exp(A_log) (shape (1, 1, heads, 1)): the config's
  ``linear_a_neg_exp`` has the core use it as is (exact; a log here would round).
* The short convolutions ``q/k/v_conv1d`` (C, 1, K) are stored as ``ssm_conv1d_q/k/v``
  reshaped to (1, C, 1, K): the same bytes, read (q, k then v) as one ``kda_conv`` vector
  through extents. ``dt_bias`` is ``ssm_dt.bias``; ``f_a/f_b/g_a/g_b_proj`` are
  ``ssm_f_a/f_b/g_a/g_b``, ``b_proj`` ``ssm_beta``, ``o_norm`` ``ssm_norm`` (stored as
  is: Kimi's norms have no 1 + w offset); q/k/v/o_proj keep the attention names.
* MLA layers: ``kv_b_proj`` split per head into ``attn_k_b`` (transposed) and
  ``attn_v_b``, as for DeepSeek's files (deepseek.py), which is how colibri reads it too.
  ``attention.head_count_kv`` is per layer: 0 for the KDA layers, 1 for the MLA layers
  (llama.cpp runs MLA as one shared latent head); the query heads are
  ``attention.head_count``. ``key_length_mla`` is nope + rope, ``rope.dimension_count`` the
  rope part (no RoPE is applied: ``mla_no_rope``).
* The converter writes no KDA head count (llama.cpp takes ``attention.head_count``, as
  the released model has as many KDA as MLA heads): it is ``ssm_a``'s size; the head
  size is ``kda.head_dim``, the kernel ``ssm.conv_kernel``; a layer is KDA
  where head_count_kv is 0 (as llama.cpp reads it).
* MoE: the converter writes no gating function (sigmoid is Kimi-Linear's), no
  renormalization flag (llama.cpp's kimi-linear graph hard-codes it) and no expert group
  count: ``expert_group_count`` is read when present, else one group. A checkpoint with
  several groups (``num_expert_group`` > 1, ``topk_group`` < it) therefore does not
  survive conversion; the released one has one.
"""

from __future__ import annotations

import re
from pathlib import Path

from ...errors import ModelFormatError
from ..manifest import ModelConfig, TensorInfo
from ..paths import shown
from .deepseek import MLA_NORM_EPS
from .deepseek import _gguf_name as deepseek_gguf_name
from .deepseek_moe import gguf_moe
from .spec import GGUFInput

GGUF_ARCHS = ("kimi-linear",)
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
# llama.cpp's name in a KDA layer -> the canonical one (the core's, linear_attn_kda.cpp).
_KDA = {
    "ssm_f_a": "kda_f_a", "ssm_f_b": "kda_f_b", "ssm_g_a": "kda_g_a", "ssm_g_b": "kda_g_b",
    "ssm_beta": "kda_b", "ssm_norm": "kda_norm", "ssm_dt.bias": "kda_dt_bias",
}  # fmt: skip
_CONVS = ("ssm_conv1d_q", "ssm_conv1d_k", "ssm_conv1d_v")


def gguf_name(arch: str, name: str, shape: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
    """DeepSeek's names (MLA's 3-D attn_k_b / attn_v_b as matrices, the selection bias);
    the KDA tensors are mapped with the config (:func:`gguf_tensors`)."""
    return deepseek_gguf_name(arch, name, shape)


def gguf_config(inp: GGUFInput) -> ModelConfig:
    a, meta, where = inp.arch, inp.meta, inp.where
    out = gguf_moe(inp)
    n_layers = out["n_layers"]
    rot = meta.int(f"{a}.rope.dimension_count", lo=0)
    qk_dim = meta.int(f"{a}.attention.key_length_mla", lo=1)
    if qk_dim <= rot:
        raise ModelFormatError(f"{where}: {a}.attention.key_length_mla {qk_dim} leaves no "
                               f"non-rope part beside rope.dimension_count {rot}")  # fmt: skip
    hd = meta.int(f"{a}.kda.head_dim", lo=1)
    linear = _schedule(inp, n_layers)
    nh = _kda_heads(inp, linear)
    out.update(
        arch="kimi_linear",
        n_kv_heads=out["n_heads"],  # MLA: head_count_kv 1 is llama.cpp's latent head
        head_dim=qk_dim,
        norm_topk_prob=True,  # llama.cpp's kimi-linear graph hard-codes it
        attention="mla",
        rotary_dim=rot,
        attention_scale=float(qk_dim**-0.5),
        q_lora_rank=meta.int(f"{a}.attention.q_lora_rank", 0, lo=0),
        kv_lora_rank=meta.int(f"{a}.attention.kv_lora_rank", lo=1),
        qk_nope_head_dim=qk_dim - rot,
        qk_rope_head_dim=rot,
        v_head_dim=meta.int(f"{a}.attention.value_length_mla", lo=1),
        mla_norm_eps=MLA_NORM_EPS,
        mla_no_rope=True,
        linear_layers=linear,
        linear_num_key_heads=nh,
        linear_num_value_heads=nh,
        linear_key_head_dim=hd,
        linear_value_head_dim=hd,
        linear_conv_kernel=meta.int(f"{a}.ssm.conv_kernel", lo=1),
        linear_kda=True,
        linear_a_neg_exp=True,
    )
    return ModelConfig(**out)


def _schedule(inp: GGUFInput, n_layers: int) -> tuple[bool, ...]:
    """KDA where ``attention.head_count_kv`` is 0, as llama.cpp reads it."""
    raw = inp.meta.md.get(f"{inp.arch}.attention.head_count_kv")
    if not isinstance(raw, list) or len(raw) != n_layers or any(
        not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in raw
    ):  # fmt: skip
        raise ModelFormatError(f"{inp.where}: {inp.arch}.attention.head_count_kv must list "
                               f"{n_layers} head counts, 0 for the KDA layers")  # fmt: skip
    return tuple(v == 0 for v in raw)


def _kda_heads(inp: GGUFInput, linear: tuple[bool, ...]) -> int:
    """The KDA head count: the first KDA layer's ``ssm_a`` size (llama.cpp takes
    attention.head_count, which the released model's KDA layers share with its MLA ones)."""
    first = next((i for i, lin in enumerate(linear) if lin), None)
    if first is None:
        return int(inp.base["n_heads"])
    a = inp.tensors.get(f"blk.{first}.ssm_a")
    if a is None:
        raise ModelFormatError(f"{inp.where}: tensor {shown(f'blk.{first}.ssm_a')} of Kimi "
                               f"Delta Attention layer {first} is missing")  # fmt: skip
    n = 1
    for s in a.shape:
        n *= s
    return n


def gguf_tensors(
    tensors: dict[str, TensorInfo], cfg: ModelConfig, where: Path
) -> dict[str, TensorInfo]:
    """The KDA layers' tensors named as the core reads them: ``ssm_a`` as a vector, the
    three convolutions as one ``kda_conv`` vector (extents, no copy)."""
    out: dict[str, TensorInfo] = {}
    k = cfg.linear_conv_kernel
    for name, t in tensors.items():
        m = _LAYER.match(name)
        if m is None or not cfg.is_linear(int(m.group(1))):
            out[name] = t
            continue
        b, part = f"blk.{m.group(1)}.", m.group(2)
        if part in _KDA:
            out[b + _KDA[part]] = TensorInfo(b + _KDA[part], t.dtype, t.shape, t.extents)
        elif part == "ssm_a":
            n = 1
            for s in t.shape:
                n *= s
            out[b + "kda_a_log"] = TensorInfo(b + "kda_a_log", t.dtype, (n,), t.extents)
        elif part not in _CONVS:
            out[name] = t
    for i in range(cfg.n_layers):
        if not cfg.is_linear(i):
            continue
        b = f"blk.{i}."
        for part, canon in (*_KDA.items(), ("ssm_a", "kda_a_log")):
            if b + canon not in out:
                raise ModelFormatError(f"{where}: tensor {shown(b + part)} of Kimi Delta "
                                       f"Attention layer {i} is missing")  # fmt: skip
        convs: list[TensorInfo] = []
        for part in _CONVS:
            c = tensors.get(b + part)
            if c is None:
                raise ModelFormatError(f"{where}: tensor {shown(b + part)} of Kimi Delta "
                                       f"Attention layer {i} is missing")  # fmt: skip
            if len(c.shape) != 4 or c.shape[0] != 1 or c.shape[2] != 1 or c.shape[3] != k:
                raise ModelFormatError(f"{where}: tensor {shown(b + part + '.weight')} has "
                                       f"shape {c.shape}, not (1, channels, 1, {k})")  # fmt: skip
            convs.append(c)
        if len({t.dtype for t in convs}) != 1:
            raise ModelFormatError(f"{where}: layer {i}'s short convolutions differ in type")
        n = sum(t.shape[1] * k for t in convs)
        exts = tuple(e for t in convs for e in t.extents)
        out[b + "kda_conv"] = TensorInfo(b + "kda_conv", convs[0].dtype, (n,), exts)
    return out
