"""
Block kernels and matmul (tests and benchmarks).
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
__all__: list[str] = ['act_type', 'available_isas', 'best_isa', 'dequantize', 'fp8_dequantize', 'fp8_matmul', 'get_rows', 'has_kernels', 'iq_table', 'isa_names', 'matmul', 'matmul_multi', 'pack_lanes', 'quantize', 'row_bytes', 'type_info', 'type_names', 'vec_dot']
def act_type(dtype: str) -> str:
    """
    The activation format the dtype's dot product consumes.
    """
def available_isas() -> list[str]:
    """
    ISAs compiled in and supported by this CPU (scalar first).
    """
def best_isa() -> str:
    ...
def dequantize(dtype: str, data: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], rows: typing.SupportsInt | typing.SupportsIndex, cols: typing.SupportsInt | typing.SupportsIndex, isa: str | None = None) -> numpy.typing.NDArray[numpy.float32]:
    """
    uint8 bytes -> float32 [rows, cols]; isa=None: the best ISA.
    """
def fp8_dequantize(codes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], scales: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], rows: typing.SupportsInt | typing.SupportsIndex, cols: typing.SupportsInt | typing.SupportsIndex, block_rows: typing.SupportsInt | typing.SupportsIndex, block_cols: typing.SupportsInt | typing.SupportsIndex) -> numpy.typing.NDArray[numpy.float32]:
    """
    W as float32 (e4m3 * scale, as DeepSeek's weight_dequant).
    """
def fp8_matmul(codes: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], scales: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], rows: typing.SupportsInt | typing.SupportsIndex, cols: typing.SupportsInt | typing.SupportsIndex, block_rows: typing.SupportsInt | typing.SupportsIndex, block_cols: typing.SupportsInt | typing.SupportsIndex, x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], threads: typing.SupportsInt | typing.SupportsIndex = 1, isa: str | None = None) -> numpy.typing.NDArray[numpy.float32]:
    """
    y = x W^T for an F8_E4M3 weight with its F32 block scales; isa None: the best.
    """
def get_rows(dtype: str, w: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], rows: typing.SupportsInt | typing.SupportsIndex, cols: typing.SupportsInt | typing.SupportsIndex, ids: typing.Annotated[numpy.typing.ArrayLike, numpy.int32], lanes: bool = False) -> numpy.typing.NDArray[numpy.float32]:
    """
    Embedding lookup: dequantized rows ids -> float32 [len(ids), cols].
    """
def has_kernels(dtype: str, isa: str) -> bool:
    ...
def iq_table(name: str) -> numpy.typing.NDArray[numpy.uint8]:
    """
    Raw bytes of a compiled i-quant table (little-endian entries, element 0 lowest).
    """
def isa_names() -> list[str]:
    """
    Every ISA name the dispatcher knows.
    """
def matmul(dtype: str, w: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], rows: typing.SupportsInt | typing.SupportsIndex, cols: typing.SupportsInt | typing.SupportsIndex, x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], threads: typing.Any = 1, isa: str | None = None, act: str = 'int8', lanes: bool = False) -> numpy.typing.NDArray[numpy.float32]:
    """
    y[n, rows] = x[n, cols] W^T. threads: a team size or a _core.ThreadPool. act: 'int8' (quantized activations, integer dots) or 'float32' (dequantized rows, float dots). lanes: w is in the row-lane layout (pack_lanes).
    """
def matmul_multi(weights: collections.abc.Sequence[tuple[str, typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], typing.SupportsInt | typing.SupportsIndex]], cols: typing.SupportsInt | typing.SupportsIndex, x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], threads: typing.Any = 1, lanes: collections.abc.Sequence[bool] = []) -> list[numpy.typing.NDArray[numpy.float32]]:
    """
    weights: [(dtype, bytes, rows)] sharing x; one region; returns a list of y. lanes: per weight, whether it is in the row-lane layout (default none).
    """
def pack_lanes(dtype: str, data: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], rows: typing.SupportsInt | typing.SupportsIndex, cols: typing.SupportsInt | typing.SupportsIndex, unpack: bool = False) -> numpy.typing.NDArray[numpy.uint8]:
    """
    uint8 [rows, row_bytes] in the row-lane layout the AVX-512 Q4_1 / Q8_0 kernels read (rows a multiple of 8); unpack=True: back to the ordinary layout.
    """
def quantize(dtype: str, x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], isa: str | None = None) -> numpy.typing.NDArray[numpy.uint8]:
    """
    float32 [rows, cols] -> uint8 [rows, row_bytes]. isa=None: the scalar reference (byte-identical to ggml); an ISA name: that ISA's quantizer.
    """
def row_bytes(dtype: str, n: typing.SupportsInt | typing.SupportsIndex) -> int:
    ...
def type_info(dtype: str) -> dict[str, typing.Any]:
    ...
def type_names(role: str | None = None) -> list[str]:
    """
    Every tensor type the core knows, in its table's order (the weight types first); role: only those of that role ('weight': stored in model files, 'activation', 'scaled_weight').
    """
def vec_dot(dtype: str, w: typing.Annotated[numpy.typing.ArrayLike, numpy.uint8], x: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], isa: str | None = None, act: str = 'int8') -> float:
    """
    dot(one weight row, x): act 'int8' quantizes x to the act type with that ISA's quantizer; 'float32' is the float-activation path at that ISA.
    """
