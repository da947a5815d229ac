"""Loading the linear-attention oracle models (Qwen3-Next, Kimi-Linear) with either form of
the delta rule, and the check that the two forms agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import colibri
from colibri.engine import handle


def load(d: Path, *, chunked: bool = False, **engine: object) -> colibri.Model:
    """The model at context 256; ``chunked``: forwards of 64 tokens or more run the delta
    rule's chunked form (ModelSpec.linear_chunked_min_tokens, which colibri leaves 0:
    recurrent only)."""
    cfg = colibri.EngineConfig(context_length=256, **engine)
    if not chunked:
        return colibri.Model.load(d, engine=cfg)
    plain = handle.model_spec

    def spec(*args: Any, **kw: Any) -> Any:
        s = plain(*args, **kw)
        s.linear_chunked_min_tokens = 64
        return s

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(handle, "model_spec", spec)
        return colibri.Model.load(d, engine=cfg)


def assert_forms_agree(d: Path, ids: list[int]) -> None:
    """The chunked form over the whole prompt (chunks of 64, the last one short) and the
    recurrent one fed 16 tokens at a time: the same logits to within rounding (1e-5 of the
    largest; measured about 2e-6)."""
    chunked = load(d, chunked=True).session().forward(ids, all_logits=True)
    s = load(d).session()
    recurrent = np.concatenate([s.forward(ids[i : i + 16], all_logits=True)
                                for i in range(0, len(ids), 16)])  # fmt: skip
    err = float(np.abs(chunked - recurrent).max())
    assert err <= 1e-5 * float(np.abs(recurrent).max()), err
