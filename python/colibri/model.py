"""Model and Session: the Python face of a loaded model.

``Model.load`` turns a path into a manifest (sources/), builds the core's spec from it and
loads the weights through their extents. A ``Session`` owns one KV cache; many sessions can
share a model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt

from . import _core
from .config import EngineConfig, ThreadConfig, WaitPolicy
from .errors import InvalidRequestError, TokenOutOfRangeError
from .rope import rope_table
from .sources import Manifest, ModelConfig, open_model_source

_QK_NORM = {"none": _core.QkNorm.none, "head": _core.QkNorm.head, "full": _core.QkNorm.full}
_WAIT = {
    WaitPolicy.SPIN: _core.WaitPolicy.SPIN,
    WaitPolicy.PASSIVE: _core.WaitPolicy.PASSIVE,
    WaitPolicy.HYBRID: _core.WaitPolicy.HYBRID,
}


def _thread_settings(cfg: ThreadConfig) -> _core.ThreadSettings:
    settings = _core.ThreadSettings()
    settings.n_threads = cfg.team_size()
    settings.policy = _WAIT[cfg.wait_policy]
    settings.spin_us = cfg.spin_us
    return settings


def _context_length(cfg: ModelConfig, engine: EngineConfig) -> int:
    # The KV cache is allocated per session for the whole context (see EngineConfig).
    return engine.resolve_context_length(cfg.max_position_embeddings)


def _model_spec(cfg: ModelConfig, context_length: int) -> _core.ModelSpec:
    spec = _core.ModelSpec()
    spec.arch = cfg.arch
    spec.vocab_size = cfg.vocab_size
    spec.hidden_size = cfg.hidden_size
    spec.n_layers = cfg.n_layers
    spec.n_heads = cfg.n_heads
    spec.n_kv_heads = cfg.n_kv_heads
    spec.head_dim = cfg.head_dim
    spec.intermediate_size = cfg.intermediate_size
    spec.rms_norm_eps = cfg.rms_norm_eps
    rope = rope_table(
        cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings
    )
    spec.rope_inv_freq = rope.inv_freq.tolist()
    spec.rope_attention_factor = rope.attention_factor
    spec.qk_norm = _QK_NORM[cfg.qk_norm]
    spec.attention_bias = cfg.attention_bias
    spec.n_experts = cfg.n_experts
    spec.n_experts_per_tok = cfg.n_experts_per_tok
    spec.moe_intermediate_size = cfg.moe_intermediate_size
    spec.norm_topk_prob = cfg.norm_topk_prob
    spec.shared_expert_intermediate_size = cfg.shared_expert_intermediate_size
    spec.moe_layers = [1 if m else 0 for m in cfg.moe_layers]
    spec.tie_word_embeddings = cfg.tie_word_embeddings
    spec.context_length = context_length
    return spec


def _tensor_specs(manifest: Manifest) -> list[_core.TensorSpec]:
    return [
        _core.TensorSpec(
            t.name,
            t.dtype,
            list(t.shape),
            [_core.Extent(e.file, e.offset, e.length) for e in t.extents],
            t.rope_unpermute_heads,
        )
        for t in manifest.tensors.values()
    ]


class Model:
    """A loaded model. Use :meth:`load`; close it (or use ``with``) to free its memory."""

    def __init__(self, manifest: Manifest, engine: EngineConfig, core: _core.Engine) -> None:
        self._manifest = manifest
        self._engine_config = engine
        self._core: _core.Engine | None = core
        self._context_length = _context_length(manifest.config, engine)

    @classmethod
    def load(cls, path: str | Path, engine: EngineConfig | None = None) -> Model:
        """Loads a GGUF file or a Hugging Face checkpoint directory."""
        engine = engine if engine is not None else EngineConfig()
        manifest = open_model_source(Path(path))
        spec = _model_spec(manifest.config, _context_length(manifest.config, engine))
        core = _core.Engine(
            spec,
            _tensor_specs(manifest),
            [str(f) for f in manifest.files],
            _thread_settings(engine.threads),
        )
        return cls(manifest, engine, core)

    @property
    def config(self) -> ModelConfig:
        return self._manifest.config

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def engine_config(self) -> EngineConfig:
        return self._engine_config

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def threads(self) -> ThreadConfig:
        return self._engine_config.threads

    def set_threads(self, threads: ThreadConfig) -> None:
        """Changes the team size or wait policy; takes effect from the next call."""
        self._require_core().configure_threads(_thread_settings(threads))
        self._engine_config = self._engine_config.replace(threads=threads)

    def session(self) -> Session:
        return Session(self, _core.Session(self._require_core(), self._context_length))

    def close(self) -> None:
        self._core = None

    def __enter__(self) -> Model:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _require_core(self) -> _core.Engine:
        if self._core is None:
            raise InvalidRequestError("the model is closed; load it again to use it")
        return self._core


class Session:
    """One conversation's state (KV cache) on a model."""

    def __init__(self, model: Model, core: _core.Session) -> None:
        self._model = model
        self._core = core

    @property
    def n_tokens(self) -> int:
        """Tokens currently in the KV cache."""
        return int(self._core.n_tokens)

    @property
    def context_length(self) -> int:
        return int(self._core.context_length)

    def forward(
        self, token_ids: Sequence[int] | npt.ArrayLike, *, all_logits: bool = False
    ) -> npt.NDArray[np.float32]:
        """Appends tokens and returns logits: ``[vocab]`` for the last position, or
        ``[n, vocab]`` for every position when ``all_logits``."""
        ids = self._check_ids(token_ids)
        result: npt.NDArray[np.float32] = self._core.forward(ids, all_logits)
        return result

    def reset(self) -> None:
        """Empties the KV cache."""
        self._core.reset()

    def rollback(self, n: int) -> None:
        """Forgets the last ``n`` tokens."""
        self._core.rollback(int(n))

    def _check_ids(self, token_ids: Sequence[int] | npt.ArrayLike) -> npt.NDArray[np.int32]:
        arr = np.asarray(token_ids)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        if arr.ndim != 1:
            raise InvalidRequestError(f"token ids must be a 1-D sequence, got shape {arr.shape}")
        if arr.size == 0:
            raise InvalidRequestError("forward needs at least one token id")
        if not np.issubdtype(arr.dtype, np.integer):
            raise InvalidRequestError(f"token ids must be integers, got dtype {arr.dtype}")
        vocab = self._model.config.vocab_size
        bad = np.flatnonzero((arr < 0) | (arr >= vocab))
        if bad.size:
            i = int(bad[0])
            raise TokenOutOfRangeError(
                f"token id {int(arr[i])} at index {i} is outside the vocabulary [0, {vocab})"
            )
        return arr.astype(np.int32)
