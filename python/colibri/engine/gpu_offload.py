"""``EngineConfig.device`` at load, and ``Model.stats().gpu``.

``device="gpu"`` opens the adapter ``EngineConfig.gpu`` chooses (colibri.gpu) and hands
the core the linear layers of the first GPU slice (csrc/model/gpu_linear.hpp: attention
projections, dense FFN, shared experts, LM head; uploaded once, here); everything else runs
on the CPU. ``"auto"`` is the CPU until a GPU has been measured faster than the CPU path
(docs/gpu.md); ``"cpu"`` never looks for a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..display import Displayable, duration, size
from ..gpu import choose_adapter, library_path, list_adapters
from ..settings.config import EngineConfig

if TYPE_CHECKING:
    from .. import _core

__all__ = ["GPUMatrix", "GPUStats", "attach_device", "gpu_stats"]

ROUTED_EXPERTS_REASON = ("routed experts stream through the CPU's expert cache (no GPU "
                         "expert tier yet)")


def attach_device(core: _core.Engine, engine: EngineConfig) -> None:
    """Puts the linear layers on the GPU when ``engine.device`` is ``"gpu"``.

    Raises GPUUnavailableError naming what is missing (the wgpu package, a driver, an
    adapter matching ``engine.gpu.adapter``, limits large enough); the engine is then
    still whole on the CPU, for the caller to drop."""
    if engine.device != "gpu":  # "auto": the CPU until a GPU is measured faster
        return
    lib = library_path()
    adapter = choose_adapter(list_adapters(lib), engine.gpu.adapter)
    core.use_gpu(lib, adapter.index, engine.gpu.memory_budget or 0)


@dataclass(frozen=True, repr=False)
class GPUMatrix:
    """Where one resident matrix runs, and why when it stays on the CPU."""

    name: str
    dtype: str
    rows: int
    cols: int
    bytes: int
    on_gpu: bool
    reason: str  # empty when on_gpu


@dataclass(frozen=True, repr=False)
class GPUStats(Displayable):
    """The GPU's share of a model's work, cumulative since load (or ``reset_stats``)."""

    adapter: str  # the adapter's name, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
    backend: str  # "vulkan", "metal", "dx12"
    adapter_type: str  # "discrete", "integrated", "cpu" (a software adapter), "unknown"
    weight_bytes: int  # weights uploaded at load, resident on the device
    products: int  # matrix products run on the GPU (one per weight and forward)
    columns: int  # token rows those products multiplied (one matvec each)
    dispatches: int  # compute dispatches (one per matvec and binding-sized row chunk)
    bytes_uploaded: int  # activation bytes written to the device
    bytes_read_back: int  # result bytes read back
    seconds: float  # wall time inside the GPU calls: upload, compute and read back
    matrices: tuple[GPUMatrix, ...]  # every resident matrix: where it runs and why
    routed_experts: int  # routed experts (each three matrices), on the CPU in this slice

    @property
    def on_gpu(self) -> tuple[GPUMatrix, ...]:
        return tuple(m for m in self.matrices if m.on_gpu)

    @property
    def on_cpu(self) -> tuple[GPUMatrix, ...]:
        return tuple(m for m in self.matrices if not m.on_gpu)

    def cpu_reasons(self) -> dict[str, int]:
        """How many resident matrices stay on the CPU, by reason (routed experts included)."""
        out: dict[str, int] = {}
        for m in self.on_cpu:
            out[m.reason] = out.get(m.reason, 0) + 1
        if self.routed_experts:
            out[ROUTED_EXPERTS_REASON] = 3 * self.routed_experts
        return out

    def _display_rows(self) -> list[tuple[str, str]]:
        rows = [
            ("adapter", f"{self.adapter} ({self.backend}, {self.adapter_type})"),
            ("on the GPU", f"{len(self.on_gpu)} matrices, {size(self.weight_bytes)}"),
        ]
        rows += [("on the CPU", f"{n}: {why}") for why, n in self.cpu_reasons().items()]
        rows += [
            ("dispatches", f"{self.dispatches} ({self.products} products, {self.columns} columns)"),
            ("transfers", f"{size(self.bytes_uploaded)} up, {size(self.bytes_read_back)} back"),
            ("time in GPU calls", duration(self.seconds)),
        ]
        return rows


def gpu_stats(core: _core.Engine) -> GPUStats | None:
    """The core's GPU report as GPUStats; None when the model runs on the CPU only."""
    r: dict[str, Any] | None = core.gpu_report()
    if r is None:
        return None
    matrices = tuple(GPUMatrix(*m) for m in r["matrices"])
    return GPUStats(
        adapter=r["adapter"], backend=r["backend"], adapter_type=r["adapter_type"],
        weight_bytes=int(r["weight_bytes"]), products=int(r["products"]),
        columns=int(r["columns"]), dispatches=int(r["dispatches"]),
        bytes_uploaded=int(r["bytes_uploaded"]), bytes_read_back=int(r["bytes_read_back"]),
        seconds=float(r["seconds"]), matrices=matrices,
        routed_experts=int(core.streamed_experts),
    )  # fmt: skip
