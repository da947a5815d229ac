"""gpt-oss's fused float experts, re-laid out for the engine once, into a side file.

A gpt-oss Hugging Face float checkpoint (transformers' ``GptOssExperts``, as
``save_pretrained`` writes it) keeps each layer's experts as four tensors::

    mlp.experts.gate_up_proj       [E, hidden, 2 * ffn]   x @ W: transposed, and gate and
                                                          up interleaved (gate = [..., ::2])
    mlp.experts.gate_up_proj_bias  [E, 2 * ffn]           interleaved the same way
    mlp.experts.down_proj          [E, ffn, hidden]       transposed
    mlp.experts.down_proj_bias     [E, hidden]

The engine streams each expert's ``gate`` / ``up`` [ffn, hidden] and ``down``
[hidden, ffn] (rows = outputs) straight from byte extents into its cache slots, and no
run of bytes in the stored layout is one of those rows: a transposition cannot be
expressed as extents. So the experts are re-laid out, exactly (a permutation of the
stored elements, in their own dtype), into a side file the manifest then points at:
per layer, per expert, gate, up and down contiguous (one read per expert), then every
layer's biases de-interleaved and widened to F32 (the core keeps them resident).

Cost: one pass over the expert bytes on the first load, and a side file as large as the
experts (BF16 gpt-oss-20b: about 38 GB; -120b: about 230 GB), kept in
``$XDG_CACHE_HOME/colibri/relayout`` (else ``~/.cache/colibri/relayout``) and reused while
the shards keep their size and modification time.

The MXFP4 checkpoints as released store the matrices as ``gate_up_proj_blocks``
[E, 2 * ffn, hidden / 32, 16] and ``gate_up_proj_scales`` [E, 2 * ffn, hidden / 32] (rows
are outputs here, gate and up rows interleaved) and ``down_proj_blocks`` / ``_scales``
[E, hidden, ffn / 32, (16)]. Their codes and exponents are GGUF MXFP4 blocks in another
order (sources/mxfp4_hf.py), so the side file holds each expert's gate, up and down rows as
GGUF MXFP4 (17 bytes per 32 weights, every code and exponent kept), which the core runs;
the side file is then as large as the MXFP4 experts (gpt-oss-20b about 10 GB, -120b about
61 GB).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ModelFormatError, ModelIOError, UnsupportedError
from .manifest import Extent, ModelConfig, TensorInfo
from .mxfp4_hf import BLOCK, GGUF_BLOCK_BYTES, check_mxfp4_shapes, relayout_mxfp4
from .paths import shown

FORMAT_VERSION = 1
Found = Mapping[str, tuple[str, tuple[int, ...], Extent]]
_FUSED = re.compile(
    r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?"
)
_MXFP4 = re.compile(r"model\.layers\.\d+\.mlp\.experts\.\w+_(blocks|scales)")
_ITEM = {"F32": 4, "BF16": 2, "F16": 2}
# How the elements are moved: F32 as floats, BF16 / F16 as their 16 bits (exact either way).
_MOVE: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"), "BF16": np.dtype("<u2"), "F16": np.dtype("<u2"), "U8": np.dtype("u1"),
}


def relayout_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "colibri" / "relayout"


def _read(
    files: Sequence[Path], dtype: str, shape: tuple[int, ...], ext: Extent
) -> npt.NDArray[Any]:
    """The stored elements (F32 as float32; BF16 / F16 as their uint16 bits), memory-mapped."""
    return np.memmap(files[ext.file], dtype=_MOVE[dtype], mode="r", offset=ext.offset,
                     shape=shape)  # fmt: skip


def _widen(x: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.float32]:
    if dtype == "F32":
        return np.asarray(x, dtype=np.float32)
    if dtype == "F16":
        return np.asarray(x).view(np.float16).astype(np.float32)
    return (np.asarray(x).astype(np.uint32) << 16).view(np.float32)  # BF16: the high half


def _layer_tensors(
    found: Found, cfg: ModelConfig, layer: int, mxfp4: bool, where: Path
) -> dict[str, tuple[str, tuple[int, ...], Extent]]:
    e, h, f = cfg.n_experts, cfg.hidden_size, cfg.moe_intermediate_size
    want: dict[str, tuple[int, ...]] = {"gate_up_proj_bias": (e, 2 * f), "down_proj_bias": (e, h)}
    if mxfp4:
        if h % BLOCK or f % BLOCK:
            raise ModelFormatError(f"{where}: MXFP4 experts need hidden ({h}) and ffn ({f}) "
                                   f"widths that are multiples of {BLOCK}")  # fmt: skip
        want |= {"gate_up_proj_blocks": (e, 2 * f, h // BLOCK, BLOCK // 2),
                 "gate_up_proj_scales": (e, 2 * f, h // BLOCK),
                 "down_proj_blocks": (e, h, f // BLOCK, BLOCK // 2),
                 "down_proj_scales": (e, h, f // BLOCK)}  # fmt: skip
    else:
        want |= {"gate_up_proj": (e, h, 2 * f), "down_proj": (e, f, h)}
    out = {}
    for part, shape in want.items():
        name = f"model.layers.{layer}.mlp.experts.{part}"
        if name not in found:
            raise ModelFormatError(f"{where}: tensor {shown(name)} is missing; a gpt-oss "
                                   f"checkpoint stores every layer's experts fused")  # fmt: skip
        dtype, got, ext = found[name]
        if part.endswith("_scales"):  # its blocks, checked just before, must match it
            base = name[: -len("_scales")]
            check_mxfp4_shapes(base, tuple(found[base + "_blocks"][1]), tuple(got))
        if part.endswith(("_blocks", "_scales")):
            ok_dtype, item = dtype == "U8", 1
        else:
            ok_dtype, item = dtype in _ITEM, _ITEM.get(dtype, 0)
        if tuple(got) != shape:
            raise ModelFormatError(
                f"{where}: tensor {shown(name)} has shape {tuple(got)}, but the config implies "
                f"{shape}. The config does not match the weights."
            )
        if not ok_dtype:
            raise UnsupportedError(f"{where}: tensor {shown(name)} has dtype {shown(dtype)}; "
                                   f"gpt-oss experts are read from F32, F16, BF16 or MXFP4 "
                                   f"(U8 blocks and scales)")  # fmt: skip
        if ext.length != item * int(np.prod(shape)):
            raise ModelFormatError(f"{where}: tensor {shown(name)}: {ext.length} bytes for "
                                   f"{shape} {dtype}")  # fmt: skip
        out[part] = (dtype, shape, ext)
    return out


def _side_path(files: Sequence[Path], layers: list[dict[str, tuple[str, tuple[int, ...], Extent]]]
               ) -> Path:  # fmt: skip
    stats = [(str(p.resolve()), p.stat()) for p in files]
    key = {
        "v": FORMAT_VERSION,
        "files": [[name, st.st_size, st.st_mtime_ns] for name, st in stats],
        "layers": [{k: [d, list(s), e.file, e.offset] for k, (d, s, e) in t.items()}
                   for t in layers],
    }  # fmt: skip
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return relayout_dir() / f"gpt-oss-experts-{digest}.bin"


def _expert_matrices(
    files: Sequence[Path], t: Mapping[str, tuple[str, tuple[int, ...], Extent]]
) -> Iterator[npt.NDArray[Any]]:
    """One layer's experts in the engine's layout: per expert gate, up and down rows."""
    if "gate_up_proj_blocks" not in t:
        gu, down = _read(files, *t["gate_up_proj"]), _read(files, *t["down_proj"])
        for e in range(gu.shape[0]):
            w = np.asarray(gu[e])  # [hidden, 2 * ffn]
            for part in (w[:, 0::2], w[:, 1::2], np.asarray(down[e])):
                yield np.ascontiguousarray(part.T)
        return
    gb, gs = _read(files, *t["gate_up_proj_blocks"]), _read(files, *t["gate_up_proj_scales"])
    db, ds = _read(files, *t["down_proj_blocks"]), _read(files, *t["down_proj_scales"])
    for e in range(gb.shape[0]):  # MXFP4 rows are outputs already: de-interleave, re-block
        yield relayout_mxfp4(np.asarray(gb[e, 0::2]), np.asarray(gs[e, 0::2]))
        yield relayout_mxfp4(np.asarray(gb[e, 1::2]), np.asarray(gs[e, 1::2]))
        yield relayout_mxfp4(np.asarray(db[e]), np.asarray(ds[e]))


def _write(path: Path, files: Sequence[Path],
           layers: list[dict[str, tuple[str, tuple[int, ...], Extent]]],
           size: int) -> None:
    """Writes the side file of `size` bytes, whole or not at all (a clear ModelIOError when
    the cache directory cannot take it)."""
    advice = ("set XDG_CACHE_HOME to a directory on a disk with room, or convert the "
              "checkpoint once with `colibri convert`")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(path.parent).free
    except OSError as exc:
        raise ModelIOError(f"cannot use {path.parent} for gpt-oss's re-laid-out experts "
                           f"({exc.strerror or exc}); {advice}") from exc
    if free < size:
        raise ModelIOError(f"gpt-oss's experts are re-laid out once into a {size / 2**30:.1f} "
                           f"GiB side file, but {path.parent} has {free / 2**30:.1f} GiB free; "
                           f"{advice}")
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            for t in layers:
                for part in _expert_matrices(files, t):
                    out.write(part.tobytes())
            for t in layers:
                gub = _widen(_read(files, *t["gate_up_proj_bias"]), t["gate_up_proj_bias"][0])
                db = _widen(_read(files, *t["down_proj_bias"]), t["down_proj_bias"][0])
                for b in (gub[:, 0::2], gub[:, 1::2], db):
                    out.write(np.ascontiguousarray(b, dtype="<f4").tobytes())
        os.replace(tmp, path)
    except OSError as exc:
        raise ModelIOError(f"writing gpt-oss's re-laid-out experts to {path} failed "
                           f"({exc.strerror or exc}); {advice}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def _nbytes(dtype: str, shape: tuple[int, int]) -> int:
    if dtype == "MXFP4":
        return shape[0] * (shape[1] // BLOCK) * GGUF_BLOCK_BYTES
    return shape[0] * shape[1] * _ITEM[dtype]


def gpt_oss_experts(
    found: Found, files: Sequence[Path], cfg: ModelConfig, where: Path
) -> tuple[dict[str, TensorInfo], frozenset[str], Path | None]:
    """The canonical expert tensors of a gpt-oss float or MXFP4 checkpoint, with extents into the
    side file (file index ``len(files)``), the stored names they replace, and the side
    file (written now unless an identical one exists)."""
    mxfp4 = any(_MXFP4.fullmatch(n) for n in found)
    consumed = frozenset(n for n in found if _FUSED.fullmatch(n))
    layers = [_layer_tensors(found, cfg, i, mxfp4, where) for i in range(cfg.n_layers)]
    side = _side_path(files, layers)
    e_n, h, f = cfg.n_experts, cfg.hidden_size, cfg.moe_intermediate_size
    fi = len(files)
    tensors: dict[str, TensorInfo] = {}
    at = 0
    for i, t in enumerate(layers):
        if mxfp4:
            dtype = "MXFP4"
        elif (dtype := t["gate_up_proj"][0]) != t["down_proj"][0]:
            raise UnsupportedError(f"{where}: layer {i}'s gate_up_proj and down_proj differ in "
                                   f"dtype")  # fmt: skip
        for e in range(e_n):
            for part, shape in (("gate", (f, h)), ("up", (f, h)), ("down", (h, f))):
                name = f"blk.{i}.ffn_{part}_exps.{e}"
                n = _nbytes(dtype, shape)
                tensors[name] = TensorInfo(name, dtype, shape, (Extent(fi, at, n),))
                at += n
    for i in range(len(layers)):
        for part, width in (("gate", f), ("up", f), ("down", h)):
            name = f"blk.{i}.ffn_{part}_exps.bias"
            n = e_n * width * 4
            tensors[name] = TensorInfo(name, "F32", (e_n, width), (Extent(fi, at, n),))
            at += n
    if not (side.is_file() and side.stat().st_size == at):
        _write(side, files, layers, at)
    return tensors, consumed, side
