"""Hugging Face checkpoint directories (config.json + *.safetensors) -> Manifest.

Safetensors headers are parsed by safetensors_files.py (8-byte little-endian length +
JSON, ``data_offsets`` relative to the end of the header); tensor bytes stay on disk and are
described by extents. F32, F16 and BF16 tensors are read as they are. FP8 block-scaled checkpoints
(DeepSeek-V3 / GLM / Qwen3 "-FP8" style: ``F8_E4M3`` weights, each with an F32
``<name>_scale_inv`` of shape ``(ceil(rows / b0), ceil(cols / b1))`` and
``quantization_config = {"quant_method": "fp8", "weight_block_size": [b0, b1]}``) are
read as they are too: ``load_hf`` reports those weights as :class:`Fp8TensorInfo` (dtype
``F8_E4M3``, with their scale tensor and block size); the core runs them directly, the
scale matrix beside the codes (docs/format.md, "FP8 block-scaled weights"), resident and
streamed, and ``colibri convert`` dequantizes them. ``load_hf(d, allow_fp8=False)`` refuses
such a checkpoint for callers that take no FP8 weights. An MLA model's ``kv_b_proj``, split
per head into ``attn_k_b`` / ``attn_v_b``, keeps its FP8 codes; its parts no longer line up
with the 128x128 scale blocks, so they carry ``row_origin`` and Model.load gives them
scales re-blocked per row (``fp8_parts.py``).

What ``save_pretrained`` writes on disk (transformers 5.2x, checked on tiny models):

* Experts are written one tensor per expert with the hub's names even though transformers 5
  fuses them in memory: ``mlp.experts.{e}.{gate,up,down}_proj.weight`` (Qwen2/3-MoE,
  OLMoE) and ``block_sparse_moe.experts.{e}.w1/w2/w3.weight`` (Mixtral; w1 = gate, w2 =
  down, w3 = up). Fused on-disk experts (``mlp.experts.gate_up_proj`` [E, 2*ffn, hidden]
  with gate first, ``mlp.experts.down_proj`` [E, hidden, ffn]) are split into per-expert
  extents as well.
* RoPE settings live in ``rope_parameters`` ({"rope_theta", "rope_type", ...}); older files
  have top-level ``rope_theta`` and ``rope_scaling``. Both are read.
* Qwen3-MoE writes ``num_local_experts`` (older files: ``num_experts``); Qwen2-MoE writes
  ``qkv_bias`` (older files have none: the biases are always there); Mixtral writes
  ``"head_dim": null``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError, UnsupportedError
from . import hf_deepseek
from .fields import as_bool, as_float, as_int, bad
from .manifest import Extent, Manifest, ModelConfig, QkNorm, TensorInfo
from .paths import ModelDir, clip, shown
from .safetensors_files import (
    FLOAT_DTYPES,
    FP8_DTYPE,
    ITEMSIZE,
    read_safetensors_header,
    shard_files,
)
from .validate import (
    SUPPORTED_FAMILIES,
    check_extents,
    check_layer_count,
    file_sizes,
    order_and_check,
    split_rows,
    unsupported_architecture,
)

SCALE_SUFFIX = "_scale_inv"  # <weight name>_scale_inv: the FP8 block scales
_FP8_SCALE_DTYPES = ("F32", "BF16")

# model_type / architectures[0] -> family
_MODEL_TYPES = {
    "llama": "llama",
    "mixtral": "mixtral",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "olmoe": "olmoe",
}
_ARCH_CLASSES = {
    "LlamaForCausalLM": "llama",
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "OlmoeForCausalLM": "olmoe",
}

_L = r"model\.layers\.(\d+)\."
_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"model\.embed_tokens\.weight"), "token_embd"),
    (re.compile(r"model\.norm\.weight"), "output_norm"),
    (re.compile(r"lm_head\.weight"), "output"),
    (re.compile(_L + r"input_layernorm\.weight"), "blk.{0}.attn_norm"),
    (re.compile(_L + r"post_attention_layernorm\.weight"), "blk.{0}.ffn_norm"),
    (re.compile(_L + r"self_attn\.([qkv])_proj\.weight"), "blk.{0}.attn_{1}"),
    (re.compile(_L + r"self_attn\.([qkv])_proj\.bias"), "blk.{0}.attn_{1}.bias"),
    (re.compile(_L + r"self_attn\.o_proj\.weight"), "blk.{0}.attn_output"),
    (re.compile(_L + r"self_attn\.([qk])_norm\.weight"), "blk.{0}.attn_{1}_norm"),
    (re.compile(_L + r"mlp\.(gate|up|down)_proj\.weight"), "blk.{0}.ffn_{1}"),
    (re.compile(_L + r"(?:mlp|block_sparse_moe)\.gate\.weight"), "blk.{0}.ffn_gate_inp"),
    (
        re.compile(_L + r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight"),
        "blk.{0}.ffn_{2}_exps.{1}",
    ),
    (re.compile(_L + r"block_sparse_moe\.experts\.(\d+)\.w1\.weight"), "blk.{0}.ffn_gate_exps.{1}"),
    (re.compile(_L + r"block_sparse_moe\.experts\.(\d+)\.w2\.weight"), "blk.{0}.ffn_down_exps.{1}"),
    (re.compile(_L + r"block_sparse_moe\.experts\.(\d+)\.w3\.weight"), "blk.{0}.ffn_up_exps.{1}"),
    (re.compile(_L + r"mlp\.shared_expert\.(gate|up|down)_proj\.weight"), "blk.{0}.ffn_{1}_shexp"),
    (re.compile(_L + r"mlp\.shared_expert_gate\.weight"), "blk.{0}.ffn_gate_inp_shexp"),
]
_FUSED_GATE_UP = re.compile(_L + r"mlp\.experts\.gate_up_proj(?:\.weight)?")
_FUSED_DOWN = re.compile(_L + r"mlp\.experts\.down_proj(?:\.weight)?")
_IGNORED = re.compile(r".*rotary_emb\.inv_freq")


# --------------------------------------------------------------------------- config


def _family(cfg: Mapping[str, Any], where: Path) -> str:
    mt = cfg.get("model_type", "")
    types = {**_MODEL_TYPES, **hf_deepseek.MODEL_TYPES}
    if isinstance(mt, str) and mt in types:
        return types[mt]
    archs = cfg.get("architectures") or []
    archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    classes = {**_ARCH_CLASSES, **hf_deepseek.ARCH_CLASSES}
    for a in archs:
        if a in classes:
            return classes[a]
    found = (mt if isinstance(mt, str) else "") or ", ".join(archs) or "<none>"
    raise unsupported_architecture(found, where, SUPPORTED_FAMILIES)


class _Fields:
    """Typed reads of config.json keys, named in messages as ``config.json: key``."""

    def __init__(self, cfg: Mapping[str, Any], where: Path) -> None:
        self.cfg = cfg
        self.where = where

    def int(self, key: str, default: int | None = None, *, lo: int = 1) -> int:
        v = self.cfg.get(key)
        if v is None:
            if default is None:
                raise ModelFormatError(f"{self.where}: key {key!r} is missing")
            return default
        return as_int(v, key, self.where, lo=lo, floats=True)

    def bool(self, key: str, default: bool = False) -> bool:
        v = self.cfg.get(key)
        return default if v is None else as_bool(v, key, self.where)


def _rope(cfg: Mapping[str, Any], where: Path) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from transformers 5's ``rope_parameters`` or the older top-level
    ``rope_theta`` + ``rope_scaling``; scaling is None for plain RoPE, else a dict with
    ``rope_type`` (never the old ``type`` key) and the variant's parameters (typed and
    range-checked with the config, :func:`~.validate.check_rope_scaling`)."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise bad(where, "rope_parameters", params, "an object")
    if any(isinstance(v, dict) for v in params.values()):
        raise UnsupportedError(f"{where}: per-layer-type RoPE parameters are not supported")
    theta = as_float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)), "rope_theta",
                     where, lo=0.0, lo_open=True)  # fmt: skip
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "type")}
    scaling["rope_type"] = kind
    if kind in ("llama3", "yarn", "longrope"):
        scaling.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    return theta, scaling


def _unsupported_if(cond: Any, where: Path, what: str) -> None:
    if cond:
        raise UnsupportedError(f"{where}: {what} is not supported")


def _eos_ids(cfg: Mapping[str, Any], root: ModelDir) -> tuple[int, ...]:
    ids: list[int] = []
    sources: list[Any] = [cfg.get("eos_token_id")]
    gen = root.optional("generation_config.json", "generation config")
    if gen is not None:
        try:
            doc = json.loads(gen.read_bytes())
            sources.append(doc.get("eos_token_id") if isinstance(doc, dict) else None)
        except (OSError, ValueError, RecursionError):
            pass
    for v in sources:
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, int) and not isinstance(x, bool) and x >= 0 and x not in ids:
                ids.append(x)
    return tuple(ids)


_HF_LAYER = re.compile(r"^model\.layers\.(\d{1,9})\.")


def hf_config(
    cfg: Mapping[str, Any], d: Path, tensor_names: set[str], root: ModelDir | None = None
) -> ModelConfig:
    """Normalize a config.json (plus what the weights show) into a ModelConfig."""
    fam = _family(cfg, d)
    where = d / "config.json"
    f = _Fields(cfg, where)
    hidden = f.int("hidden_size")
    n_layers = f.int("num_hidden_layers")
    n_heads = f.int("num_attention_heads")
    vocab = f.int("vocab_size")
    # Before anything loops over the layers: the count must be the layers present (the
    # DeepSeek / GLM family's multi-token-prediction layers after them included).
    n_mtp = 0
    if fam in hf_deepseek.FAMILIES:
        n_mtp = hf_deepseek.mtp_layer_count(cfg, n_layers, tensor_names, d)
    check_layer_count(n_layers + n_mtp, tensor_names, "num_hidden_layers", where, _HF_LAYER)
    n_kv = f.int("num_key_value_heads", n_heads)
    head_dim = f.int("head_dim", hidden // n_heads)
    if fam in hf_deepseek.FAMILIES:
        theta, scaling = _rope(cfg, where)
        bos = cfg.get("bos_token_id")
        eps = cfg.get("rms_norm_eps")
        base: dict[str, Any] = dict(
            vocab_size=vocab, hidden_size=hidden, n_layers=n_layers, n_heads=n_heads,
            n_kv_heads=n_kv, head_dim=head_dim,
            rms_norm_eps=1e-6 if eps is None else as_float(eps, "rms_norm_eps", where, lo=0.0),
            rope_theta=theta, max_position_embeddings=f.int("max_position_embeddings", 0, lo=0),
            tie_word_embeddings=cfg.get("tie_word_embeddings") is True
            or "lm_head.weight" not in tensor_names,
            rope_scaling=scaling,
            bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) and bos >= 0
            else None,
            eos_token_ids=_eos_ids(cfg, root or ModelDir(d)),
        )  # fmt: skip
        return hf_deepseek.family_config(fam, cfg, d, tensor_names, base)
    _unsupported_if(
        cfg.get("hidden_act", "silu") != "silu", d, f"hidden_act {shown(cfg.get('hidden_act'))}"
    )
    _unsupported_if(cfg.get("mlp_bias"), d, "mlp_bias")
    _unsupported_if(cfg.get("clip_qkv") is not None, d, "clip_qkv (OLMoE activation clipping)")
    _unsupported_if(cfg.get("use_sliding_window"), d, "sliding-window attention")
    _unsupported_if(fam == "mixtral" and cfg.get("sliding_window"), d, "sliding-window attention")
    _unsupported_if(
        fam != "qwen2_moe" and cfg.get("attention_bias"),
        d,
        "attention_bias on this architecture (it adds an output-projection bias)",
    )
    theta, scaling = _rope(cfg, where)

    qk: QkNorm = {"qwen3_moe": "head", "olmoe": "full"}.get(fam, "none")  # type: ignore[assignment]
    moe_ffn = shared = 0
    n_exp = top_k = 0
    norm_topk = False
    dense = f.int("intermediate_size", 0, lo=0)
    if fam == "llama":
        moe_layers = tuple(False for _ in range(n_layers))
    else:
        n_exp = as_int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0,
                       "num_experts", where, lo=0, floats=True)  # fmt: skip
        top_k = f.int("num_experts_per_tok", 0, lo=0)
        if n_exp <= 0 or top_k <= 0:
            raise ModelFormatError(f"{where}: a {fam} model needs experts and top-k > 0")
        if fam in ("qwen2_moe", "qwen3_moe"):
            moe_ffn = f.int("moe_intermediate_size")
            step = f.int("decoder_sparse_step", 1)
            only_raw = cfg.get("mlp_only_layers") or []
            if not isinstance(only_raw, list):
                raise bad(where, "mlp_only_layers", only_raw, "a list of layer indices")
            only = {as_int(i, "mlp_only_layers", where) for i in only_raw}
            moe_layers = tuple(i not in only and (i + 1) % step == 0 for i in range(n_layers))
            norm_topk = f.bool("norm_topk_prob")
        else:  # mixtral, olmoe: intermediate_size is the expert width, every layer is MoE
            moe_ffn, dense = dense, 0
            moe_layers = tuple(True for _ in range(n_layers))
            norm_topk = True if fam == "mixtral" else f.bool("norm_topk_prob")
        if fam == "qwen2_moe":
            shared = f.int("shared_expert_intermediate_size", 0, lo=0)
        if all(moe_layers):
            dense = 0
    tied = f.bool("tie_word_embeddings") or "lm_head.weight" not in tensor_names
    bias = fam == "qwen2_moe" and "model.layers.0.self_attn.q_proj.bias" in tensor_names
    bos = cfg.get("bos_token_id")
    eps = cfg.get("rms_norm_eps")
    return ModelConfig(
        arch=fam,
        vocab_size=vocab,
        hidden_size=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        intermediate_size=dense,
        rms_norm_eps=1e-6 if eps is None else as_float(eps, "rms_norm_eps", where, lo=0.0),
        rope_theta=theta,
        max_position_embeddings=f.int("max_position_embeddings", 0, lo=0),
        tie_word_embeddings=tied,
        rope_scaling=scaling,
        qk_norm=qk,
        attention_bias=bias,
        n_experts=n_exp,
        n_experts_per_tok=top_k,
        moe_intermediate_size=moe_ffn,
        norm_topk_prob=norm_topk,
        shared_expert_intermediate_size=shared,
        moe_layers=moe_layers,
        bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) and bos >= 0
        else None,
        eos_token_ids=_eos_ids(cfg, root or ModelDir(d)),
    )


# --------------------------------------------------------------------------- tensors


def _canonical(name: str) -> str | None:
    for pat, fmt in (*_RULES, *hf_deepseek.RULES):
        m = pat.fullmatch(name)
        if m:
            return fmt.format(*m.groups())
    return None


def _info(
    name: str, dtype: str, shape: tuple[int, ...], ext: Extent, where: Path, src: str = ""
) -> TensorInfo:
    if dtype == FP8_DTYPE:
        raise UnsupportedError(
            f"{where}: tensor {shown(src or name)} is {FP8_DTYPE} but config.json has no "
            f"quantization_config with quant_method 'fp8' and a weight_block_size; colibri "
            f"reads only block-scaled FP8 checkpoints (DeepSeek-V3 style), through "
            f"'colibri convert'."
        )
    if dtype not in FLOAT_DTYPES:
        raise UnsupportedError(
            f"{where}: tensor {shown(src or name)} has dtype {clip(dtype)}; colibri reads F32, "
            f"F16 and BF16 "
            f"safetensors (quantized checkpoints: use a GGUF)."
        )
    return TensorInfo(name, dtype, shape, (ext,))


# --------------------------------------------------------------------------- FP8


@dataclass(frozen=True, kw_only=True)
class Fp8TensorInfo(TensorInfo):
    """An FP8 block-scaled weight: ``dtype`` is ``F8_E4M3`` (one byte per element; the core
    runs it with its scales, ``colibri convert`` dequantizes it) and element ``[i, j]`` is
    ``e4m3(byte) * scale[i // block[0], j // block[1]]`` in float32."""

    scale: TensorInfo  # <name>_scale_inv: F32 or BF16, (ceil(rows / b0), ceil(cols / b1))
    block: tuple[int, int]  # quantization_config.weight_block_size: (b0 rows, b1 columns)
    # A tensor cut from row ranges of a larger FP8 weight (MLA's kv_b_proj parts): the
    # source row of each extent's first row, for the scale lookup; () when the rows are
    # the weight's own.
    row_origin: tuple[int, ...] = ()


def fp8_block_size(cfg: Mapping[str, Any], where: Path) -> tuple[int, int] | None:
    """``quantization_config.weight_block_size`` of an FP8 checkpoint (None when
    config.json declares no FP8 quantization)."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict) or q.get("quant_method") != "fp8":
        return None
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise UnsupportedError(f"{where}: FP8 format {shown(fmt)} is not supported (only e4m3)")
    bs = q.get("weight_block_size")
    if bs is None:
        raise UnsupportedError(
            f"{where}: FP8 without weight_block_size (one scale per tensor) is not supported; "
            f"colibri converts block-scaled FP8 checkpoints (DeepSeek-V3 style)."
        )
    if (
        not isinstance(bs, list) or len(bs) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in bs)
    ):
        raise ModelFormatError(
            f"{where}: quantization_config.weight_block_size must be two positive integers, "
            f"not {shown(bs)}"
        )
    return int(bs[0]), int(bs[1])


def _fp8_refusal(d: Path, block: tuple[int, int]) -> UnsupportedError:
    return UnsupportedError(
        f"{d} is an FP8 block-scaled checkpoint (quantization_config: fp8, "
        f"weight_block_size {list(block)}), and this reader takes no FP8 weights. Load it "
        f"with colibri.Model.load (FP8 runs directly), or convert it first, e.g. 'colibri "
        f"convert {d} OUT.colibri --quant bf16' (or f32, f16, q8_0, q4_0, q4_1)."
    )


def _fp8_info(
    cname: str,
    name: str,
    shape: tuple[int, ...],
    ext: Extent,
    found: Mapping[str, tuple[str, tuple[int, ...], Extent]],
    block: tuple[int, int],
    where: Path,
) -> Fp8TensorInfo:
    if len(shape) != 2:
        raise UnsupportedError(
            f"{where}: FP8 tensor {shown(name)} has shape {shape}; only 2-D block-scaled weights "
            f"are supported (fused expert stacks in FP8 are not)."
        )
    sname = name + SCALE_SUFFIX
    if sname not in found:
        raise ModelFormatError(
            f"{where}: FP8 tensor {shown(name)} has no {shown(sname)} (its block scales); the "
            f"checkpoint is incomplete."
        )
    sdtype, sshape, sext = found[sname]
    rows, cols = shape
    want = (-(-rows // block[0]), -(-cols // block[1]))
    if sdtype not in _FP8_SCALE_DTYPES:
        raise UnsupportedError(
            f"{where}: FP8 scale {shown(sname)} has dtype {clip(sdtype)} (F32 expected)"
        )
    if tuple(sshape) != want:
        raise ModelFormatError(
            f"{where}: FP8 scale {shown(sname)} has shape {tuple(sshape)}, but a {rows}x{cols} "
            f"weight in {block[0]}x{block[1]} blocks needs {want}."
        )
    scale = TensorInfo(sname, sdtype, want, (sext,))
    return Fp8TensorInfo(cname, FP8_DTYPE, shape, (ext,), scale=scale, block=block)


def _check_fp8_extents(
    tensors: Mapping[str, TensorInfo], files: list[Path], sizes: list[int]
) -> None:
    """check_extents for a manifest holding FP8 weights (which it cannot size): the
    others and the scales through it, then no two extents of any kind overlap."""
    plain: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, int, str]] = []
    for t in tensors.values():
        if isinstance(t, Fp8TensorInfo):
            plain[t.scale.name] = t.scale
            if t.nbytes != t.shape[0] * t.shape[1]:
                raise ModelFormatError(f"tensor {shown(t.name)}: {t.nbytes} bytes for {t.shape}")
            spans += [(e.file, e.offset, e.offset + e.length, t.name) for e in t.extents]
        else:
            plain[t.name] = t
    check_extents(plain, files, sizes)
    for s in plain.values():
        spans += [(e.file, e.offset, e.offset + e.length, s.name) for e in s.extents]
    spans.sort()
    for (fa, a0, a1, an), (fb, b0, _b1, bn) in itertools.pairwise(spans):
        if fa == fb and b0 < a1 and a0 != a1:
            raise ModelFormatError(
                f"{files[fa]}: tensors {shown(an)} and {shown(bn)} overlap (bytes {b0}..{a1}). "
                f"The file's header is corrupt."
            )


def _split_fused(
    layer: str, kind: str, dtype: str, shape: tuple[int, ...], ext: Extent, where: Path
) -> list[TensorInfo]:
    if len(shape) != 3:
        raise ModelFormatError(f"{where}: fused expert tensor of layer {layer} has shape {shape}")
    n_e, rows, cols = shape
    if min(shape) <= 0:
        raise ModelFormatError(f"{where}: fused expert tensor of layer {layer} has shape {shape}")
    each = ext.length // n_e
    out: list[TensorInfo] = []
    for e, sub in enumerate(split_rows(ext, n_e, each)):
        if kind == "down":
            out.append(_info(f"blk.{layer}.ffn_down_exps.{e}", dtype, (rows, cols), sub, where))
            continue
        if rows % 2:
            raise ModelFormatError(
                f"{where}: fused gate_up_proj of layer {layer} has odd rows {rows}"
            )
        half = each // 2
        for j, part in enumerate(("gate", "up")):
            piece = Extent(sub.file, sub.offset + j * half, half)
            out.append(
                _info(f"blk.{layer}.ffn_{part}_exps.{e}", dtype, (rows // 2, cols), piece, where)
            )
    return out


def _kv_b_parts(
    layer: str, dtype: str, shape: tuple[int, ...], ext: Extent, cfg: ModelConfig,
    found: Mapping[str, tuple[str, tuple[int, ...], Extent]], block: tuple[int, int] | None,
    where: Path,
) -> dict[str, TensorInfo]:
    """MLA's kv_b_proj as attn_k_b (each head's block transposed at load) and attn_v_b."""
    fp8 = dtype == FP8_DTYPE and block is not None
    if not fp8:
        _info(f"blk.{layer}.attn_kv_b", dtype, shape, ext, where)  # refuses what it cannot read
    parts = hf_deepseek.split_kv_b(layer, dtype, shape, ext, cfg, ITEMSIZE[dtype], where)
    out: dict[str, TensorInfo] = {}
    for (name, pshape, exts, rows), heads in zip(parts, (cfg.n_heads, 0), strict=True):
        if fp8 and block is not None:
            src = f"model.layers.{layer}.self_attn.kv_b_proj.weight"
            whole = _fp8_info(name, src, shape, ext, found, block, where)
            out[name] = Fp8TensorInfo(name, FP8_DTYPE, pshape, exts, transpose_heads=heads,
                                      scale=whole.scale, block=block, row_origin=rows)  # fmt: skip
        else:
            out[name] = TensorInfo(name, dtype, pshape, exts, transpose_heads=heads)
    return out


def load_hf(path: str | os.PathLike[str], *, allow_fp8: bool = True) -> Manifest:
    """Read config.json and the safetensors headers of a checkpoint directory.

    The FP8 weights of a block-scaled checkpoint appear as :class:`Fp8TensorInfo` (the core
    runs them directly, with their scale matrix; ``colibri convert`` dequantizes them). A
    caller that cannot handle them passes ``allow_fp8=False`` to get UnsupportedError.
    """
    d = Path(path)
    root = ModelDir(d)
    cfg_path = d / "config.json"
    cfg_file = root.file("config.json", "config", d)
    try:
        raw_cfg = json.loads(cfg_file.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelFormatError(f"{cfg_path}: cannot read config.json ({shown(exc)})") from exc
    if not isinstance(raw_cfg, dict):
        raise ModelFormatError(f"{cfg_path}: config.json is not a JSON object")
    _family(raw_cfg, d)  # unsupported architectures fail before any weight is looked at
    block = fp8_block_size(raw_cfg, cfg_path)
    if block is not None and not allow_fp8:
        raise _fp8_refusal(d, block)
    files = shard_files(d, root)
    sizes = file_sizes(files)
    found: dict[str, tuple[str, tuple[int, ...], Extent]] = {}
    for fi, f in enumerate(files):
        for name, (dtype, shape, off, length) in read_safetensors_header(f).items():
            if name in found:
                raise ModelFormatError(f"{d}: tensor {shown(name)} appears in more than one shard")
            found[name] = (dtype, shape, Extent(fi, off, length))
    cfg = hf_config(raw_cfg, d, set(found), root)

    tensors: dict[str, TensorInfo] = {}
    for name, (dtype, shape, ext) in found.items():
        where = files[ext.file]
        if _IGNORED.fullmatch(name):
            continue
        base = name[: -len(SCALE_SUFFIX)] if name.endswith(SCALE_SUFFIX) else ""
        if base in found and found[base][0] == FP8_DTYPE:
            continue  # the block scales of an FP8 weight, read with it
        if dtype == FP8_DTYPE and (_FUSED_GATE_UP.fullmatch(name) or _FUSED_DOWN.fullmatch(name)):
            raise UnsupportedError(
                f"{where}: fused FP8 expert stack {shown(name)} is not supported"
            )
        if m := _FUSED_GATE_UP.fullmatch(name):
            for t in _split_fused(m.group(1), "gate_up", dtype, shape, ext, where):
                tensors[t.name] = t
            continue
        if m := _FUSED_DOWN.fullmatch(name):
            for t in _split_fused(m.group(1), "down", dtype, shape, ext, where):
                tensors[t.name] = t
            continue
        if cfg.is_mla and (m := hf_deepseek.KV_B.fullmatch(name)):
            tensors.update(_kv_b_parts(m.group(1), dtype, shape, ext, cfg, found, block, where))
            continue
        cname = _canonical(name)
        if cname is None:
            raise UnsupportedError(
                f"{where}: tensor {shown(name)} is not part of a {cfg.arch} model colibri knows "
                f"how "
                f"to run; refusing to ignore it."
            )
        if cname == "output" and cfg.tie_word_embeddings:
            continue  # transformers ties lm_head to the embeddings and ignores this copy
        if dtype == FP8_DTYPE and block is not None:
            tensors[cname] = _fp8_info(cname, name, shape, ext, found, block, where)
            continue
        tensors[cname] = _info(cname, dtype, shape, ext, where, name)
    ordered = order_and_check(tensors, cfg, d)
    if block is not None:
        _check_fp8_extents(ordered, files, sizes)
    else:
        check_extents(ordered, files, sizes)
    return Manifest(
        source="hf",
        path=d,
        files=tuple(files),  # resolved, inside the directory (ModelDir)
        config=cfg,
        tensors=ordered,
        metadata=raw_cfg,
    )
