"""The native streaming container's format, version 1 (``docs/format.md``, "Native
container"): its file names, alignments and checksum, the values its ``manifest.json``
may record, and the reader of that file's envelope (format and version).

Both sides of the format use these names: the reader (:mod:`.native_source`,
:mod:`.manifest_schema`) and the writer (:mod:`colibri.convert.container`, which
re-exports them). They live here, below both, so that ``colibri.convert`` imports
``colibri.sources`` and never the other way round.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError, ModelNotFoundError, UnsupportedError

FORMAT = "colibri-container"
VERSION = 1
ALIGNMENT = 4096  # offset and size granularity of an expert blob (O_DIRECT-ready)
TENSOR_ALIGNMENT = 64  # dense tensors in dense.bin; gate/up/down inside a blob
CHECKSUM = "crc32"

MANIFEST = "manifest.json"
DENSE = "dense.bin"
EXPERTS = "experts.bin"
JOURNAL = "convert.journal"
# Files a Hugging Face tokenizer may need; copied as they are when the source has them.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
)
PROJECTIONS = ("gate", "up", "down")  # an expert blob's matrices, in blob order
# ``colibri convert --quant`` choices, recorded as manifest.json's "quant" (the
# conversion itself: colibri.convert.quantize).
QUANT_CHOICES = (
    "keep", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
    "q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q4_k_m", "q5_k_m", "iq4_xs", "iq3_s", "iq3_xxs",
    "iq2_s", "iq2_xs", "iq2_xxs", "iq1_m", "iq1_s",
)  # fmt: skip


def read_container_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed ``manifest.json`` of the container at ``path``, format and version
    checked."""
    d = Path(path)
    f = d / MANIFEST
    if not f.is_file():
        if not d.exists():
            raise ModelNotFoundError(f"container {str(d)!r} does not exist")
        hint = (
            " A conversion into it was interrupted: rerun it to resume."
            if (d / JOURNAL).exists() else ""
        )
        raise ModelFormatError(
            f"{d} is not a complete colibri container: it has no {MANIFEST}.{hint}"
        )
    try:
        doc = json.loads(f.read_bytes())
    except (ValueError, RecursionError) as exc:  # RecursionError: nested 100,000 deep
        raise ModelFormatError(f"{f}: not valid JSON ({str(exc)[:200]})") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelFormatError(f"{f}: not a colibri container manifest (no format {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise UnsupportedError(
            f"{f}: container version {doc.get('version')!r}; this colibri reads version "
            f"{VERSION}. Convert the model again with this version, or upgrade colibri."
        )
    if doc.get("checksum") != CHECKSUM or doc.get("alignment") != ALIGNMENT:
        raise ModelFormatError(f"{f}: unexpected checksum or alignment")
    return doc
