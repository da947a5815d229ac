"""The DSA lightning indexer's key selection (csrc/model/dsa_indexer.cpp), read through the
engine's test hook ``last_dsa_selection()``: the keys each query of the last forward
attended to in its last full indexer layer.

With index_topk 7, a query with 8 or more keys in its context attends to exactly 7 of them
(the highest indexer scores, in ascending position order), one with 7 or fewer to all of
them; prefill and decode alike. The kept keys are the ones transformers' indexer picks on
the same checkpoint. The end-to-end comparisons (test_oracle_deepseek.py) see a wrong count
only through the logits; this pins it directly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import colibri
from colibri import _core
from support.deepseek_factory import (
    N_LAYERS,
    TinyDeepseek,
    config_variant,
    prompt_ids,
    transformers_model,
)

TOPK = 7
N_PROMPT = 12  # queries 7..11 have more than TOPK keys


def _load(path: Path) -> colibri.Model:
    return colibri.Model.load(path, engine=colibri.EngineConfig(
        context_length=64, activation_precision="float32"))  # fmt: skip


def _per_query(core: _core.Engine) -> list[np.ndarray]:
    keys, offsets = core.last_dsa_selection()
    return [np.asarray(keys[offsets[t]:offsets[t + 1]]) for t in range(len(offsets) - 1)]


def _last_full_layer(tiny: TinyDeepseek) -> int:
    types = getattr(transformers_model(str(tiny.hf_dir)).config, "indexer_types", None)
    return max(i for i in range(N_LAYERS) if types is None or types[i] == "full")


def _transformers_selection(hf_dir: Path, layer: int, ids: list[int]) -> np.ndarray:
    """The top-k indices transformers' indexer of `layer` returns, [n_queries, topk]."""
    model = transformers_model(str(hf_dir))
    got: list[torch.Tensor] = []
    hook = model.model.layers[layer].self_attn.indexer.register_forward_hook(
        lambda _m, _i, out: got.append(out))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]), use_cache=False)
    finally:
        hook.remove()
    return got[0][0].numpy()


@pytest.mark.parametrize("variant", ["deepseek_v32", "glm_moe_dsa"])
def test_indexer_keeps_exactly_index_topk_keys(deepseek_models: dict[str, TinyDeepseek],
                                              variant: str, tmp_path: Path) -> None:
    tiny = deepseek_models[variant]
    hf = config_variant(tiny, tmp_path / "topk7", index_topk=TOPK)
    ids = prompt_ids(N_PROMPT + 1)
    m = _load(hf)
    core = m._require_core()
    s = m.session()
    s.forward(ids[:N_PROMPT])
    prefill = _per_query(core)
    s.forward(ids[N_PROMPT:])
    decode = _per_query(core)

    assert [len(k) for k in prefill] == [min(t + 1, TOPK) for t in range(N_PROMPT)]
    assert [len(k) for k in decode] == [TOPK]
    for t, keys in enumerate(prefill + decode):
        assert np.array_equal(keys, np.unique(keys)), (t, keys)  # ascending, distinct
        assert 0 <= keys[0] and keys[-1] <= t, (t, keys)  # causal
        if t < TOPK:
            assert np.array_equal(keys, np.arange(t + 1)), (t, keys)

    ref = _transformers_selection(hf, _last_full_layer(tiny), ids)
    for t in range(TOPK - 1, N_PROMPT + 1):  # rows whose top-k holds no masked position
        assert np.array_equal((prefill + decode)[t], np.sort(ref[t])), (t, ref[t])


def test_no_indexer_no_selection(deepseek_models: dict[str, TinyDeepseek]) -> None:
    m = _load(deepseek_models["deepseek_v3"].hf_dir)
    m.session().forward(prompt_ids(N_PROMPT))
    keys, offsets = m._require_core().last_dsa_selection()
    assert len(keys) == 0 and len(offsets) == 0
