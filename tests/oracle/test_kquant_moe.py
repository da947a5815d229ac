"""A Qwen3-MoE in the K-quants, written by llama.cpp's own quantizer, against llama.cpp.

The synthetic MoE preset ``tiny-k`` (benchmarks/synthetic_moe.py: 4 layers, 8 experts of
256 x 256, every row a multiple of 256) is written in Q4_0 and re-quantized by
``llama-quantize`` into Q4_K_M, Q2_K, Q3_K_M, Q5_K_M and Q6_K, so the K-quants apply to
every matrix, experts included (with 8 experts llama.cpp also puts attn_k / attn_v in
Q8_0 and attn_output in Q5_K). colibri must load each file, run every tensor with its own
kernel and stream its experts bit-identically to resident (tests/engine/test_streaming.py runs the
Q4_K_M and Q2_K files through its settings), and match llama.cpp's logits on the same file.

Tolerance, measured: random weights make this model sensitive to rounding (colibri's own
int8 and float32 logits differ by up to 20 % of the largest logit). When the test was
written colibri and llama.cpp differed on the Q4_0 source file by a median per-position
relative RMS of 1.9 % (correlation 0.9985, argmax 100 % on 64 tokens), and on the K-quant
files by 1.9-2.4 %, >= 0.998 and 95-100 %. Since the Q4_0 prefill tiles (issue 9) colibri
runs the Q4_0 file with llama.cpp's own Q8_0 integer arithmetic, so that file now agrees
unusually closely (1.3 %) while the K-quant files measure what they always did (1.9-2.4 %):
the Q4_0 figure alone is no longer the engines' noise floor. Each file's floor is the
larger of the Q4_0 figure and the distance from colibri with float32 activations (no int8
kernel involved) to llama.cpp on that file, i.e. how far llama.cpp's own activation
rounding moves this model's logits: 1.7-2.9 % measured (2026-12-02), capped at 4 % so a
weight bug cannot raise its own bound. A K-quant file must be within 1.5x of its floor,
with a correlation of at least 0.995 and 90 % argmax agreement.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import colibri
from support.llamacpp_quant import quantize_gguf
from support.tiny_k_fixtures import (
    IDS,
    colibri_logits,
    distance,
    llama_logits,
    q4_0_baseline,
    write_tiny_k,
)

MIXES = ["Q4_K_M", "Q2_K", "Q3_K_M", "Q5_K_M", "Q6_K"]
TYPES = {
    "Q4_K_M": {"F32", "Q4_K", "Q5_K", "Q6_K", "Q8_0"},
    "Q2_K": {"F32", "Q2_K", "Q3_K", "Q5_K", "Q6_K", "Q8_0"},
    "Q3_K_M": {"F32", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0"},
    "Q5_K_M": {"F32", "Q5_K", "Q6_K", "Q8_0"},
    "Q6_K": {"F32", "Q6_K", "Q8_0"},
}
RATIO = 1.5
MAX_FLOOR = 0.04  # measured 0.017-0.029 (docstring); a floor above it is a bug, not noise


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny-k")
    src = write_tiny_k(d / "tiny-k-Q4_0.gguf")
    out = {"Q4_0": src}
    for mix in MIXES:
        out[mix] = quantize_gguf(src, mix, d / f"tiny-k-{mix}.gguf")
    return out


@pytest.fixture(scope="module")
def baseline(files: dict[str, Path]) -> float:
    return q4_0_baseline(files["Q4_0"])


@pytest.mark.parametrize("mix", MIXES)
def test_matches_llama_cpp_like_q4_0_does(
    files: dict[str, Path], baseline: float, mix: str
) -> None:
    import gguf

    types = Counter(t.tensor_type.name for t in gguf.GGUFReader(files[mix]).tensors)
    assert set(types) == TYPES[mix], types
    ours = colibri_logits(files[mix])
    assert np.isfinite(ours).all()
    rms, corr, agree = distance(ours, llama_logits(files[mix]))
    # colibri with float32 activations (no int8 kernel involved) against llama.cpp: how far
    # llama.cpp's own activation rounding moves this model's logits.
    f32, _, _ = distance(colibri_logits(files[mix], "float32"), llama_logits(files[mix]))
    floor = max(baseline, f32)
    report = (
        f"{mix}: rel RMS {rms:.4f} (Q4_0 baseline {baseline:.4f}, colibri float32 vs "
        f"llama.cpp {f32:.4f}), corr {corr:.4f}, argmax {agree:.3f}"
    )
    print(report)
    assert f32 <= MAX_FLOOR, report  # a weight-layout bug would show here first
    assert rms <= RATIO * floor, report
    assert corr >= 0.995 and agree >= 0.9, report
    # two threads: the same bits
    with colibri.Model.load(
        files[mix], engine=colibri.EngineConfig(context_length=128, threads={"n": 2},
                                                activation_precision="int8")
    ) as m:
        assert m.session().forward(IDS, all_logits=True).tobytes() == ours.tobytes()
