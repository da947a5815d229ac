"""Conversion to colibri's native streaming container (``docs/format.md``).

:func:`write_container` lays a source manifest (GGUF file or Hugging Face directory) out
for streaming; :func:`verify_container` checks every checksum of a written container;
:func:`colibri.sources.native_source.load_native` reads one back as a manifest.

Not wired yet: ``open_model_source`` does not dispatch to containers and there is no
``colibri convert`` / ``colibri verify`` command. To wire it, make ``open_model_source``
return ``load_native(p)`` when ``p`` is a directory holding ``manifest.json`` (check it
before the ``config.json`` test; a container never holds a ``config.json``), and have the
CLI call ``write_container(open_model_source(src), dst, progress=...)`` and print
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
