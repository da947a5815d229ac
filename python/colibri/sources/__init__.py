"""Model sources: turn a path (GGUF file or Hugging Face directory) into a Manifest."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ModelFormatError, ModelNotFoundError
from .gguf_source import load_gguf
from .hf_source import load_hf
from .manifest import Extent, Manifest, ModelConfig, TensorInfo
from .native_format import JOURNAL, MANIFEST
from .native_source import load_native
from .paths import ModelDir
from .validate import SUPPORTED_FAMILIES

_GGUF_MAGIC = b"GGUF"


def open_model_source(path: str | os.PathLike[str]) -> Manifest:
    """The manifest of the model at ``path``.

    ``path`` is a ``.gguf`` file, a Hugging Face checkpoint directory (config.json +
    *.safetensors), a native container written by ``colibri.convert`` (manifest.json, or
    the journal of an interrupted conversion, which is reported as such), or a directory
    holding exactly one ``.gguf`` file.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelNotFoundError(
            f"model path {str(p)!r} does not exist. Pass a .gguf file or a Hugging Face model "
            f"directory (config.json + *.safetensors)."
        )
    if p.is_file():
        with open(p, "rb") as fh:
            magic = fh.read(4)
        if p.suffix.lower() == ".gguf" or magic == _GGUF_MAGIC:
            return load_gguf(p)
        if p.name == "config.json":
            return load_hf(p.parent, allow_fp8=True)
        raise ModelFormatError(
            f"{p} is neither a GGUF file nor a model directory. Pass a .gguf file or a "
            f"Hugging Face model directory (config.json + *.safetensors)."
        )
    if (p / MANIFEST).is_file() or (p / JOURNAL).is_file():
        return load_native(p)
    if (p / "config.json").is_file():
        return load_hf(p, allow_fp8=True)
    ggufs = sorted(f for f in p.iterdir() if f.suffix.lower() == ".gguf")
    if len(ggufs) == 1:
        # Named by the directory, not by the user: it must lie inside (symlinks followed).
        return load_gguf(ModelDir(p).listed(ggufs[0], "GGUF file"))
    if len(ggufs) > 1:
        names = ", ".join(f.name for f in ggufs)
        raise ModelFormatError(
            f"{p} holds several GGUF files ({names}); pass the path of the one to load."
        )
    raise ModelFormatError(
        f"{p} is not a model directory: it has no config.json and no .gguf file. Pass a "
        f".gguf file or a Hugging Face model directory (config.json + *.safetensors)."
    )


__all__ = [
    "SUPPORTED_FAMILIES",
    "Extent",
    "Manifest",
    "ModelConfig",
    "TensorInfo",
    "load_gguf",
    "load_hf",
    "open_model_source",
]
