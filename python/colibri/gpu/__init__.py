"""colibri.gpu: the Python side of the GPU runtime (csrc/gpu/, WebGPU through wgpu-native).

What exists today (docs/gpu.md): adapter discovery, opening a device, and matrix-vector
kernels for the weight types in docs/gpu.md's table, tested on lavapipe; with
``EngineConfig(device="gpu")`` a model's linear layers run on them (colibri.engine.
gpu_offload), the rest of the forward pass on the CPU. The runtime's library comes from
the ``wgpu`` package (the ``gpu`` extra); colibri imports and runs on the CPU without it.
"""

from .runtime import (
    Adapter,
    adapter_lines,
    choose_adapter,
    library_path,
    list_adapters,
    open_device,
)

__all__ = [
    "Adapter",
    "adapter_lines",
    "choose_adapter",
    "library_path",
    "list_adapters",
    "open_device",
]
