"""gpt-oss's MXFP4 layout (``*_blocks`` / ``*_scales``) relaid out as GGUF MXFP4 blocks
(python/colibri/sources/mxfp4_hf.py), no requantization.

Oracles: a dequantization written here from the published layout (OCP MX e2m1 codes, two
per byte with the even element in the low nibble, E8M0 exponent bias 127), gguf's own
MXFP4 dequantizer on the relaid-out bytes, and transformers' gpt-oss dequantization
(``convert_moe_packed_tensors``) where transformers is installed. All must agree bit for
bit with the core's MXFP4 dequantization of the relaid-out bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gq

from colibri import errors
from colibri._core import quant as q
from colibri.sources.mxfp4_hf import check_mxfp4_shapes, mxfp4_pairs, relayout_mxfp4

# e2m1 code -> value (OCP Microscaling Formats v1.0, table of FP4 E2M1)
E2M1 = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float64,
)


def published_dequant(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 [..., rows, cols] from the HF tensors, element by element."""
    *prefix, nb, half = blocks.shape
    codes = np.empty((*prefix, nb, 2 * half), np.int64)
    codes[..., 0::2] = blocks & 15
    codes[..., 1::2] = blocks >> 4
    x = np.ldexp(E2M1[codes], scales.astype(np.int64)[..., None] - 127)
    with np.errstate(over="ignore"):  # 6 * 2^127 is beyond float32: inf, as ggml's
        return x.astype(np.float32).reshape(*prefix, nb * 2 * half)


def hf_tensors(
    shape: tuple[int, ...], seed: int, lo: int = 110, hi: int = 140
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    *prefix, rows, cols = shape
    blocks = rng.integers(0, 256, (*prefix, rows, cols // 32, 16), dtype=np.uint8)
    scales = rng.integers(lo, hi + 1, (*prefix, rows, cols // 32), dtype=np.uint8)
    return blocks, scales


@pytest.mark.parametrize(
    ("lo", "hi"), [(110, 140), (0, 3), (250, 254)], ids=["typical", "subnormal", "huge"]
)
def test_relayout_equals_published_layout(lo: int, hi: int) -> None:
    blocks, scales = hf_tensors((3, 5, 96), seed=lo, lo=lo, hi=hi)  # experts, rows, cols
    ggml = relayout_mxfp4(blocks, scales)
    assert ggml.shape == (3, 5, 3 * 17)
    want = published_dequant(blocks, scales)
    rows = ggml.reshape(15, -1)
    ours = q.dequantize("MXFP4", rows, 15, 96).reshape(want.shape)
    with np.errstate(over="ignore"):
        theirs = np.asarray(gq.dequantize(rows, GGMLQuantizationType.MXFP4), np.float32)
    # Equal values; code 8 (-0) decodes as +0 in GGUF's int8 value table, as in ggml.
    with np.errstate(invalid="ignore"):
        assert np.array_equal(ours, want)
    assert np.array_equal(ours.view(np.uint32), theirs.reshape(want.shape).view(np.uint32))


def test_relayout_equals_transformers_gpt_oss_dequant() -> None:
    torch = pytest.importorskip("torch")
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    blocks, scales = hf_tensors((4, 6, 64), seed=3)
    ref = mx.convert_moe_packed_tensors(
        torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32
    )  # [experts, cols, rows]: transformers' expert layout
    ref = ref.transpose(1, 2).numpy()
    ours = q.dequantize("MXFP4", relayout_mxfp4(blocks, scales).reshape(24, -1), 24, 64)
    assert np.array_equal(ours.reshape(ref.shape), ref)


def test_codes_survive_a_round_trip_through_gguf_quantizer_semantics() -> None:
    """Values already on the MXFP4 grid requantize to the very same GGUF bytes: the
    relayout is the encoding ggml itself would write for these weights."""
    blocks, scales = hf_tensors((8, 64), seed=5)
    blocks[..., :] &= 0x77  # positive codes only: ggml's quantizer never writes -0
    ggml = relayout_mxfp4(blocks, scales)
    x = published_dequant(blocks, scales)
    # a block whose largest magnitude is 6 * 2^(e - 127) gets exponent e back from ggml
    has_six = np.any((blocks & 0x0F) == 7, axis=-1) | np.any((blocks >> 4) == 7, axis=-1)
    keep = np.all(has_six, axis=-1)
    assert keep.any()
    requant = q.quantize("MXFP4", np.ascontiguousarray(x[keep]))
    assert np.array_equal(requant, ggml[keep])


def test_pairs_and_shape_errors() -> None:
    names = ["a.gate_up_proj_blocks", "a.gate_up_proj_scales", "a.norm.weight"]
    assert mxfp4_pairs(names) == {
        "a.gate_up_proj": ("a.gate_up_proj_blocks", "a.gate_up_proj_scales")
    }
    with pytest.raises(errors.ModelFormatError, match="no 'x_scales'"):
        mxfp4_pairs(["x_blocks"])
    assert check_mxfp4_shapes("w", (2, 4, 3, 16), (2, 4, 3)) == (2, 4, 96)
    with pytest.raises(errors.ModelFormatError, match="does not match"):
        check_mxfp4_shapes("w", (2, 4, 3, 16), (2, 4, 2))
    with pytest.raises(errors.ModelFormatError, match="cols / 32, 16"):
        check_mxfp4_shapes("w", (4, 3, 8), (4, 3))
    with pytest.raises(errors.ModelFormatError, match="uint8"):
        relayout_mxfp4(np.zeros((1, 1, 16), np.int8), np.zeros((1, 1), np.uint8))
