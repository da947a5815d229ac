"""The Python mirror of the expert store's slot layout (colibri.engine.streaming.expert_slot_bytes,
used to state the minimum budget before any weight is read) agrees with the core's."""

from __future__ import annotations

from pathlib import Path

import pytest

import colibri as co
from colibri.convert import write_container
from colibri.engine.streaming import expert_slot_bytes
from colibri.sources import open_model_source
from support.modelfactory import build_tiny_model


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe", "olmoe", "mixtral"])
def test_slot_bytes_mirror_matches_the_core(tmp_path: Path, family: str) -> None:
    tiny = build_tiny_model(family)
    container = tmp_path / "c.colibri"
    write_container(open_model_source(tiny.gguf["Q8_0"]), container)
    for src in (tiny.hf_dir, tiny.gguf["F32"], tiny.gguf["Q4_0"], container):
        manifest = open_model_source(src)
        with co.Model.load(src, engine=co.EngineConfig(cache=co.CacheConfig(history=False))) as m:
            core_bytes = m.stats().memory
            assert core_bytes is not None
            assert core_bytes.slot_bytes == expert_slot_bytes(manifest), src


def test_slot_bytes_mirror_for_k_quant_experts(tmp_path: Path) -> None:
    # Experts of several sizes in one model (q4_k_m: Q4_K or Q6_K down projections by
    # layer; Q5_0/Q8_0 fallbacks where rows are not multiples of 256): the slot fits the
    # largest, in the core and in the mirror alike.
    import importlib.util
    import sys

    from support.modelfactory import REPO

    name = "synthetic_moe"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    gguf_path = tmp_path / "tiny-k.gguf"
    sys.modules[name].write_synthetic_gguf("tiny-k", gguf_path, seed=0)
    sources = []
    for quant, src in (("q4_k_m", gguf_path), ("q5_k_m", build_tiny_model("qwen3_moe").hf_dir)):
        out = tmp_path / f"{quant}.colibri"
        write_container(src, out, quant=quant)
        sources.append(out)
    for src in sources:
        manifest = open_model_source(src)
        sizes = {t.dtype for n, t in manifest.tensors.items() if "_exps." in n}
        assert len(sizes) >= 2, sizes  # experts really mix types
        with co.Model.load(src, engine=co.EngineConfig(cache=co.CacheConfig(history=False))) as m:
            core_bytes = m.stats().memory
            assert core_bytes is not None
            assert core_bytes.slot_bytes == expert_slot_bytes(manifest), src
