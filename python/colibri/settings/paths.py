"""Where colibri keeps files by default: the model cache and, beside it, routing
histories. Reads the environment (XDG_CACHE_HOME), so only when called."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_cache_dir", "default_history_dir"]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/colibri/models``, or ``~/.cache/colibri/models`` when that variable
    is unset or empty (it must be an absolute path to count, as the XDG spec says)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "colibri" / "models"


def default_history_dir() -> Path:
    """Where routing histories go when ``CacheConfig.history_path`` is None:
    ``routing/`` beside the model cache (``$XDG_CACHE_HOME/colibri/routing``, else
    ``~/.cache/colibri/routing``)."""
    return default_cache_dir().parent / "routing"
