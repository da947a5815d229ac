"""GGUF files for the i-quant tests, made by llama.cpp's own quantizer (llama-cpp-python's
``llama_model_quantize``) from the SmolLM2 Q4_1 GGUF, cached under build/iquant_fixtures/.

llama.cpp requantizes Q4_1 -> float -> the target type; tensors whose rows are not a
multiple of 256 (SmolLM2's 576-wide rows) fall back to a 32-block type (IQ4_NL, Q4_K,
Q5_0 ... depending on the target), so every file is a mixed file.
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.realmodel import smollm2_gguf

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "iquant_fixtures"


def llama_cpp_or_skip():  # type: ignore[no-untyped-def]
    try:
        import llama_cpp
    except ImportError:
        pytest.skip("llama-cpp-python is not installed (pip install llama-cpp-python==0.3.36)")
    return llama_cpp


def requantized(ftype_name: str, pure: bool = False) -> Path:
    """SmolLM2 requantized by llama.cpp to LLAMA_FTYPE_MOSTLY_<ftype_name> (cached).

    ``pure``: llama.cpp's --pure (every matrix in the target type, no K-quant mix; rows
    that are not whole super-blocks still fall back)."""
    llama_cpp = llama_cpp_or_skip()
    src = smollm2_gguf()
    out = CACHE / f"SmolLM2-135M-Instruct.{ftype_name}{'.pure' if pure else ''}.gguf"
    if out.is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
    params.allow_requantize = True
    params.nthread = 2
    params.pure = pure
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0:
        tmp.unlink(missing_ok=True)
        pytest.fail(f"llama_model_quantize to {ftype_name} failed with {rc}")
    tmp.replace(out)
    return out


def colibri_quantized(dtype: str, pattern: str = "ffn_down.weight") -> Path:
    """SmolLM2 with every tensor whose name ends in ``pattern`` requantized by colibri's own
    quantizer to ``dtype`` (the others keep the Q4_1 file's bytes), written with gguf's
    GGUFWriter (cached). For types llama.cpp will not write without an importance matrix."""
    import gguf
    import numpy as np

    from colibri._core import quant as q

    src = smollm2_gguf()
    out = CACHE / f"SmolLM2-135M-Instruct.{dtype}-{pattern.split('.')[0]}.colibri.gguf"
    if out.is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    r = gguf.GGUFReader(src)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    w = gguf.GGUFWriter(str(tmp), arch=str(r.fields["general.architecture"].contents()))
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        sub = f.types[1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), vt, sub_type=sub)

    def requantize(t: gguf.ReaderTensor) -> np.ndarray:
        cols = int(t.shape[0])
        x = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
        return q.quantize(dtype, x.reshape(-1, cols))

    # the core's quantize releases the GIL: the low-bit fits run on two threads
    with ThreadPoolExecutor(2) as pool:
        chosen = [t for t in r.tensors if t.name.endswith(pattern)]
        done = dict(zip([t.name for t in chosen], pool.map(requantize, chosen), strict=True))
    for t in r.tensors:
        if t.name in done:
            w.add_tensor(t.name, done[t.name], raw_dtype=gguf.GGMLQuantizationType[dtype])
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out)
    return out
