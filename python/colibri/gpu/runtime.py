"""Finding wgpu-native, listing adapters and opening one as configured.

The core loads wgpu-native with dlopen from the path given here and reads no environment
variable; the path is the library inside the installed ``wgpu`` package, found without
importing it. Which Vulkan driver answers is the Vulkan loader's business: the standard
``VK_ICD_FILENAMES`` / ``VK_DRIVER_FILES`` variables select one (the tests point them at
Mesa's lavapipe).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import GPUUnavailableError
from ..settings.gpu import GPUConfig
from ..sizes import format_bytes

if TYPE_CHECKING:
    from .._core.gpu import Device

__all__ = ["Adapter", "adapter_lines", "choose_adapter", "library_path", "list_adapters",
           "open_device"]

_LIBRARY_PATTERNS = ("libwgpu_native*.so", "libwgpu_native*.dylib", "wgpu_native*.dll")
_INSTALL_HINT = "pip install 'colibri[gpu]' (or pip install wgpu)"
_PREFERENCE = ("discrete", "integrated")  # what adapter=None looks for, in this order


@dataclass(frozen=True)
class Adapter:
    """One GPU adapter as wgpu-native reports it (Vulkan, Metal or DX12)."""

    index: int
    name: str
    vendor: str
    description: str
    backend: str  # "vulkan", "metal", "dx12", ...
    adapter_type: str  # "discrete", "integrated", "cpu", "unknown"
    vendor_id: int
    device_id: int
    max_storage_binding_size: int
    max_buffer_size: int
    max_workgroup_storage: int
    max_workgroup_invocations: int
    max_workgroups_per_dimension: int
    shader_f16: bool
    subgroups: bool

    @classmethod
    def from_core(cls, index: int, d: dict[str, Any]) -> Adapter:
        return cls(index=index, **{f.name: d[f.name] for f in fields(cls) if f.name != "index"})


def library_path() -> str:
    """The wgpu-native library inside the installed ``wgpu`` package.

    Raises GPUUnavailableError when the package or its library is missing."""
    spec = importlib.util.find_spec("wgpu")
    if spec is None or spec.origin is None:
        raise GPUUnavailableError(
            f"no GPU runtime: the wgpu package is not installed ({_INSTALL_HINT}); it carries "
            "wgpu-native, the library colibri's GPU code runs on")
    resources = Path(spec.origin).parent / "resources"
    for pattern in _LIBRARY_PATTERNS:
        found = sorted(resources.glob(pattern))
        if found:
            return str(found[0])
    raise GPUUnavailableError(f"the wgpu package has no wgpu-native library in {resources} "
                              f"(reinstall it: {_INSTALL_HINT})")


def list_adapters(path: str | None = None) -> list[Adapter]:
    """The adapters wgpu-native finds, in its order (the indices GPUConfig.adapter takes).

    Raises GPUUnavailableError when there is no runtime (no wgpu, or a build without
    the GPU part); an empty list means a runtime but no Vulkan/Metal/DX12 driver."""
    from .. import _core

    lib = library_path() if path is None else path
    return [Adapter.from_core(i, d) for i, d in enumerate(_core.gpu.list_adapters(lib))]


def _names(adapters: list[Adapter]) -> str:
    return "; ".join(f"{a.index}: {a.name} ({a.backend}, {a.adapter_type})" for a in adapters)


def choose_adapter(adapters: list[Adapter], choice: int | str | None) -> Adapter:
    """The adapter GPUConfig.adapter names among `adapters` (see GPUConfig)."""
    if not adapters:
        raise GPUUnavailableError(
            "no GPU adapter found: no Vulkan, Metal or DX12 driver answered (on Linux, "
            "install the GPU's Vulkan driver, or mesa-vulkan-drivers for lavapipe, a "
            "software one)")
    if choice is None:
        for kind in _PREFERENCE:
            for a in adapters:
                if a.adapter_type == kind:
                    return a
        return adapters[0]
    if isinstance(choice, int):
        if choice >= len(adapters):
            raise GPUUnavailableError(f"GPUConfig.adapter={choice}: only {len(adapters)} "
                                      f"adapter(s) found: {_names(adapters)}")
        return adapters[choice]
    for a in adapters:
        if choice.lower() in a.name.lower():
            return a
    raise GPUUnavailableError(f"GPUConfig.adapter={choice!r} matches no adapter's name; "
                              f"found: {_names(adapters)}")


def open_device(config: GPUConfig | None = None) -> Device:
    """Opens the adapter `config` chooses, with its memory budget.

    Raises GPUUnavailableError naming what is missing: the wgpu package, a driver, an
    adapter matching the choice, or limits large enough for the kernels."""
    from .. import _core

    cfg = GPUConfig() if config is None else config
    lib = library_path()
    adapter = choose_adapter(list_adapters(lib), cfg.adapter)
    return _core.gpu.Device(lib, adapter.index, memory_budget=cfg.memory_budget or 0)


def adapter_lines(adapters: list[Adapter]) -> list[str]:
    """``colibri doctor``'s lines for the adapters."""
    if not adapters:
        return ["  no GPU adapter (no Vulkan, Metal or DX12 driver answered)"]
    lines = []
    for a in adapters:
        features = ", ".join(n for n, on in (("shader-f16", a.shader_f16),
                                             ("subgroups", a.subgroups)) if on) or "none"
        lines += [
            f"  {a.index}: {a.name} ({a.backend}, {a.adapter_type})",
            f"     largest binding {format_bytes(a.max_storage_binding_size)}, "
            f"largest buffer {format_bytes(a.max_buffer_size)}, "
            f"workgroup memory {format_bytes(a.max_workgroup_storage)}; features: {features}",
        ]
    return lines
