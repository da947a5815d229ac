"""GGUF files written by llama.cpp's own quantizer (``llama_cpp.llama_model_quantize``).

The SmolLM2 Q4_1 GGUF (tests/support/realmodel.py) re-quantized into llama.cpp's K-quant mixes, and
any other GGUF the same way, cached under ``build/test-models/llamacpp-<version>/``. The
files are real llama.cpp output: their type choices (SmolLM2's 576-wide rows fall back to
Q5_0 / Q5_1 / Q4_0 / Q8_0 for many tensors), layouts and quantized bytes are llama.cpp's.
scripts/test.sh installs llama-cpp-python; without it these tests fail (their skip is not
on tests/conftest.py's allow-list).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from support.modelfactory import REPO
from support.realmodel import smollm2_gguf

# llama_ftype values (llama.h) of the mixes used here.
FTYPES = {"Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}


def llama_cpp() -> object:
    return pytest.importorskip(
        "llama_cpp", reason="needs llama-cpp-python (scripts/test.sh installs it)"
    )


def cache_dir() -> Path:
    lc = llama_cpp()
    base = Path(os.environ.get("COLIBRI_TEST_MODELS", REPO / "build" / "test-models"))
    return base / f"llamacpp-{getattr(lc, '__version__', 'unknown')}"


def quantize_gguf(src: Path, mix: str, dst: Path) -> Path:
    """``llama-quantize src dst <mix>`` (cached: dst is reused when it exists)."""
    lc = llama_cpp()
    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    params = lc.llama_model_quantize_default_params()  # type: ignore[attr-defined]
    params.ftype = FTYPES[mix]
    params.allow_requantize = True
    params.nthread = 2
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}-", dir=dst.parent)
    os.close(fd)
    try:
        rc = lc.llama_model_quantize(str(src).encode(), tmp.encode(), params)  # type: ignore[attr-defined]
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({src}, {mix}) returned {rc}")
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dst


def smollm2_quantized(mix: str) -> Path:
    """SmolLM2-135M-Instruct re-quantized by llama.cpp into ``mix`` (Q4_K_M, Q6_K, ...)."""
    src = smollm2_gguf()
    return quantize_gguf(src, mix, cache_dir() / f"smollm2-{src.stat().st_size}-{mix}.gguf")
