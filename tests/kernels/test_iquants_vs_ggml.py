"""colibri's i-quant matrix-vector products against llama.cpp's own (ggml's MUL_MAT from
llama-cpp-python's libggml-cpu, driven by benchmarks/bench_vs_ggml.py's ctypes wrapper), on
the same packed bytes: the same numbers up to the order of float sums, on every ISA here.
A second oracle beside the scalar reference (test_iquants.py): it catches a kernel and the
reference that agree with each other but not with the format. Fails without
llama-cpp-python, like tests/support/ggml_oracle.py's users.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from colibri._core import quant as q

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
TYPES = ["IQ1_M", "IQ1_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_XS"]
ROWS, COLS = 32, 1024


def _bench_vs_ggml() -> ModuleType:
    if "bench_vs_ggml" in sys.modules:
        return sys.modules["bench_vs_ggml"]
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # it imports _common and bench_kernels
    spec = importlib.util.spec_from_file_location("bench_vs_ggml", BENCH / "bench_vs_ggml.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_vs_ggml"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("dtype", TYPES)
def test_matvec_agrees_with_ggml(dtype: str) -> None:
    bvg = _bench_vs_ggml()
    ggml = bvg.Ggml()
    w = bvg.make_weight(dtype, ROWS, COLS, np.random.default_rng(3))
    bvg.finite_iq1m_scale(w, dtype)
    x = np.random.default_rng(4).standard_normal((1, COLS), dtype=np.float32)
    gm = bvg.GgmlMatvec(ggml, dtype, w, ROWS, COLS, 1)
    try:
        gm.set_x(x)
        gm.run(1)
        theirs = gm.output()
    finally:
        gm.free()
    scale = float(np.max(np.abs(theirs)))
    assert scale > 0
    for isa in q.available_isas():
        ours = q.matmul(dtype, w, ROWS, COLS, x, 1, isa)[0]
        assert np.max(np.abs(ours - theirs)) <= 1e-5 * scale, (dtype, isa)
