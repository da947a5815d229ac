"""colibri: run huge Mixture-of-Experts language models on ordinary machines.

    import colibri
    model = colibri.Model.load("model.gguf", engine=colibri.EngineConfig(...))
    logits = model.session().forward([1, 2, 3])
"""

from __future__ import annotations

import pkgutil

# Development builds place the native module in build/dev/<name>/colibri/ (see
# dev-build.sh); extending the package path lets `colibri._core` be found there.
__path__ = pkgutil.extend_path(__path__, __name__)

from . import errors  # noqa: E402
from .config import EngineConfig, ThreadConfig, WaitPolicy  # noqa: E402
from .generation import Chunk, Generation, GenerationStats  # noqa: E402
from .model import Model, ModelStats, Session  # noqa: E402
from .sampling import Sampler, Sampling, StopChecker  # noqa: E402
from .tokenizers import Tokenizer  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Chunk",
    "EngineConfig",
    "Generation",
    "GenerationStats",
    "Model",
    "ModelStats",
    "Sampler",
    "Sampling",
    "Session",
    "StopChecker",
    "Tokenizer",
    "ThreadConfig",
    "WaitPolicy",
    "__version__",
    "errors",
]
