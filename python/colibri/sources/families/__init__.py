"""The model families colibri runs, one module each (docs/format.md, "Adding a family").

A family module declares a :class:`~.spec.Family`: its Hugging Face ``model_type``s and
architecture classes, its GGUF architectures, its tensor names, its config normalization
from config.json and from GGUF metadata, and what the core runs for it. The format
readers (hf_config.py, hf_source.py, gguf_source.py, native_source.py, validate.py) look
the family up here and ask it for everything family-specific.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import UnsupportedArchitectureError
from ..paths import shown
from . import (
    deepseek,
    deepseek_v4,
    glm,
    gpt_oss,
    kimi_linear,
    llama,
    mimo_v2_flash,
    minimax_m2,
    olmoe,
    qwen3_next,
    qwen_moe,
)
from .spec import Family, GGUFInput, HFInput

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    qwen_moe.FAMILY,
    olmoe.FAMILY,
    deepseek.FAMILY,
    glm.FAMILY,
    gpt_oss.FAMILY,
    minimax_m2.FAMILY,
    deepseek_v4.FAMILY,
    qwen3_next.FAMILY,
    mimo_v2_flash.FAMILY,
    kimi_linear.FAMILY,
)

# Families the forward pass implements, by canonical name (ModelConfig.arch).
SUPPORTED_FAMILIES: tuple[str, ...] = tuple(a for f in FAMILIES for a in f.archs)
# GGUF general.architecture values the GGUF reader understands.
GGUF_ARCHITECTURES: tuple[str, ...] = tuple(a for f in FAMILIES for a in f.gguf_architectures)

_BY_ARCH = {a: f for f in FAMILIES for a in f.archs}
_BY_GGUF = {a: f for f in FAMILIES for a in f.gguf_architectures}
_HF_MODEL_TYPES = {t: a for f in FAMILIES for t, a in f.hf_model_types.items()}
_HF_ARCH_CLASSES = {c: a for f in FAMILIES for c, a in f.hf_arch_classes.items()}


def unsupported_architecture(
    found: str, where: object, supported: Sequence[str]
) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(
        f"{where}: architecture {shown(found)} is not supported. Supported architectures: "
        f"{', '.join(supported)}."
    )


def family_of(arch: str) -> Family:
    """The family that produces ModelConfig.arch ``arch`` (one of SUPPORTED_FAMILIES)."""
    return _BY_ARCH[arch]


def hf_family(cfg: Mapping[str, Any], where: Path) -> tuple[Family, str]:
    """The family and arch a config.json names: its ``model_type``, else the first of its
    ``architectures`` colibri knows. UnsupportedArchitectureError for anything else."""
    mt = cfg.get("model_type", "")
    if isinstance(mt, str) and mt in _HF_MODEL_TYPES:
        return _BY_ARCH[_HF_MODEL_TYPES[mt]], _HF_MODEL_TYPES[mt]
    archs = cfg.get("architectures") or []
    archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    for a in archs:
        if a in _HF_ARCH_CLASSES:
            return _BY_ARCH[_HF_ARCH_CLASSES[a]], _HF_ARCH_CLASSES[a]
    found = (mt if isinstance(mt, str) else "") or ", ".join(archs) or "<none>"
    raise unsupported_architecture(found, where, SUPPORTED_FAMILIES)


def gguf_family(arch: Any, where: Path) -> Family:
    """The family of GGUF ``general.architecture`` ``arch``."""
    fam = _BY_GGUF.get(arch) if isinstance(arch, str) else None
    if fam is None:
        found = arch if isinstance(arch, str) and arch else "<missing>"
        raise unsupported_architecture(found[:60], where, GGUF_ARCHITECTURES)
    return fam


__all__ = [
    "FAMILIES",
    "GGUF_ARCHITECTURES",
    "SUPPORTED_FAMILIES",
    "Family",
    "GGUFInput",
    "HFInput",
    "family_of",
    "gguf_family",
    "hf_family",
    "unsupported_architecture",
]
