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
  OLMoE) and ``block_sparse_moe.experts.{e}.w1/w2/w3.weight`` (Mixtral). Fused on-disk
  experts (``mlp.experts.gate_up_proj`` [E, 2*ffn, hidden] with gate first,
  ``mlp.experts.down_proj`` [E, hidden, ffn]) are split into per-expert extents as well.

config.json becomes a ModelConfig in hf_config.py; each family module (families/) names
its tensors (``Family.hf_names``).
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
from .families import Family, hf_family
from .hf_config import hf_config
from .manifest import Extent, Manifest, ModelConfig, TensorInfo
from .paths import ModelDir, clip, shown
from .safetensors_files import (
    FLOAT_DTYPES,
    FP8_DTYPE,
    ITEMSIZE,
    read_safetensors_header,
    shard_files,
)
from .units import split_kv_b
from .validate import check_extents, file_sizes, order_and_check, split_rows

SCALE_SUFFIX = "_scale_inv"  # <weight name>_scale_inv: the FP8 block scales
_FP8_SCALE_DTYPES = ("F32", "BF16")

_L = r"model\.layers\.(\d+)\."
_FUSED_GATE_UP = re.compile(_L + r"mlp\.experts\.gate_up_proj(?:\.weight)?")
_FUSED_DOWN = re.compile(_L + r"mlp\.experts\.down_proj(?:\.weight)?")
_IGNORED = re.compile(r".*rotary_emb\.inv_freq")


# --------------------------------------------------------------------------- tensors


def _canonical(fam: Family, name: str) -> str | None:
    for pat, fmt in fam.hf_names:
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
    parts = split_kv_b(layer, dtype, shape, ext, cfg, ITEMSIZE[dtype], where)
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
    fam, _arch = hf_family(raw_cfg, d)  # unsupported ones fail before any weight is read
    block = fp8_block_size(raw_cfg, cfg_path)
    if block is not None and not allow_fp8:
        raise _fp8_refusal(d, block)
    files = shard_files(d, root)
    found: dict[str, tuple[str, tuple[int, ...], Extent]] = {}
    for fi, f in enumerate(files):
        for name, (dtype, shape, off, length) in read_safetensors_header(f).items():
            if name in found:
                raise ModelFormatError(f"{d}: tensor {shown(name)} appears in more than one shard")
            found[name] = (dtype, shape, Extent(fi, off, length))
    if fam.hf_rename is not None:  # a multimodal checkpoint: its text model's tensors
        found = {new: v for name, v in found.items() if (new := fam.hf_rename(name)) is not None}
    cfg = hf_config(raw_cfg, d, set(found), root)

    tensors: dict[str, TensorInfo] = {}
    consumed: frozenset[str] = frozenset()
    if fam.hf_experts is not None:  # experts re-laid out into a side file (gpt-oss)
        side_tensors, consumed, side = fam.hf_experts(found, files, cfg, d)
        tensors.update(side_tensors)
        if side is not None:
            files.append(side)
    sizes = file_sizes(files)
    for name, (dtype, shape, ext) in found.items():
        where = files[ext.file]
        if _IGNORED.fullmatch(name) or name in consumed:
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
        if cfg.is_mla and fam.hf_kv_b and (m := fam.hf_kv_b.fullmatch(name)):
            tensors.update(_kv_b_parts(m.group(1), dtype, shape, ext, cfg, found, block, where))
            continue
        cname = _canonical(fam, name)
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
