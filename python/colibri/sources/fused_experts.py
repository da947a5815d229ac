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
the shards keep their size and modification time. The MXFP4 checkpoints as released
(``*_blocks`` / ``*_scales``) are refused here: running them directly is a later step.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import ModelFormatError, UnsupportedError
from .manifest import Extent, ModelConfig, TensorInfo
from .paths import shown

FORMAT_VERSION = 1
Found = Mapping[str, tuple[str, tuple[int, ...], Extent]]
_FUSED = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)(_bias)?")
_MXFP4 = re.compile(r"model\.layers\.\d+\.mlp\.experts\.\w+_(blocks|scales)")
_ITEM = {"F32": 4, "BF16": 2, "F16": 2}
# How the elements are moved: F32 as floats, BF16 / F16 as their 16 bits (exact either way).
_MOVE: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"), "BF16": np.dtype("<u2"), "F16": np.dtype("<u2"),
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
    found: Found, cfg: ModelConfig, layer: int, where: Path
) -> dict[str, tuple[str, tuple[int, ...], Extent]]:
    e, h, f = cfg.n_experts, cfg.hidden_size, cfg.moe_intermediate_size
    want = {"gate_up_proj": (e, h, 2 * f), "gate_up_proj_bias": (e, 2 * f),
            "down_proj": (e, f, h), "down_proj_bias": (e, h)}  # fmt: skip
    out = {}
    for part, shape in want.items():
        name = f"model.layers.{layer}.mlp.experts.{part}"
        if name not in found:
            raise ModelFormatError(f"{where}: tensor {shown(name)} is missing; a gpt-oss "
                                   f"checkpoint stores every layer's experts fused")  # fmt: skip
        dtype, got, ext = found[name]
        if tuple(got) != shape:
            raise ModelFormatError(
                f"{where}: tensor {shown(name)} has shape {tuple(got)}, but the config implies "
                f"{shape}. The config does not match the weights."
            )
        if dtype not in _ITEM:
            raise UnsupportedError(f"{where}: tensor {shown(name)} has dtype {shown(dtype)}; "
                                   f"gpt-oss experts are read from F32, F16 or BF16")  # fmt: skip
        if ext.length != _ITEM[dtype] * int(np.prod(shape)):
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


def _write(path: Path, files: Sequence[Path],
           layers: list[dict[str, tuple[str, tuple[int, ...], Extent]]]) -> None:  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as out:
            for t in layers:
                gu, down = _read(files, *t["gate_up_proj"]), _read(files, *t["down_proj"])
                for e in range(gu.shape[0]):
                    w = np.asarray(gu[e])  # [hidden, 2 * ffn]
                    for part in (w[:, 0::2], w[:, 1::2], np.asarray(down[e])):
                        out.write(np.ascontiguousarray(part.T).tobytes())
            for t in layers:
                gub = _widen(_read(files, *t["gate_up_proj_bias"]), t["gate_up_proj_bias"][0])
                db = _widen(_read(files, *t["down_proj_bias"]), t["down_proj_bias"][0])
                for b in (gub[:, 0::2], gub[:, 1::2], db):
                    out.write(np.ascontiguousarray(b, dtype="<f4").tobytes())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def gpt_oss_experts(
    found: Found, files: Sequence[Path], cfg: ModelConfig, where: Path
) -> tuple[dict[str, TensorInfo], frozenset[str], Path | None]:
    """The canonical expert tensors of a gpt-oss float checkpoint, with extents into the
    side file (file index ``len(files)``), the stored names they replace, and the side
    file (written now unless an identical one exists)."""
    if any(_MXFP4.fullmatch(n) for n in found):
        raise UnsupportedError(
            f"{where}: MXFP4 expert weights (*_blocks / *_scales, gpt-oss as released) are not "
            f"run directly yet; load a float (BF16) gpt-oss checkpoint or a GGUF."
        )
    consumed = frozenset(n for n in found if _FUSED.fullmatch(n))
    layers = [_layer_tensors(found, cfg, i, where) for i in range(cfg.n_layers)]
    side = _side_path(files, layers)
    e_n, h, f = cfg.n_experts, cfg.hidden_size, cfg.moe_intermediate_size
    fi = len(files)
    tensors: dict[str, TensorInfo] = {}
    at = 0
    for i, t in enumerate(layers):
        dtype = t["gate_up_proj"][0]
        if t["down_proj"][0] != dtype:
            raise UnsupportedError(f"{where}: layer {i}'s gate_up_proj and down_proj differ in "
                                   f"dtype")  # fmt: skip
        mat = f * h * _ITEM[dtype]
        for e in range(e_n):
            for part, shape in (("gate", (f, h)), ("up", (f, h)), ("down", (h, f))):
                name = f"blk.{i}.ffn_{part}_exps.{e}"
                tensors[name] = TensorInfo(name, dtype, shape, (Extent(fi, at, mat),))
                at += mat
    for i in range(len(layers)):
        for part, width in (("gate", f), ("up", f), ("down", h)):
            name = f"blk.{i}.ffn_{part}_exps.bias"
            n = e_n * width * 4
            tensors[name] = TensorInfo(name, "F32", (e_n, width), (Extent(fi, at, n),))
            at += n
    if not (side.is_file() and side.stat().st_size == at):
        _write(side, files, layers)
    return tensors, consumed, side
