"""Conversion to colibri's native streaming container (``docs/format.md``).

:func:`write_container` lays a source manifest (GGUF file or Hugging Face directory) out
for streaming; :func:`verify_container` checks every checksum of a written container;
:func:`colibri.sources.native_source.load_native` reads one back as a manifest.

``open_model_source`` (so ``Model.load``) opens containers. Not wired yet: a
``colibri convert`` / ``colibri verify`` command; it would call
``write_container(open_model_source(src), dst, progress=...)`` and print
``verify_container(dst)``.
"""

from __future__ import annotations

from .container import (
    ALIGNMENT,
    CHECKSUM,
    FORMAT,
    VERSION,
    WriteReport,
    verify_container,
    write_container,
)

__all__ = [
    "ALIGNMENT",
    "CHECKSUM",
    "FORMAT",
    "VERSION",
    "WriteReport",
    "verify_container",
    "write_container",
]
