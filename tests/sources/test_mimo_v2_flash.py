"""MiMo-V2-Flash's config.json as colibri reads it: transformers' defaults for what a file
leaves out (layer types, MLP types, per-layer-type RoPE, the value scale, the window from
``sliding_window_size``), and the refusals (layer types of the wrong length, a RoPE variant
other than "default", layer types rotating different widths, a bad value scale). The
logits are tests/oracle/test_oracle_mimo_v2_flash.py's.
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
from support.mimo_v2_flash_factory import build_mimo


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    # 6 layers (transformers' default layer_types: full at 0 and 5), heads of 24 (its
    # default partial_rotary_factor 0.334 rotates int(24 * 0.334) = 8 of them)
    types = ["full_attention"] + ["sliding_attention"] * 4 + ["full_attention"]
    return build_mimo(tmp_path_factory.mktemp("mimo"), num_hidden_layers=6, layer_types=types,
                      mlp_layer_types=["dense"] + ["sparse"] * 5, head_dim=24)  # fmt: skip


def _edited(src: Path, dst: Path, edit: dict[str, Any], drop: tuple[str, ...] = ()) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key in drop:
        cfg.pop(key, None)
    cfg.update(edit)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_defaults_are_transformers(tiny: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    """A config.json without the per-layer keys reads as transformers' config class fills
    them in."""
    drop = ("layer_types", "mlp_layer_types", "rope_parameters", "attention_value_scale",
            "rms_norm_eps")  # fmt: skip
    d = _edited(tiny[0], tmp_path / "d", {}, drop)
    ours = load_hf(d).config
    theirs = transformers.AutoConfig.from_pretrained(d)
    assert ours.sliding_layers == tuple(t == "sliding_attention" for t in theirs.layer_types)
    assert ours.moe_layers == tuple(t == "sparse" for t in theirs.mlp_layer_types)
    rope = theirs.rope_parameters
    assert ours.rope_theta == rope["full_attention"]["rope_theta"] == 5e6
    assert ours.sliding_rope_theta == rope["sliding_attention"]["rope_theta"] == 1e4
    assert ours.rotary_dim == int(24 * rope["full_attention"]["partial_rotary_factor"]) == 8
    assert ours.attention_value_scale == theirs.attention_value_scale == 0.707
    assert ours.rms_norm_eps == theirs.rms_norm_eps == 1e-5


def test_window_from_sliding_window_size(tiny: tuple[Path, torch.nn.Module],
                                         tmp_path: Path) -> None:  # fmt: skip
    d = _edited(tiny[0], tmp_path / "d", {"sliding_window_size": 7}, ("sliding_window",))
    assert load_hf(d).config.sliding_window == 8 == transformers.AutoConfig.from_pretrained(
        d).sliding_window  # fmt: skip


def test_null_value_scale_is_one(tiny: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    d = _edited(tiny[0], tmp_path / "d", {"attention_value_scale": None})
    assert load_hf(d).config.attention_value_scale == 1.0


_R = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        ({"layer_types": ["full_attention"] * 3}, ModelFormatError, "layer_types"),
        ({"mlp_layer_types": ["moe"] * 6}, ModelFormatError, "mlp_layer_types"),
        ({"rope_parameters": {"full_attention": {**_R, "rope_type": "yarn"},
                              "sliding_attention": _R}}, UnsupportedError, "rope_type"),
        ({"rope_parameters": {"full_attention": {**_R, "partial_rotary_factor": 0.25},
                              "sliding_attention": _R}}, UnsupportedError, "different widths"),
        ({"rope_parameters": {"full_attention": _R}}, ModelFormatError, "sliding_attention"),
        # int(24 * 0.3) = 7 dimensions: transformers would rotate 8 with frequencies of a
        # 7-wide table; colibri refuses an odd width
        ({"rope_parameters": {"full_attention": {**_R, "partial_rotary_factor": 0.3},
                              "sliding_attention": {**_R, "partial_rotary_factor": 0.3}}},
         ModelFormatError, "even rotated width"),
        ({"attention_value_scale": -1.0}, ModelFormatError, "attention_value_scale"),
    ],
)
def test_refusals(tiny: tuple[Path, torch.nn.Module], tmp_path: Path, edit: dict[str, Any],
                  error: type[Exception], match: str) -> None:  # fmt: skip
    with pytest.raises(error, match=match):
        load_hf(_edited(tiny[0], tmp_path / "d", edit))
