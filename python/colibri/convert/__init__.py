"""Conversion to colibri's native streaming container (``docs/format.md``).

:func:`write_container` lays a model out for streaming: a manifest, or the path of a GGUF
file, a Hugging Face directory (FP8 block-scaled ones included) or another container,
optionally converting matrices to another type (``quant=``, :mod:`.quantize`);
:func:`verify_container` checks every checksum of a written container;
:func:`colibri.sources.native_source.load_native` reads one back as a manifest.
``colibri convert SRC DST [--quant TYPE]`` and ``colibri verify DST`` are the command line
(``colibri/cli/convert.py``); ``open_model_source`` (so ``Model.load``) opens containers.
"""

from __future__ import annotations

from ..sources.native_format import ALIGNMENT, CHECKSUM, FORMAT, QUANT_CHOICES, VERSION
from .container import WriteReport, write_container
from .verify import verify_container

__all__ = [
    "ALIGNMENT",
    "CHECKSUM",
    "FORMAT",
    "QUANT_CHOICES",
    "VERSION",
    "WriteReport",
    "verify_container",
    "write_container",
]
