"""Reading the tokenizer metadata of a GGUF file.

A tokenizer needs only the key/value header, so :func:`read_metadata` parses it with the
shared fast reader (:mod:`colibri.sources.gguf_header`) and stops before the tensor infos.
An already open ``gguf.GGUFReader`` is accepted as well (:func:`metadata_from_reader`),
and a model's manifest already holds the whole mapping (``Manifest.metadata``).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ModelFormatError
from ..sources.gguf_header import read_gguf_header

# The keys a tokenizer reads.
TOKENIZER_PREFIXES = ("tokenizer.", "general.name")


def read_metadata(path: str | os.PathLike[str], prefixes: tuple[str, ...] = ()) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (keys starting with one of ``prefixes``; all
    keys when it is empty). Raises ModelNotFoundError / ModelFormatError."""
    return read_gguf_header(path, prefixes=prefixes, tensors=False).metadata


def metadata_from_reader(reader: Any, prefixes: tuple[str, ...] = ()) -> dict[str, Any]:
    """The same dictionary as :func:`read_metadata`, from an open ``gguf.GGUFReader``."""
    md: dict[str, Any] = {}
    try:
        fields = reader.fields
    except AttributeError as exc:
        raise TypeError(
            f"expected a path or a gguf.GGUFReader, got {type(reader).__name__}"
        ) from exc
    for key, field in fields.items():
        if key.startswith("GGUF.") or (prefixes and not key.startswith(prefixes)):
            continue
        try:
            md[key] = field.contents()
        except (UnicodeDecodeError, ValueError, IndexError) as exc:
            raise ModelFormatError(f"GGUF metadata key {key!r} cannot be decoded: {exc}") from exc
    return md
