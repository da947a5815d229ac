"""The Python mirror of the expert store's slot layout (colibri.streaming.expert_slot_bytes,
used to state the minimum budget before any weight is read) agrees with the core's."""

from __future__ import annotations

from pathlib import Path

import pytest

import colibri as co
from colibri.convert import write_container
from colibri.sources import open_model_source
from colibri.streaming import expert_slot_bytes
from modelfactory import build_tiny_model


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
