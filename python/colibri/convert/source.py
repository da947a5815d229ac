"""What ``colibri convert`` reads: any model source ``open_model_source`` opens, plus FP8
block-scaled Hugging Face checkpoints, which only conversion can read (``load_hf`` with
``allow_fp8``; ``Model.load`` refuses them)."""

from __future__ import annotations

import os
from pathlib import Path

from ..sources.hf_source import load_hf
from ..sources.manifest import Manifest


def open_convert_source(path: str | os.PathLike[str]) -> Manifest:
    """The manifest of the model at ``path`` for conversion: a GGUF file, a Hugging Face
    directory (FP8 weights reported as ``Fp8TensorInfo``) or a native container."""
    from ..sources import open_model_source  # the package imports this one's parent

    p = Path(path).expanduser()
    d = p.parent if p.is_file() and p.name == "config.json" else p
    is_container = (d / "manifest.json").is_file() or (d / "convert.journal").is_file()
    if d.is_dir() and not is_container and (d / "config.json").is_file():
        return load_hf(d, allow_fp8=True)
    return open_model_source(p)
