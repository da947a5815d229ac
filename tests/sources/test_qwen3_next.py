"""Qwen3-Next checkpoints colibri must refuse with a clear error, before any weight runs:
a layer kind it does not implement, a layer schedule of the wrong length, and linear-
attention sizes (heads, head sizes, convolution width) that do not match the tensors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from colibri.errors import ModelFormatError, UnsupportedError
from colibri.sources import load_hf
from support.qwen3_next_factory import build_qwen3_next


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen3_next(tmp_path_factory.mktemp("qwen3-next-src"))[0]


def with_config(src: Path, dst: Path, **change: Any) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(change)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_the_checkpoint_reads(tiny: Path) -> None:
    m = load_hf(tiny)
    assert m.config.linear_layers == (True, False, True, False)
    assert m.tensors["blk.0.gdn_in_qkv"].shape == (2 * 2 * 8 + 4 * 8, 32)
    assert m.tensors["blk.0.gdn_conv"].shape == (64 * 4,)
    assert m.tensors["blk.1.attn_gate"].shape == (4 * 16, 32)


def test_the_mtp_weights_are_skipped_as_transformers_skips_them(tiny: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    d = shutil.copytree(tiny, tmp_path / "m")
    sd = load_file(d / "model.safetensors")
    sd["mtp.fc.weight"] = torch.zeros(32, 64)
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    m = load_hf(d)
    assert m.config.n_mtp_layers == 0 and not any("mtp" in n for n in m.tensors)


def test_the_default_schedule_is_transformers(tiny: Path, tmp_path: Path) -> None:
    cfg = json.loads((tiny / "config.json").read_text())
    del cfg["layer_types"]
    cfg["full_attention_interval"] = 2  # layers 1 and 3 full: the checkpoint's schedule
    d = shutil.copytree(tiny, tmp_path / "m")
    (d / "config.json").write_text(json.dumps(cfg))
    assert load_hf(d).config.linear_layers == (True, False, True, False)


def test_an_unknown_layer_kind_is_refused(tiny: Path, tmp_path: Path) -> None:
    kinds = ["linear_attention", "full_attention", "mamba", "full_attention"]
    d = with_config(tiny, tmp_path / "m", layer_types=kinds)
    with pytest.raises(UnsupportedError, match=r"layer_types\[2\] is 'mamba'"):
        load_hf(d)


def test_a_schedule_of_the_wrong_length_is_refused(tiny: Path, tmp_path: Path) -> None:
    d = with_config(tiny, tmp_path / "m", layer_types=["linear_attention", "full_attention"])
    with pytest.raises(ModelFormatError, match="layer_types must be a list of 4 layer kinds"):
        load_hf(d)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"linear_num_value_heads": 6}, "in_proj_(qkvz|ba).weight' has shape \\((96|8), 32\\), "
                                        "but the config implies (120|12) rows"),
        ({"linear_value_head_dim": 4}, "in_proj_qkvz.weight' has shape \\(96, 32\\)"),
        ({"linear_conv_kernel_dim": 3}, "'blk.0.gdn_conv' has shape \\(256,\\), but the config "
                                        "implies \\(192,\\)"),
        ({"linear_num_key_heads": 4}, "in_proj_(qkvz|ba).weight' has shape"),
    ],
)  # fmt: skip
def test_state_sizes_that_do_not_match_the_tensors_are_refused(
    tiny: Path, tmp_path: Path, change: dict[str, int], message: str
) -> None:
    d = with_config(tiny, tmp_path / "m", **change)
    with pytest.raises(ModelFormatError, match=message):
        load_hf(d)


def test_value_heads_must_group_over_key_heads(tiny: Path, tmp_path: Path) -> None:
    """4 value heads cannot share 3 key heads; refused whatever the tensors say."""
    d = with_config(tiny, tmp_path / "m", linear_num_key_heads=3)
    with pytest.raises(ModelFormatError, match="not a multiple of"):
        load_hf(d)


def test_the_budget_counts_the_state_and_the_work_buffers(tiny: Path) -> None:
    """Per session the state (F32, any context): 2 linear layers x (3 history rows of 64
    channels + 4 heads' 8 x 8 matrices); per token of a forward the linear layer's buffers
    (2 x 64 channels, 2 x 32 for z and the outputs, 2 x 4 for b and a) and the gate's 64."""
    from colibri.sources.linear_attn import linear_state_bytes, linear_work_floats

    cfg = load_hf(tiny).config
    assert linear_state_bytes(cfg) == 4 * 2 * (3 * 64 + 4 * 8 * 8)
    assert linear_work_floats(cfg) == 64 + 2 * 64 + 2 * 32 + 2 * 4
