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
from typing import Any

from ..convert.container import DENSE, EXPERTS, PROJECTIONS, read_container_json
from ..errors import ModelFormatError
from .manifest import ExpertBlob, Extent, Manifest, ModelConfig, TensorInfo
from .validate import check_dtype, check_extents, file_sizes, order_and_check


def _config(raw: Any, where: Path) -> ModelConfig:
    if not isinstance(raw, dict):
        raise ModelFormatError(f"{where}: 'config' is not an object")
    d = dict(raw)
    for key in ("moe_layers", "eos_token_ids", "indexer_types"):
        if key in d:
            d[key] = tuple(d[key])
    try:
        return ModelConfig(**d)
    except TypeError as exc:
        raise ModelFormatError(f"{where}: invalid config ({exc})") from exc


def load_native(path: str | os.PathLike[str]) -> Manifest:
    """The manifest of the native container (directory) at ``path``."""
    d = Path(path).expanduser()
    doc = read_container_json(d)
    where = d / "manifest.json"
    cfg = _config(doc.get("config"), where)
    kind = doc.get("source", {}).get("kind")
    if kind not in ("gguf", "hf"):
        raise ModelFormatError(f"{where}: unknown source kind {kind!r}")
    tensors: dict[str, TensorInfo] = {}
    blobs: dict[tuple[int, int], ExpertBlob] = {}
    try:
        for rec in doc["dense"]:
            check_dtype(rec["name"], rec["dtype"], where)
            tensors[rec["name"]] = TensorInfo(
                rec["name"], rec["dtype"], tuple(rec["shape"]),
                (Extent(0, int(rec["offset"]), int(rec["length"])),),
                int(rec.get("rope_unpermute_heads", 0)),
            )
        for rec in doc["experts"]:
            layer, expert, base = int(rec["layer"]), int(rec["expert"]), int(rec["offset"])
            crc = rec.get("crc32")
            blobs[(layer, expert)] = ExpertBlob(
                Extent(1, base, int(rec["length"])), None if crc is None else int(crc)
            )
            for proj in PROJECTIONS:
                sub = rec[proj]
                name = f"blk.{layer}.ffn_{proj}_exps.{expert}"
                check_dtype(name, sub["dtype"], where)
                if int(sub["offset"]) + int(sub["length"]) > int(rec["length"]):
                    raise ModelFormatError(f"{where}: {name} extends past its blob")
                tensors[name] = TensorInfo(
                    name, sub["dtype"], tuple(sub["shape"]),
                    (Extent(1, base + int(sub["offset"]), int(sub["length"])),),
                )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFormatError(f"{where}: malformed tensor record ({exc!r})") from exc
    files = ((d / DENSE).resolve(), (d / EXPERTS).resolve())
    for f in files:
        if not f.is_file():
            raise ModelFormatError(f"{d}: {f.name} is missing; the container is incomplete")
    ordered = order_and_check(tensors, cfg, where)
    check_extents(ordered, files, file_sizes(files))
    return Manifest(
        source=kind,
        path=d,
        files=files,
        config=cfg,
        tensors=ordered,
        metadata=doc.get("metadata", {}),
        expert_blobs=blobs,
    )
