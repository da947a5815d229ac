"""colibri: run huge Mixture-of-Experts language models on ordinary machines.

    import colibri
    model = colibri.Model.load("model.gguf", engine=colibri.EngineConfig(...))
    logits = model.session().forward([1, 2, 3])
"""

from __future__ import annotations

import pkgutil

# Development builds place the native module in build/dev/<name>/colibri/ (see
# dev-build.sh); extending the package path lets `colibri._core` (and `colibri._bench`)
# be found there.
__path__ = pkgutil.extend_path(__path__, __name__)

from . import errors
from ._version import __version__
from .engine.budget import BudgetPlan
from .engine.gpu_offload import GPUStats
from .engine.stats import ExpertStats, MemoryStats, PhaseTimes
from .generate.generation import Chunk, Generation, GenerationStats
from .generate.session import Session
from .generate.structured import Choice, Grammar, JsonSchema, Regex
from .model import Model, ModelStats
from .sampling import Sampler, Sampling, StopChecker
from .settings.config import (
    CacheConfig,
    CachePolicy,
    ClusterConfig,
    EngineConfig,
    GPUConfig,
    IOConfig,
    SpecConfig,
    ThreadConfig,
    WaitPolicy,
    format_bytes,
    parse_bytes,
)
from .tokenizers import Tokenizer

__all__ = [
    "BudgetPlan",
    "CacheConfig",
    "CachePolicy",
    "Choice",
    "Chunk",
    "ClusterConfig",
    "EngineConfig",
    "ExpertStats",
    "GPUConfig",
    "GPUStats",
    "Generation",
    "GenerationStats",
    "Grammar",
    "IOConfig",
    "JsonSchema",
    "MemoryStats",
    "Model",
    "ModelStats",
    "PhaseTimes",
    "Regex",
    "Sampler",
    "Sampling",
    "Session",
    "SpecConfig",
    "StopChecker",
    "ThreadConfig",
    "Tokenizer",
    "WaitPolicy",
    "__version__",
    "errors",
    "format_bytes",
    "parse_bytes",
]
