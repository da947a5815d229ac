"""Exceptions raised by colibri.

Every failure a user can cause or meet (a bad path, a corrupt model, a bad setting, a
prompt that does not fit) raises a subclass of :class:`ColibriError` whose message says what
is wrong and what to do. Classes also derive from the matching built-in exception
(``ValueError``, ``OSError``, ``FileNotFoundError``) so generic handlers keep working.
"""

from __future__ import annotations


class ColibriError(Exception):
    """Base class of every colibri error."""


class ConfigError(ColibriError, ValueError):
    """A setting has an unknown name or an invalid value."""


class InvalidRequestError(ColibriError, ValueError):
    """A call's arguments are invalid (an empty token list, rolling back more than exists)."""


class ModelNotFoundError(ColibriError, FileNotFoundError):
    """The model path does not exist."""


class ModelFormatError(ColibriError, ValueError):
    """The files are not a model colibri can read, or they are truncated or corrupt."""


class UnsupportedArchitectureError(ModelFormatError):
    """The model's architecture is not one colibri implements."""


class NumericalError(ModelFormatError):
    """The model computed NaN or infinite values: its weights (or a setting that passed the
    load checks) are broken. A fault of the model, never of the request."""


class UnsupportedError(ColibriError, NotImplementedError):
    """A feature (for example a tensor type) this build does not implement."""


class ModelIOError(ColibriError, OSError):
    """Reading model bytes from disk failed or returned fewer bytes than expected."""


class TokenOutOfRangeError(ColibriError, ValueError):
    """A token id is outside the model's vocabulary."""


class ContextOverflowError(ColibriError, ValueError):
    """More tokens than the context (KV cache) holds."""


class GPUUnavailableError(ColibriError, RuntimeError):
    """No usable GPU: the ``wgpu`` package (its wgpu-native library) is missing, no
    Vulkan/Metal adapter was found, the adapter's limits are too small, or the device was
    lost. The message names which; the CPU path is unaffected."""


class ClusterError(ColibriError, ConnectionError):
    """An expert cluster (``EngineConfig.cluster``) cannot serve: its Ray address does not
    answer, a worker runs another model file (fingerprint), or a worker failed or answered
    wrongly during a forward. The message names the worker and what to do."""


class InternalError(ColibriError, RuntimeError):
    """A broken invariant inside colibri: a bug, please report it."""


__all__ = [
    "ClusterError",
    "ColibriError",
    "ConfigError",
    "ContextOverflowError",
    "GPUUnavailableError",
    "InternalError",
    "InvalidRequestError",
    "ModelFormatError",
    "ModelIOError",
    "ModelNotFoundError",
    "NumericalError",
    "TokenOutOfRangeError",
    "UnsupportedArchitectureError",
    "UnsupportedError",
]
