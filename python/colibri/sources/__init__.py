"""Model sources: turn a path (GGUF file or Hugging Face directory) into a Manifest."""

from __future__ import annotations

from .manifest import Extent, Manifest, ModelConfig, TensorInfo

__all__ = ["Extent", "Manifest", "ModelConfig", "TensorInfo"]
