"""What ``colibri convert`` reads: any model source ``open_model_source`` opens (FP8
block-scaled Hugging Face checkpoints included: conversion dequantizes their weights); and a
reader of byte ranges of a source tensor across its extents."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import ModelFormatError, ModelIOError
from ..sources import open_model_source
from ..sources.hf_source import load_hf
from ..sources.manifest import Manifest, TensorInfo
from ..sources.native_format import JOURNAL, MANIFEST
from .quantize import Reader


def open_convert_source(path: str | os.PathLike[str]) -> Manifest:
    """The manifest of the model at ``path`` for conversion: a GGUF file, a Hugging Face
    directory (FP8 weights reported as ``Fp8TensorInfo``) or a native container."""
    p = Path(path).expanduser()
    d = p.parent if p.is_file() and p.name == "config.json" else p
    is_container = (d / MANIFEST).is_file() or (d / JOURNAL).is_file()
    if d.is_dir() and not is_container and (d / "config.json").is_file():
        return load_hf(d, allow_fp8=True)
    return open_model_source(p)


def tensor_reader(sources: Sequence[io.BufferedIOBase], names: Sequence[Path]) -> Reader:
    """read(tensor, start, length): bytes [start, start + length) of a source tensor,
    across its extents."""

    def read(t: TensorInfo, start: int, length: int) -> bytearray:
        out = bytearray(length)
        view = memoryview(out)
        pos = 0  # in the tensor
        got = 0
        for e in t.extents:
            lo, hi = max(start, pos), min(start + length, pos + e.length)
            if lo < hi:
                src = sources[e.file]
                src.seek(e.offset + lo - pos)
                while lo < hi:
                    n = src.readinto(view[got : got + hi - lo])
                    if not n:
                        raise ModelIOError(
                            f"{names[e.file]}: short read in tensor {t.name!r} at offset "
                            f"{e.offset + lo - pos}; the source file is truncated"
                        )
                    lo += n
                    got += n
            pos += e.length
        if got != length:
            raise ModelFormatError(f"tensor {t.name!r}: bytes [{start}, {start + length}) "
                                   f"are past its end ({pos} bytes)")  # fmt: skip
        return out

    return read
