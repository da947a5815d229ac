"""A sliding window set in a native container's config (the JSON list of sliding_layers read
back as the ModelConfig's tuple), through the public API: ``colibri.Model.load`` of the tiny
Llama container with ``sliding_window = 2`` in layers 0 and 2 (no tensors change).

The window is live (the logits differ from the container without it), decode token by
token past the window agrees with one prefill, and a container whose sliding_layers has
the wrong length, or whose window exceeds the model's context, is refused with a
ModelFormatError naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import colibri
from colibri.errors import ModelFormatError
from support.modelfactory import TinyModel
from support.untrusted import copy_dir, edit_json

IDS = [3, 77, 12, 5, 199, 42, 8, 150, 31, 64, 9, 120]


@pytest.fixture(scope="module")
def container(tiny_models: dict[str, TinyModel], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from colibri.convert import write_container

    c = tmp_path_factory.mktemp("native") / "llama.colibri"
    write_container(tiny_models["llama"].gguf["F32"], c)
    return c


def _edited(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    d = copy_dir(src, dst)
    edit_json(d / "manifest.json", lambda m: edit(m["config"]))
    return d


def _logits(path: Path) -> np.ndarray:
    m = colibri.Model.load(path)
    try:
        return m.session().forward(IDS, all_logits=True)
    finally:
        m.close()


def test_window_from_the_container_config(container: Path, tmp_path: Path) -> None:
    d = _edited(container, tmp_path / "w",
                lambda c: c.update(sliding_window=2, sliding_layers=[True, False, True]))
    m = colibri.Model.load(d)
    try:
        assert m.config.sliding_window == 2 and m.config.sliding_layers == (True, False, True)
        s = m.session()
        full = s.forward(IDS, all_logits=True)
        step = m.session()
        step.forward(IDS[:2])
        for t in range(2, len(IDS)):  # decode, up to 9 positions past the window
            np.testing.assert_allclose(step.forward([IDS[t]]), full[t], rtol=0, atol=1e-5)
    finally:
        m.close()
    plain = _logits(container)
    np.testing.assert_allclose(full[:2], plain[:2], rtol=0, atol=1e-5)  # inside the window
    assert float(np.abs(full[2:] - plain[2:]).max()) > 1e-2


@pytest.mark.parametrize(("edit", "match"), [
    ({"sliding_window": 2, "sliding_layers": [True]}, "sliding_layers has 1 entries for 3"),
    ({"sliding_window": 10**6, "sliding_layers": [True, True, True]},
     "larger than the context length"),
    ({"sliding_window": 2, "sliding_layers": [1, 0, 1]}, "sliding_layers"),
])  # fmt: skip
def test_bad_window_fields_are_refused(container: Path, tmp_path: Path, edit: dict[str, Any],
                                       match: str) -> None:  # fmt: skip
    d = _edited(container, tmp_path / "bad", lambda c: c.update(edit))
    with pytest.raises(ModelFormatError, match=match):
        colibri.Model.load(d)
