"""llama.cpp's own reference quantizers and dequantizers, called through ctypes.

llama-cpp-python ships ggml's base library (``llama_cpp/lib/libggml-base.so``), which
exports ``quantize_row_<type>_ref`` and ``dequantize_row_<type>`` for every block type.
They are the independent oracle for the K-quant quantizers, which ``gguf.quants`` does not
implement. Tests that need it fail without llama-cpp-python (scripts/test.sh installs it;
their skip is not on tests/conftest.py's allow-list).
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from pathlib import Path

import numpy as np
import pytest

# GGUF block sizes (elements, bytes) of the types these helpers are used for.
SIZES = {
    "Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176),
    "Q6_K": (256, 210), "Q8_K": (256, 292), "Q5_0": (32, 22), "Q5_1": (32, 24),
}  # fmt: skip


@cache
def _lib() -> ctypes.CDLL | None:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        for name in ("libggml-base.so", "libggml-base.dylib"):
            p = Path(d) / "lib" / name
            if p.is_file():
                return ctypes.CDLL(str(p))
    return None


def ggml() -> ctypes.CDLL:
    """The library, or skip the test."""
    lib = _lib()
    if lib is None:
        pytest.skip("needs llama-cpp-python (llama.cpp's libggml-base) as the oracle")
    return lib


def quantize(dtype: str, x: np.ndarray) -> np.ndarray:
    """ggml's ``quantize_row_<dtype>_ref`` on each row of x: uint8 [rows, row bytes]. The
    output starts zeroed (ggml leaves a zero Q8_K block's bsums unwritten)."""
    fn = getattr(ggml(), f"quantize_row_{dtype.lower().replace('_k', '_K')}_ref")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    block, size = SIZES[dtype]
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows, cols = x.shape
    out = np.zeros((rows, cols // block * size), dtype=np.uint8)
    for r in range(rows):
        fn(x[r].ctypes.data, out[r].ctypes.data, cols)
    return out


def dequantize(dtype: str, b: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """ggml's ``dequantize_row_<dtype>`` on each row: float32 [rows, cols]."""
    fn = getattr(ggml(), f"dequantize_row_{dtype.lower().replace('_k', '_K')}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    b = np.ascontiguousarray(b, dtype=np.uint8).reshape(rows, -1)
    out = np.zeros((rows, cols), dtype=np.float32)
    for r in range(rows):
        fn(b[r].ctypes.data, out[r].ctypes.data, cols)
    return out
