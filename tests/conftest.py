"""Shared fixtures: the tiny per-family test models (see modelfactory.py).

``tiny_models`` builds (or reuses from build/test-models/) one checkpoint and three GGUF
files per family, once per test session; ``tiny_model`` is the same, parametrized over the
families. Reference outputs from transformers come from ``modelfactory.transformers_model``
(cached per process).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from modelfactory import FAMILIES, TinyModel, build_tiny_model


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Points $XDG_CACHE_HOME at a temporary directory for the whole run (subprocesses
    inherit it), so no test writes routing histories or named models into the user's
    ~/.cache/colibri. Session-scoped and autouse: it is in place before any module-scoped
    fixture loads a model (a model's history path is fixed when it loads)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, TinyModel]:
    """family -> TinyModel (hf_dir, gguf["F32" | "Q8_0" | "Q4_0"]), built once per session."""
    return {family: build_tiny_model(family) for family in FAMILIES}


@pytest.fixture(scope="session", params=FAMILIES)
def tiny_model(request: pytest.FixtureRequest, tiny_models: dict[str, TinyModel]) -> TinyModel:
    """One family's TinyModel; tests using it run once per family."""
    return tiny_models[request.param]
