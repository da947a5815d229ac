"""GPUConfig: which GPU adapter colibri opens and how much of its memory it may fill.

Validated like every other settings class (an unknown name or a bad value raises
:class:`colibri.errors.ConfigError` naming the field and, for a misspelling, the closest
name). It is ``EngineConfig.gpu``, used with ``EngineConfig(device="gpu")`` (docs/gpu.md:
what runs on the GPU so far); ``colibri.gpu.open_device`` takes it too.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..sizes import format_bytes, parse_bytes
from .fields import MAX_RAM_BUDGET
from .table import Check, Flag, Setting, Settings

__all__ = ["GPUConfig"]

MAX_ADAPTER_INDEX = 255


def _adapter_flag(text: str) -> int | str:
    """``--gpu-adapter``'s text: an index when it is all digits, else part of a name."""
    return int(text) if text.strip().isdigit() else text


def _adapter(field: str, value: object) -> int | str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{field}: expected an adapter index (int), part of an adapter's "
                          f"name (str) or None (the first GPU), got {type(value).__name__} "
                          f"{value!r}")
    if isinstance(value, int):
        if not 0 <= value <= MAX_ADAPTER_INDEX:
            raise ConfigError(f"{field}: index {value} is out of range; allowed "
                              f"0..{MAX_ADAPTER_INDEX} (colibri doctor lists the adapters)")
        return value
    if not value.strip():
        raise ConfigError(f"{field}: an empty name matches every adapter; give part of one "
                          "(colibri doctor lists them) or None")
    return value.strip()


def _memory_budget(field: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ConfigError(f"{field}: expected bytes (int) or a size such as \"6GiB\", got "
                          f"{type(value).__name__} {value!r} (or None: no limit)")
    try:
        n = parse_bytes(value)
    except ConfigError as e:
        raise ConfigError(f"{field}: {e}") from None
    if not 0 < n <= MAX_RAM_BUDGET:
        raise ConfigError(f"{field}: {value!r} is out of range; allowed 1 byte.."
                          f"{format_bytes(MAX_RAM_BUDGET)} (or None: no limit)")
    return n


ADAPTER: Check[int | str | None] = Check(_adapter)
MEMORY_BUDGET: Check[int | None] = Check(_memory_budget, size=True)


class GPUConfig(Settings):
    """Which GPU adapter to open and how much of its memory colibri may fill.

    ``GPUConfig(adapter=None, memory_budget=None)`` is the default: the first discrete
    GPU, else the first integrated one, else any adapter (lavapipe, a CPU); no memory
    limit beyond the adapter's own.
    """

    adapter: Setting[int | str | None, int | str | None] = Setting(
        ADAPTER, default=None,
        doc="the adapter: its index in colibri doctor's list, part of its name "
            "(case-insensitive), or None for the first discrete, then integrated GPU",
        flag=Flag("--gpu-adapter", metavar="N|NAME", parse=_adapter_flag,
                  default_text="the first discrete, then integrated GPU, then any"))
    """The adapter to open: an index into :func:`colibri.gpu.list_adapters` (the order
    ``colibri doctor`` prints), a case-insensitive part of its name (``"nvidia"``,
    ``"llvmpipe"``), or ``None`` (default): the first discrete GPU, else the first
    integrated one, else the first adapter of any kind."""

    memory_budget: Setting[int | str | None, int | None] = Setting(
        MEMORY_BUDGET, default=None,
        doc="bytes of GPU memory weights may take on the device, e.g. 6GiB; None: no limit",
        flag=Flag("--gpu-memory-budget", metavar="SIZE", default_text="no limit"))
    """Bytes of GPU memory the uploaded weights may take (an int or a size text such as
    ``"6GiB"``). In a model load, a matrix that would pass it stays on the CPU (and
    ``Model.stats().gpu`` says so); a direct ``Device.upload`` past it raises
    :class:`colibri.errors.InvalidRequestError`.
    ``None`` (default): no limit beyond the adapter's (WebGPU does not report how much
    memory an adapter has)."""
