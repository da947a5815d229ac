"""The native streaming container as a model source (``docs/format.md``, "Native
container"; written by :func:`colibri.convert.write_container`).

:func:`load_native` reads ``manifest.json`` only: dense tensors get extents into
``dense.bin`` (file 0), each routed expert's gate, up and down matrices extents inside
its blob in ``experts.bin`` (file 1), and ``Manifest.expert_blobs`` lists each blob with
its crc32: the expert store reads a blob with one request and checks it
(``IOConfig.checksums``); :func:`colibri.convert.verify_container` checks every byte.

``Manifest.source`` is the kind of the model the container was converted from ("gguf" or
"hf"), so the tokenizer is found the same way: a GGUF's key/values are in ``metadata``, a
Hugging Face tokenizer's files were copied into the container directory
(``Manifest.path``).

``open_model_source`` dispatches here for a directory holding ``manifest.json`` (or the
journal of an interrupted conversion).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelFormatError
from .manifest import ExpertBlob, Extent, Manifest, TensorInfo
from .manifest_schema import ContainerDoc, check_container_doc
from .native_format import (
    DENSE,
    EXPERTS,
    MANIFEST,
    PROJECTIONS,
    TENSOR_ALIGNMENT,
    read_container_json,
)
from .paths import ModelDir
from .validate import check_extents, check_packed, order_and_check


def read_container(path: str | os.PathLike[str]) -> tuple[ContainerDoc, ModelDir]:
    """The checked manifest of the container at ``path`` and its directory (every file
    it names must lie inside it)."""
    d = Path(path).expanduser()
    root = ModelDir(d)
    if (d / MANIFEST).exists():
        root.file(MANIFEST, "manifest", d)  # a symlink out of the directory is refused
    doc = read_container_json(d)
    return check_container_doc(doc, d / MANIFEST), root


def _check_layout(doc: ContainerDoc, sizes: tuple[int, int], where: Path) -> None:
    """The data files are the sizes the manifest records, and the records are laid out
    the way the writer lays them out (dense tensors padded to 64 bytes, blobs back to
    back): a gap means a record no longer describes the bytes."""
    for name, want, got in ((DENSE, doc.dense_size, sizes[0]),
                            (EXPERTS, doc.experts_size, sizes[1])):  # fmt: skip
        if want != got:
            raise ModelFormatError(
                f"{where}: {name} is {got} bytes, the manifest says {want}: the container is "
                f"truncated or damaged; convert the model again"
            )
    check_packed(((r.offset, r.offset + r.length, r.name) for r in doc.dense), 0, sizes[0],
                 TENSOR_ALIGNMENT, where / DENSE)  # fmt: skip
    check_packed(((e.offset, e.offset + e.length, f"layer {e.layer} expert {e.expert}")
                  for e in doc.experts), 0, sizes[1], 1, where / EXPERTS)  # fmt: skip


def load_native(path: str | os.PathLike[str]) -> Manifest:
    """The manifest of the native container (directory) at ``path``."""
    doc, root = read_container(path)
    d = root.path
    where = d / MANIFEST
    files = (root.file(DENSE, "data file", where), root.file(EXPERTS, "data file", where))
    sizes = (os.stat(files[0]).st_size, os.stat(files[1]).st_size)
    _check_layout(doc, sizes, d)
    tensors: dict[str, TensorInfo] = {}
    blobs: dict[tuple[int, int], ExpertBlob] = {}
    for rec in doc.dense:
        tensors[rec.name] = TensorInfo(
            rec.name, rec.dtype, rec.shape, (Extent(0, rec.offset, rec.length),),
            rope_unpermute_heads=rec.rope_unpermute_heads, crc32=rec.crc32,
        )  # fmt: skip
    for e in doc.experts:
        blobs[(e.layer, e.expert)] = ExpertBlob(Extent(1, e.offset, e.length), e.crc32)
        for proj, sub in zip(PROJECTIONS, e.parts, strict=True):
            name = f"blk.{e.layer}.ffn_{proj}_exps.{e.expert}"
            if name in tensors:
                raise ModelFormatError(f"{where}: {name} is both a dense tensor and an expert")
            tensors[name] = TensorInfo(
                name, sub.dtype, sub.shape, (Extent(1, e.offset + sub.offset, sub.length),)
            )
    ordered = order_and_check(tensors, doc.config, where)
    check_extents(ordered, files, sizes)
    return Manifest(
        source=doc.source_kind,  # type: ignore[arg-type]  # checked: "gguf" or "hf"
        path=d,
        files=files,
        config=doc.config,
        tensors=ordered,
        metadata=doc.metadata,
        expert_blobs=blobs,
    )
