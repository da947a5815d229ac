"""``colibri convert --quant iq4_xs``: IQ4_XS where rows are whole 256-element super-blocks,
IQ4_NL (llama.cpp's fallback) where they are whole 32-blocks, F16 otherwise; the bytes are
the core's quantizer's (byte-identical with llama.cpp's, tests/oracle/test_iquants_real.py), and
the container runs like the float model within the quantization error."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import colibri
from colibri._core import quant as q
from colibri.convert import verify_container, write_container
from colibri.convert.quantize import target_dtype
from colibri.sources import open_model_source
from colibri.sources.manifest import Extent, TensorInfo
from colibri.sources.native_source import load_native
from support.modelfactory import build_tiny_model, prompt_ids, reference_logits, transformers_model


def test_iq4_xs_target_and_fallbacks() -> None:
    def t(shape: tuple[int, ...], name: str = "blk.0.ffn_down") -> TensorInfo:
        return TensorInfo(name, "F32", shape, (Extent(0, 0, 0),))

    assert target_dtype(t((64, 1536)), "iq4_xs") == "IQ4_XS"
    assert target_dtype(t((1536, 576)), "iq4_xs") == "IQ4_NL"  # SmolLM2's rows
    assert target_dtype(t((64, 48)), "iq4_xs") == "F16"
    assert target_dtype(t((64,), "blk.0.attn_norm"), "iq4_xs") == "F32"
    for quant in ("iq3_s", "iq3_xxs", "iq2_s", "iq2_xs", "iq2_xxs", "iq1_m", "iq1_s"):
        assert target_dtype(t((64, 1536)), quant) == quant.upper()
        assert target_dtype(t((1536, 576)), quant) == "IQ4_NL"  # llama.cpp's fallback
        assert target_dtype(t((64, 48)), quant) == "F16"


def test_convert_low_bit_chunks_equal_whole_tensor() -> None:
    """The convert path encodes run of rows by run of rows with the core's quantizer: for
    the low-bit types (one fit per super-block, no state across rows) any split into row
    chunks gives the whole tensor's bytes."""
    from colibri.convert.quantize import encode

    x = np.random.default_rng(2).standard_normal((48, 512)).astype(np.float32)
    for dtype in ("IQ1_M", "IQ2_XS", "IQ3_S"):
        whole = q.quantize(dtype, x)
        parts = np.concatenate([encode(dtype, x[:17]), encode(dtype, x[17:])])
        assert np.array_equal(whole, parts)


def _bytes(m: object, name: str) -> bytes:
    t = m.tensors[name]  # type: ignore[attr-defined]
    e = t.extents[0]
    with open(m.files[e.file], "rb") as f:  # type: ignore[attr-defined]
        f.seek(e.offset)
        return f.read(e.length)


def test_convert_iq4_xs(tmp_path: Path) -> None:
    tiny = build_tiny_model("llama")
    dst = tmp_path / "c"
    report = write_container(tiny.hf_dir, dst, quant="iq4_xs")
    assert report.quant == "iq4_xs" and verify_container(dst) == []
    nat, src = load_native(dst), open_model_source(tiny.hf_dir)
    kinds = set()
    err_iq4 = err_q4 = 0.0  # squared weight reconstruction error, all IQ4 matrices
    for name, t in src.tensors.items():
        want = target_dtype(t, "iq4_xs")
        assert nat.tensors[name].dtype == want, name
        kinds.add(want)
        if want in ("IQ4_XS", "IQ4_NL"):
            rows, cols = t.shape
            x = np.frombuffer(_bytes(src, name), dtype="<f4").reshape(rows, cols)
            x = np.ascontiguousarray(x)
            b = q.quantize(want, x)
            assert _bytes(nat, name) == b.tobytes(), name
            err_iq4 += float(np.sum((q.dequantize(want, b, rows, cols) - x) ** 2))
            y4 = q.dequantize("Q4_0", q.quantize("Q4_0", x), rows, cols)
            err_q4 += float(np.sum((y4 - x) ** 2))
    assert "IQ4_NL" in kinds
    assert err_iq4 < err_q4  # the non-linear grid fits the weights better at the same size
    ids = prompt_ids(16)
    ref = reference_logits(transformers_model(str(tiny.hf_dir)), ids)
    eng = colibri.EngineConfig(context_length=64, activation_precision="float32")

    def rel_rms(path: Path) -> float:
        with colibri.Model.load(path, engine=eng) as m:
            got = m.session().forward(ids, all_logits=True)
        return float(np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref**2)))

    # The tiny model's random weights are hard on 4-bit types (both near 0.3 relative RMS):
    # the logits must be about as good as Q4_0's at the same size (IQ4_NL and Q4_0 are
    # both 4.5 bits); measured 0.31 vs 0.30.
    write_container(tiny.hf_dir, tmp_path / "q4", quant="q4_0")
    ours, q4 = rel_rms(dst), rel_rms(tmp_path / "q4")
    print(f"relative RMS logit error: iq4_xs {ours:.4f}, q4_0 {q4:.4f}")
    assert ours <= 1.15 * q4
