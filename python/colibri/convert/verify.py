"""``colibri verify``: every checksum of a native container, read back from disk."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError, ModelIOError, ModelNotFoundError, UnsupportedError
from .container import CHUNK, DENSE, EXPERTS, crc_range, read_container_json


def verify_container(path: str | os.PathLike[str]) -> list[str]:
    """Checks every checksum of the container at ``path``; returns the problems found
    (empty when the container is sound). A damaged expert blob is named by layer and
    expert, a damaged dense tensor by name."""
    d = Path(path)
    try:
        doc = read_container_json(d)
    except (ModelFormatError, ModelNotFoundError, UnsupportedError) as exc:
        return [str(exc)]
    problems: list[str] = []
    buf = bytearray(min(CHUNK, 1 << 20))
    sections: list[tuple[str, str, list[Mapping[str, Any]]]] = [
        ("dense", DENSE, doc["dense"]),
        ("experts", EXPERTS, doc["experts"]),
    ]
    for key, name, records in sections:
        p = d / name
        want_size = int(doc["files"][key]["size"])
        try:
            size = os.stat(p).st_size
        except FileNotFoundError:
            problems.append(f"{name} is missing")
            continue
        if size != want_size:
            problems.append(f"{name} is {size} bytes long, the manifest says {want_size}")
        with open(p, "rb") as f:
            for rec in records:
                what = (
                    f"layer {rec['layer']} expert {rec['expert']}" if key == "experts"
                    else f"dense tensor {rec['name']!r}"
                )
                off, length = int(rec["offset"]), int(rec["length"])
                try:
                    got = crc_range(f, off, length, buf, name)
                except ModelIOError:
                    problems.append(f"{what}: {name} ends before bytes [{off}, {off + length})")
                    continue
                if got != int(rec["crc32"]):
                    problems.append(
                        f"{what}: checksum mismatch in {name} at bytes [{off}, {off + length}) "
                        f"(expected crc32 {int(rec['crc32']):08x}, got {got:08x})"
                    )
    return problems
