"""Shared fixtures: the tiny per-family test models (see modelfactory.py).

``tiny_models`` builds (or reuses from build/test-models/) one checkpoint and three GGUF
files per family, once per test session; ``tiny_model`` is the same, parametrized over the
families. Reference outputs from transformers come from ``modelfactory.transformers_model``
(cached per process).
"""

from __future__ import annotations

import pytest

from modelfactory import FAMILIES, TinyModel, build_tiny_model


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, TinyModel]:
    """family -> TinyModel (hf_dir, gguf["F32" | "Q8_0" | "Q4_0"]), built once per session."""
    return {family: build_tiny_model(family) for family in FAMILIES}


@pytest.fixture(scope="session", params=FAMILIES)
def tiny_model(request: pytest.FixtureRequest, tiny_models: dict[str, TinyModel]) -> TinyModel:
    """One family's TinyModel; tests using it run once per family."""
    return tiny_models[request.param]
