"""``colibri verify``: every checksum of a native container, read back from disk."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelFormatError, ModelIOError, ModelNotFoundError, UnsupportedError
from ..sources.native_format import DENSE, EXPERTS
from ..sources.native_source import read_container
from ..sources.paths import shown
from .container import CHUNK, crc_range


def verify_container(path: str | os.PathLike[str]) -> list[str]:
    """Checks every checksum of the container at ``path``; returns the problems found
    (empty when the container is sound). A damaged expert blob is named by layer and
    expert, a damaged dense tensor by name. The manifest is checked against its schema
    first (a malformed one is the one problem reported), and only files inside the
    container's directory are read."""
    d = Path(path)
    try:
        doc, root = read_container(d)
    except (ModelFormatError, ModelNotFoundError, UnsupportedError) as exc:
        return [str(exc)]
    problems: list[str] = []
    buf = bytearray(min(CHUNK, 1 << 20))
    sections: list[tuple[str, int, list[tuple[str, int, int, int]]]] = [
        (DENSE, doc.dense_size,
         [(f"dense tensor {shown(r.name)}", r.offset, r.length, r.crc32) for r in doc.dense]),
        (EXPERTS, doc.experts_size,
         [(f"layer {e.layer} expert {e.expert}", e.offset, e.length, e.crc32)
          for e in doc.experts]),
    ]  # fmt: skip
    for name, want_size, records in sections:
        try:
            p = root.file(name, "data file", d)
        except ModelFormatError as exc:
            problems.append(str(exc))
            continue
        size = os.stat(p).st_size
        if size != want_size:
            problems.append(f"{name} is {size} bytes long, the manifest says {want_size}")
        with open(p, "rb") as f:
            for what, off, length, crc in records:
                if off + length > size:  # checked before seeking: off may be 2**62
                    problems.append(f"{what}: {name} ends before bytes [{off}, {off + length})")
                    continue
                try:
                    got = crc_range(f, off, length, buf, name)
                except ModelIOError:
                    problems.append(f"{what}: {name} ends before bytes [{off}, {off + length})")
                    continue
                if got != crc:
                    problems.append(
                        f"{what}: checksum mismatch in {name} at bytes [{off}, {off + length}) "
                        f"(expected crc32 {crc:08x}, got {got:08x})"
                    )
    return problems
