"""A Qwen3-MoE in the i-quants against llama.cpp running the very same files: IQ3_XXS and
IQ2_XXS, both written by colibri's own quantizer. llama.cpp 0.3.36 refuses both types on
this model without an importance matrix, which llama-cpp-python's API cannot pass (its
IQ3_XXS mix puts attn_q in IQ2_S, and `pure` IQ3_XXS is refused outright: "this
quantization requires an importance matrix"), so, as for the low-bit SmolLM2 files of
test_iquants_real.py, llama.cpp is the oracle that runs the file rather than the one that
writes it.

The synthetic MoE preset ``tiny-k`` (benchmarks/synthetic_moe.py: 4 layers, 8 experts of
256 x 256, every row a multiple of 256, so the i-quants apply to every matrix) is written
in Q4_0, and colibri's quantizer re-quantizes every expert and attention matrix of it into
IQ3_XXS or IQ2_XXS (the rest keeps its bytes), written with gguf's GGUFWriter. colibri
must load both files, stream their experts bit-identically to resident, and match
llama.cpp's logits running the very same file.

Tolerance, as in test_kquant_moe.py: each file's noise floor is the larger of the Q4_0
source file's colibri-vs-llama.cpp distance and the distance from colibri with float32
activations (no int8 kernel) to llama.cpp on that file, capped at MAX_FLOOR so a weight
bug cannot raise its own bound; colibri's default int8 path must be within 1.5x of it.
Measured 2026-12-02 (median per-position relative RMS over 64 tokens, printed by the test):
IQ3_XXS 0.0171 at a floor of 0.0160 (correlation 0.9998, argmax 0.969), IQ2_XXS 0.0178 at a
floor of 0.0309 (0.9984, 0.938).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri._core import quant as q
from support.tiny_k_fixtures import (
    IDS,
    colibri_logits,
    distance,
    llama_logits,
    q4_0_baseline,
    write_tiny_k,
)

RATIO = 1.5
MAX_FLOOR = 0.05  # measured 0.016-0.031 (docstring); a floor above it is a bug, not noise
MIN_CORR, MIN_ARGMAX = 0.99, 0.85


def colibri_requantized(src: Path, dtype: str, dst: Path) -> Path:
    """`src` with every expert and attention matrix re-quantized by colibri to `dtype`."""
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(str(dst), arch=str(r.fields["general.architecture"].contents()))
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(name, f.contents(), vt,
                        sub_type=f.types[1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        if "_exps." in t.name or (".attn_" in t.name and t.name.endswith(".weight") \
                and len(t.shape) == 2):
            cols = int(t.shape[0])
            x = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
            qb = np.asarray(q.quantize(dtype, x.reshape(-1, cols)))
            lead = [int(v) for v in reversed(t.shape[1:])]  # experts stay 3-D
            w.add_tensor(t.name, qb.reshape(*lead, -1), raw_dtype=gguf.GGMLQuantizationType[dtype])
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny-k-iq")
    src = write_tiny_k(d / "tiny-k-Q4_0.gguf")
    return {"Q4_0": src,
            **{k: colibri_requantized(src, k, d / f"tiny-k-{k}.colibri.gguf")
               for k in ("IQ3_XXS", "IQ2_XXS")}}


@pytest.fixture(scope="module")
def baseline(files: dict[str, Path]) -> float:
    return q4_0_baseline(files["Q4_0"])


@pytest.mark.parametrize("kind", ["IQ3_XXS", "IQ2_XXS"])
def test_iquant_moe_matches_llama_cpp(files: dict[str, Path], baseline: float, kind: str) -> None:
    import gguf

    types = Counter(t.tensor_type.name for t in gguf.GGUFReader(files[kind]).tensors)
    expert_types = {t.tensor_type.name for t in gguf.GGUFReader(files[kind]).tensors
                    if "_exps." in t.name}
    assert kind in types and expert_types == {kind}, types
    ours = colibri_logits(files[kind])
    assert np.isfinite(ours).all()
    theirs = llama_logits(files[kind])
    rms, corr, agree = distance(ours, theirs)
    f32, _, _ = distance(colibri_logits(files[kind], "float32"), theirs)
    floor = max(baseline, f32)
    report = (f"{kind}: rel RMS {rms:.4f} (Q4_0 baseline {baseline:.4f}, colibri float32 vs "
              f"llama.cpp {f32:.4f}), corr {corr:.4f}, argmax {agree:.3f}, types {dict(types)}")
    print(report)
    assert f32 <= MAX_FLOOR, report
    assert rms <= RATIO * floor, report
    assert corr >= MIN_CORR and agree >= MIN_ARGMAX, report


@pytest.mark.parametrize("kind", ["IQ3_XXS", "IQ2_XXS"])
def test_iquant_moe_streams_bit_identically(files: dict[str, Path], kind: str) -> None:
    """An expert cache of top-k slots (the smallest the budget allows) against resident,
    O_DIRECT and buffered reads, prefetch on."""
    import gguf

    from support.streaming_helpers import budget_for_slots

    r = gguf.GGUFReader(files[kind])
    arch = str(r.fields["general.architecture"].contents())
    top_k = int(r.fields[f"{arch}.expert_used_count"].contents())
    with colibri.Model.load(files[kind], engine=colibri.EngineConfig(
            context_length=128, activation_precision="int8")) as m:
        resident = np.asarray(m.session().forward(IDS, all_logits=True))
    budget = budget_for_slots(files[kind], top_k, threads=2, context_length=128,
                              precision="int8")
    for direct in (True, False):
        cfg = colibri.EngineConfig(context_length=128, ram_budget=budget, threads={"n": 2},
                                   io={"workers": 2, "direct": direct, "prefetch": True},
                                   activation_precision="int8")
        with colibri.Model.load(files[kind], engine=cfg) as m:
            streamed = np.asarray(m.session().forward(IDS, all_logits=True))
            mem = m.stats().memory
            assert mem is not None and mem.cache_slots == top_k < mem.total_experts, mem
        assert streamed.tobytes() == resident.tobytes(), f"{kind} direct={direct}"
