"""A copy of a tiny Hugging Face checkpoint with one tensor or config value changed: the
oracle tests' mutation and bad-input checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def with_tensor(src: Path, dst: Path, name: str, value: torch.Tensor) -> Path:
    """`src` copied to `dst` with tensor `name` (which must exist) replaced by `value`."""
    shutil.copytree(src, dst)
    sd = load_file(src / "model.safetensors")
    assert name in sd, sorted(sd)
    sd[name] = value
    save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def with_config(src: Path, dst: Path, **over: object) -> Path:
    """`src` copied to `dst` with config.json's keys in `over` set."""
    shutil.copytree(src, dst)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(over)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst
