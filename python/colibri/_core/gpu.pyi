"""
GPU runtime: adapters, weight upload, matvec kernels.
"""
from __future__ import annotations
import numpy
import numpy.typing
import typing
__all__: list[str] = ['Device', 'Matrix', 'compiled', 'header_version', 'kernel_types', 'list_adapters']
class Device:
    """
    One opened GPU adapter (WebGPU).
    """
    def __init__(self, library_path: str, index: typing.SupportsInt | typing.SupportsIndex = 0, memory_budget: typing.SupportsInt | typing.SupportsIndex = 0, min_storage_binding: typing.SupportsInt | typing.SupportsIndex = 16777216) -> None:
        """
        Open adapter `index` of list_adapters(library_path); memory_budget: bytes of weights it may hold (0: no limit); min_storage_binding: refuse an adapter whose binding limit is smaller.
        """
    def dequantize(self, w: Matrix) -> numpy.typing.NDArray[numpy.float32]:
        """
        W as float32 [rows, cols], decoded by the GPU kernel's code.
        """
    def matvec(self, w: Matrix, x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32]) -> numpy.typing.NDArray[numpy.float32]:
        """
        y = W x on the device (float32).
        """
    def upload(self, dtype: str, data: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], rows: typing.SupportsInt | typing.SupportsIndex, cols: typing.SupportsInt | typing.SupportsIndex, split_bytes: typing.SupportsInt | typing.SupportsIndex = 0) -> Matrix:
        """
        Upload rows x cols weights in their GGUF block bytes, in chunks of at most split_bytes (0: the adapter's binding limit).
        """
    @property
    def adapter(self) -> dict[str, typing.Any]:
        ...
    @property
    def resident_bytes(self) -> int:
        ...
class Matrix:
    """
    A weight matrix uploaded to a GPU device, in row chunks.
    """
    @property
    def chunks(self) -> int:
        ...
    @property
    def cols(self) -> int:
        ...
    @property
    def dtype(self) -> str:
        ...
    @property
    def rows(self) -> int:
        ...
def compiled() -> bool:
    """
    Whether this build has the WebGPU runtime (it was compiled with wgpu's headers).
    """
def header_version() -> str:
    """
    The wgpu-native version whose headers this build was compiled with ('' if none).
    """
def kernel_types() -> list[str]:
    """
    Weight types with a GPU matvec kernel.
    """
def list_adapters(library_path: str) -> list[dict[str, typing.Any]]:
    """
    The Vulkan/Metal/DX12 adapters wgpu-native at this path reports.
    """
