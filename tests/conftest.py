"""Shared fixtures: the tiny per-family test models (see modelfactory.py).

``tiny_models`` builds (or reuses from build/test-models/) one checkpoint and three GGUF
files per family, once per test session; ``tiny_model`` is the same, parametrized over the
families. Reference outputs from transformers come from ``modelfactory.transformers_model``
(cached per process). ``deepseek_models`` / ``deepseek_model`` are the DeepSeek/GLM-family
variants of deepseek_factory.py.
"""

from __future__ import annotations

import pytest

from deepseek_factory import VARIANTS as DEEPSEEK_VARIANTS
from deepseek_factory import TinyDeepseek, build_tiny
from modelfactory import FAMILIES, TinyModel, build_tiny_model


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, TinyModel]:
    """family -> TinyModel (hf_dir, gguf["F32" | "Q8_0" | "Q4_0"]), built once per session."""
    return {family: build_tiny_model(family) for family in FAMILIES}


@pytest.fixture(scope="session", params=FAMILIES)
def tiny_model(request: pytest.FixtureRequest, tiny_models: dict[str, TinyModel]) -> TinyModel:
    """One family's TinyModel; tests using it run once per family."""
    return tiny_models[request.param]


@pytest.fixture(scope="session")
def deepseek_models() -> dict[str, TinyDeepseek]:
    """variant -> TinyDeepseek (the checkpoint; GGUF tests convert it themselves)."""
    return {v: build_tiny(v, with_gguf=False) for v in DEEPSEEK_VARIANTS}


@pytest.fixture(scope="session", params=DEEPSEEK_VARIANTS)
def deepseek_model(request: pytest.FixtureRequest,
                   deepseek_models: dict[str, TinyDeepseek]) -> TinyDeepseek:
    """One DeepSeek/GLM-family variant (deepseek_factory.VARIANTS)."""
    return deepseek_models[request.param]
