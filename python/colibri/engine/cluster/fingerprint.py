"""A model file's fingerprint, as the coordinator and its expert workers compare it: the
normalized config, every tensor's name, type, shape and byte extents, each file's name
(not its path: the machines may keep the model in different places), size and first and
last MiB. Two machines agree on it when they hold the same file; a worker holding
another model (or another version of it) is refused at connect."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

from ...sources import Manifest

__all__ = ["model_fingerprint"]

_EDGE = 1 << 20  # bytes hashed at each end of every model file


def model_fingerprint(manifest: Manifest) -> str:
    """The SHA-256 (hex) naming the model's weights (reads 2 MiB per file)."""
    h = hashlib.sha256()
    h.update(json.dumps(dataclasses.asdict(manifest.config), sort_keys=True, default=str).encode())
    for t in manifest.tensors.values():
        extents = [(e.file, e.offset, e.length) for e in t.extents]  # file: an index
        h.update(f"{t.name}|{t.dtype}|{list(t.shape)}|{extents}\n".encode())
    for f in manifest.files:
        size = os.path.getsize(f)
        h.update(f"{os.path.basename(f)}|{size}\n".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(_EDGE))
            if size > _EDGE:
                fh.seek(max(_EDGE, size - _EDGE))
                h.update(fh.read(_EDGE))
    return h.hexdigest()
