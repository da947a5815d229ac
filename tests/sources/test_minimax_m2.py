"""MiniMax-M2's config.json as colibri reads it: the rotated width from
``partial_rotary_factor`` or the released files' ``rotary_dim`` exactly as transformers reads
them, the routing fields, and the refusals (a non-sigmoid ``scoring_func``, a rotated width
larger than the head). The logits are tests/oracle/test_oracle_minimax_m2.py's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from colibri.errors import ModelFormatError, UnsupportedError
from colibri.sources import load_hf
from support.minimax_m2_factory import build_minimax_m2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    return build_minimax_m2(tmp_path_factory.mktemp("minimax-m2"))


def _edited(src: Path, dst: Path, edit: dict[str, Any], drop: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key in drop:
        cfg.pop(key, None)
    cfg.update(edit)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_routing_and_attention_fields(tiny: tuple[Path, torch.nn.Module]) -> None:
    cfg = load_hf(tiny[0]).config
    assert cfg.arch == "minimax_m2" and cfg.qk_norm == "full"
    assert (cfg.router, cfg.n_group, cfg.topk_group) == ("sigmoid_grouped", 1, 1)
    assert cfg.router_bias and cfg.norm_topk_prob and cfg.routed_scaling_factor == 1.0
    assert cfg.shared_expert_intermediate_size == 0 and all(cfg.moe_layers)
    assert (cfg.n_experts, cfg.n_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 16)


ROPE = {"rope_type": "default", "rope_theta": 10000.0}


@pytest.mark.parametrize(
    ("edit", "drop"),
    [
        ({"rotary_dim": 4, "rope_parameters": ROPE}, ()),  # the released files' key alone
        ({"rotary_dim": 4, "rope_theta": 10000.0}, ("rope_parameters",)),  # older layout
        ({"rotary_dim": 8, "rope_parameters": {**ROPE, "partial_rotary_factor": 0.75}}, ()),
        ({"rope_parameters": ROPE}, ("rotary_dim",)),  # neither: the whole head
    ],
)
def test_rotary_dim_is_read_as_transformers_reads_it(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path, edit: dict[str, Any],
    drop: tuple[str, ...],
) -> None:  # fmt: skip
    d = _edited(tiny[0], tmp_path / "m", edit, drop)
    ref = transformers.AutoConfig.from_pretrained(d)
    prf = ref.rope_parameters.get("partial_rotary_factor", 1.0)
    assert load_hf(d).config.rotary_dim == int(ref.head_dim * prf)


def test_a_scoring_func_other_than_sigmoid_is_refused(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    d = _edited(tiny[0], tmp_path / "m", {"scoring_func": "softmax"})
    with pytest.raises(UnsupportedError, match="scoring_func 'softmax'"):
        load_hf(d)


def test_a_rotated_width_beyond_the_head_is_refused(
    tiny: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    d = _edited(tiny[0], tmp_path / "m", {"rotary_dim": 32, "rope_parameters": ROPE})
    with pytest.raises(ModelFormatError, match="partial_rotary_factor 2.0 > 1"):
        load_hf(d)
