"""Formats that misbehave on purpose, to check the gate itself (test_fuzz.py): a child that
reads the decoy next to its model directory must be reported by the audit."""

from __future__ import annotations

import random
from pathlib import Path

from .formats import Format, outside_dir, register


def _probe_mutant(rng: random.Random, seeds: Path, model_dir: Path) -> tuple[Path, str]:
    (model_dir / "model.gguf").write_bytes(b"GGUF")
    return model_dir / "model.gguf", "probe"


def _reads_decoy(entry: Path, index: int) -> None:
    (Path(outside_dir(entry.parent)) / "secret.json").read_bytes()


register(Format("probe-read", _probe_mutant, _reads_decoy))
