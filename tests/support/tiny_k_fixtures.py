"""The synthetic MoE preset ``tiny-k`` against llama.cpp: helpers shared by
test_kquant_moe.py (llama.cpp's K-quant files) and test_iquant_moe.py (colibri's i-quant
files).

``tiny-k`` (benchmarks/synthetic_moe.py: 4 layers, 8 experts of 256 x 256, every row a
multiple of 256) is written in Q4_0; each test re-quantizes it and compares colibri's
logits over IDS with llama.cpp's on the very same file. The Q4_0 file's own distance is one
part of each test's noise floor (q4_0_baseline).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import colibri
from support.modelfactory import REPO

IDS = [int(i) for i in np.random.default_rng(0).integers(0, 256, 64)]


def synthetic_moe() -> ModuleType:
    """benchmarks/synthetic_moe.py as a module (imported once)."""
    name = "synthetic_moe"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up while the class is built
        spec.loader.exec_module(mod)
    return sys.modules[name]


def write_tiny_k(path: Path) -> Path:
    """The ``tiny-k`` preset in Q4_0 (seed 0) at `path`."""
    synthetic_moe().write_synthetic_gguf("tiny-k", path, seed=0)
    return path


def colibri_logits(path: Path, precision: str = "int8") -> np.ndarray:
    """colibri's logits at every position of IDS."""
    engine = colibri.EngineConfig(context_length=128, activation_precision=precision)
    with colibri.Model.load(path, engine=engine) as m:
        return np.asarray(m.session().forward(IDS, all_logits=True))


def llama_logits(path: Path) -> np.ndarray:
    """llama.cpp's logits at every position of IDS (fails without llama-cpp-python)."""
    llama_cpp = pytest.importorskip("llama_cpp")

    llm = llama_cpp.Llama(str(path), n_ctx=128, n_threads=2, logits_all=True, verbose=False)
    try:
        llm.eval(IDS)
        return np.array(llm.scores[: len(IDS)], dtype=np.float32)
    finally:
        llm.close()


def distance(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, float, float]:
    """(median per-position relative RMS difference, correlation, argmax agreement)."""
    rms = np.sqrt(np.mean((ours - theirs) ** 2, axis=-1) / np.mean(theirs**2, axis=-1))
    corr = float(np.corrcoef(ours.ravel(), theirs.ravel())[0, 1])
    return float(np.median(rms)), corr, float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))


def q4_0_baseline(q4_0: Path) -> float:
    """colibri's distance to llama.cpp on the Q4_0 source file (checked to agree well)."""
    rms, corr, agree = distance(colibri_logits(q4_0), llama_logits(q4_0))
    assert corr > 0.99 and agree >= 0.9, (rms, corr, agree)
    return rms
