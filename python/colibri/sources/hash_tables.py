"""DeepSeek-V4's hash-routing tables, made readable for the core once, into a side file.

A V4 checkpoint keeps, for each hash layer (``mlp_layer_types`` "hash_moe"), the frozen
token -> experts table ``ffn.gate.tid2eid``: [vocab, top_k] integers (I64 as
transformers saves it, or I32). The core reads float tensors only, so each table is
checked (its shape against the vocabulary and top-k, every entry an expert of the layer)
and copied as F32 (exact: expert ids are far below 2**24) into a small side file in
``$XDG_CACHE_HOME/colibri/relayout`` (as gpt-oss's experts are, sources/fused_experts.py),
named by the shards' sizes and modification times and rewritten only when they change.
The manifest then holds ``blk.{i}.ffn_hash_eid`` pointing into it. A GGUF written by
llama.cpp's converter holds the same tables as I32 ``blk.{i}.ffn_gate_tid2eid.weight``
and gets the same side file (:func:`v4_gguf_hash_tables`).
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

from ..errors import ModelFormatError, ModelIOError, UnsupportedError
from .fused_experts import relayout_dir
from .manifest import Extent, ModelConfig, TensorInfo
from .paths import shown

Found = Mapping[str, tuple[str, tuple[int, ...], Extent]]
# As the checkpoint names it, or as llama.cpp's converter writes it (I32, one per layer).
_TABLE = re.compile(r"(?:model\.)?layers\.(\d+)\.ffn\.gate\.tid2eid"
                    r"|blk\.(\d+)\.ffn_gate_tid2eid\.weight")
_INT: dict[str, np.dtype[Any]] = {"I64": np.dtype("<i8"), "I32": np.dtype("<i4")}


def _table(files: Sequence[Path], name: str, dtype: str, shape: tuple[int, ...], ext: Extent,
           cfg: ModelConfig, layer: int) -> npt.NDArray[np.float32]:  # fmt: skip
    where = files[ext.file]
    want = (cfg.vocab_size, cfg.n_experts_per_tok)
    if not (cfg.hash_layers and layer < len(cfg.hash_layers) and cfg.hash_layers[layer]):
        raise ModelFormatError(f"{where}: tensor {shown(name)} is a hash-routing table, "
                               f"but layer {layer} is not a hash_moe layer in "
                               f"mlp_layer_types")  # fmt: skip
    if tuple(shape) != want:
        raise ModelFormatError(f"{where}: tensor {shown(name)} has shape {tuple(shape)}, but "
                               f"the config implies {want} (vocab_size x "
                               f"num_experts_per_tok)")  # fmt: skip
    if dtype not in _INT:
        raise UnsupportedError(f"{where}: tensor {shown(name)} has dtype {shown(dtype)}; a "
                               f"hash-routing table is read from I64 or I32")  # fmt: skip
    if ext.length != _INT[dtype].itemsize * want[0] * want[1]:
        raise ModelFormatError(f"{where}: tensor {shown(name)}: {ext.length} bytes for {want} "
                               f"{dtype}")  # fmt: skip
    ids = np.fromfile(where, dtype=_INT[dtype], count=want[0] * want[1], offset=ext.offset)
    bad = (ids < 0) | (ids >= cfg.n_experts)
    if bad.any():
        raise ModelFormatError(f"{where}: tensor {shown(name)} names expert "
                               f"{int(ids[bad][0])}, outside the layer's {cfg.n_experts} "
                               f"experts")  # fmt: skip
    return np.asarray(ids, dtype=np.float32).reshape(want)


def v4_hash_tables(found: Found, files: Sequence[Path], cfg: ModelConfig, d: Path
                   ) -> tuple[dict[str, TensorInfo], frozenset[str], Path | None]:  # fmt: skip
    """The hf_experts hook of the deepseek_v4 family: (the tables as canonical F32
    tensors in the side file, the stored names they replace, the side file)."""
    tables: list[tuple[int, str, npt.NDArray[np.float32]]] = []
    for name, (dtype, shape, ext) in found.items():
        if m := _TABLE.fullmatch(name):
            layer = int(m.group(1) or m.group(2))
            tables.append((layer, name, _table(files, name, dtype, shape, ext, cfg, layer)))
    if not tables:
        return {}, frozenset(), None
    tables.sort()
    key = {"v": 1, "files": [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns]
                             for p in files]}  # fmt: skip
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    side = relayout_dir() / f"deepseek-v4-hash-{digest}.bin"
    blob = b"".join(t.tobytes() for _, _, t in tables)
    if not (side.is_file() and side.read_bytes() == blob):
        tmp = side.with_name(f"{side.name}.{os.getpid()}.tmp")
        try:
            side.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(blob)
            os.replace(tmp, side)
        except OSError as exc:
            raise ModelIOError(f"writing DeepSeek-V4's hash tables to {side} failed "
                               f"({exc.strerror or exc}); set XDG_CACHE_HOME to a writable "
                               f"directory") from exc  # fmt: skip
        finally:
            tmp.unlink(missing_ok=True)
    out: dict[str, TensorInfo] = {}
    offset, index = 0, len(files)
    for layer, _name, t in tables:
        cname = f"blk.{layer}.ffn_hash_eid"
        out[cname] = TensorInfo(cname, "F32", tuple(t.shape), (Extent(index, offset, t.nbytes),))
        offset += t.nbytes
    return out, frozenset(n for _, n, _ in tables), side


def v4_gguf_hash_tables(path: Path, found: Found, cfg: ModelConfig
                        ) -> tuple[dict[str, TensorInfo], Path | None]:  # fmt: skip
    """The gguf_side hook of the deepseek_v4 family: the file's I32 tables, as
    :func:`v4_hash_tables` makes a checkpoint's."""
    tensors, _, side = v4_hash_tables(found, [path], cfg, path.parent)
    return tensors, side
