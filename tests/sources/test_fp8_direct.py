"""FP8 block-scaled checkpoints run directly (no conversion): the official DeepSeek-V3 layout
(``weight`` as float8_e4m3fn, ``weight_scale_inv`` F32 with one scale per 128 x 128 block,
``quantization_config.weight_block_size``) loads as it is, resident and streamed.

The checkpoints are written here from the tiny test models (architectures colibri runs
today: llama and qwen3_moe; DeepSeek-V3's own architecture is another branch's work). The
oracle is transformers on the same weights dequantized by torch (``fp8.float() * scale``).
Kernels: the F8_E4M3 matmul against float64 math on torch's dequantized weights, scalar and
AVX2 against each other, partial blocks included.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import colibri
from colibri._core import quant as q
from support.fp8_factory import OFFICIAL, expand, write_fp8_pair
from support.modelfactory import build_tiny_model, prompt_ids, reference_logits, transformers_model
from support.streaming_helpers import assert_same_trace, budget_for_slots, engine, prompt, run_trace

_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ISAS = [i for i in ("scalar", "avx2", "avx512", "neon") if i in q.available_isas()]


def fp8_checkpoint(family: str, root: Path, block: tuple[int, int]) -> tuple[Path, Path]:
    """(FP8 checkpoint, its dequantized F32 twin) of a family's tiny model."""
    hf = build_tiny_model(family).hf_dir
    tag = f"{family}-{block[0]}x{block[1]}"
    fp8_dir, ref_dir = root / f"{tag}-fp8", root / f"{tag}-deq"
    if fp8_dir.is_dir():
        return fp8_dir, ref_dir
    return write_fp8_pair(hf, fp8_dir, ref_dir, block, _PROJ)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fp8direct")


@pytest.mark.parametrize("block", [OFFICIAL, (32, 48)])
@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("precision", ["float32", "int8"])
def test_loads_directly_and_matches_transformers(
    family: str, block: tuple[int, int], precision: str, root: Path
) -> None:
    fp8_dir, ref_dir = fp8_checkpoint(family, root, block)
    ids = prompt_ids(16)
    ref = reference_logits(transformers_model(str(ref_dir)), ids)
    eng = colibri.EngineConfig(context_length=64, activation_precision=precision,
                               kv_cache_type="f32")  # the oracle keeps float32 keys
    with colibri.Model.load(fp8_dir, engine=eng) as m:
        got = m.session().forward(ids, all_logits=True)
    # FP8 weights always meet float activations; the BF16 rest is exact in both modes.
    err = float(np.abs(got - ref).max()) / float(np.abs(ref).max())  # measured 6-7e-7
    assert err <= 1e-4, (family, block, err)
    assert np.array_equal(got.argmax(-1), ref.argmax(-1))


def test_streamed_fp8_experts_equal_resident(root: Path) -> None:
    fp8_dir, _ = fp8_checkpoint("qwen3_moe", root, OFFICIAL)
    ids = prompt()
    with colibri.Model.load(fp8_dir, engine=engine()) as m:
        want = run_trace(m, ids)
    budget = budget_for_slots(fp8_dir, 3)
    for workers in (0, 2):
        with colibri.Model.load(fp8_dir, engine=engine(budget=budget, workers=workers)) as m:
            got = run_trace(m, ids, want.decode_ids)
            st = m.stats().experts
            assert st is not None and st.misses > 0 and st.bytes_read > 0
        assert_same_trace(got, want, workers)


def test_slot_bytes_mirror_counts_the_scales(root: Path) -> None:
    from colibri.engine.streaming import expert_slot_bytes
    from colibri.sources import open_model_source

    fp8_dir, _ = fp8_checkpoint("qwen3_moe", root, OFFICIAL)
    with colibri.Model.load(fp8_dir, engine=engine(budget=budget_for_slots(fp8_dir, 2))) as m:
        mem = m.stats().memory
        assert mem is not None
        assert expert_slot_bytes(open_model_source(fp8_dir)) == mem.slot_bytes


# ---- kernels -------------------------------------------------------------------------------


def random_fp8(
    rows: int, cols: int, block: tuple[int, int], seed: int
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, size=(rows, cols), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x7E  # no NaN codes (checkpoints have none)
    codes[: min(rows, 3), :] = rng.choice(
        np.uint8([0x00, 0x80, 0x01, 0x81, 0x7E, 0xFE]), size=(min(rows, 3), cols)
    )
    sr, sc = -(-rows // block[0]), -(-cols // block[1])
    scales = (10.0 ** rng.uniform(-4, 1, size=(sr, sc))).astype(np.float32)
    return codes, scales


def torch_dequant(codes: np.ndarray, scales: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    w = torch.from_numpy(codes).view(torch.float8_e4m3fn).float()
    return (w * expand(torch.from_numpy(scales), tuple(codes.shape), block)).numpy()


@pytest.mark.parametrize("block", [OFFICIAL, (32, 48), (1, 8)])
def test_fp8_dequantize_equals_torch(block: tuple[int, int]) -> None:
    codes, scales = random_fp8(70, 200, block, 1)
    got = q.fp8_dequantize(codes, scales, 70, 200, *block)
    assert np.array_equal(got, torch_dequant(codes, scales, block))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("block", [OFFICIAL, (32, 48), (1, 8)])
def test_fp8_matmul_vs_float64(block: tuple[int, int], isa: str) -> None:
    """|y - exact| <= (n + 8) u sum |w x|: float sums over n columns (any order; the block
    scale adds one rounding per block), with exact e4m3 codes."""
    rows, cols = 131, 296  # partial row and column blocks
    codes, scales = random_fp8(rows, cols, block, 2)
    x = np.random.default_rng(3).standard_normal((3, cols)).astype(np.float32)
    wf = torch_dequant(codes, scales, block).astype(np.float64)
    exact = x.astype(np.float64) @ wf.T
    bound = (cols + 8) * 2.0**-24 * (np.abs(x.astype(np.float64)) @ np.abs(wf).T)
    y = q.fp8_matmul(codes, scales, rows, cols, block[0], block[1], x, 2, isa)
    assert np.all(np.abs(y - exact) <= bound + 1e-30)
    # determinism: threads and batching never change a bit
    y1 = q.fp8_matmul(codes, scales, rows, cols, block[0], block[1], x, 1, isa)
    assert y.tobytes() == y1.tobytes()
    for t in range(3):
        yt = q.fp8_matmul(codes, scales, rows, cols, block[0], block[1], x[t : t + 1], 3, isa)
        assert yt.tobytes() == y[t : t + 1].tobytes()


def test_fp8_weight_without_scales_is_refused() -> None:
    with pytest.raises(colibri.errors.InvalidRequestError, match="block scales"):
        q.matmul("F8_E4M3", np.zeros((4, 32), np.uint8), 4, 32, np.zeros((1, 32), np.float32))
    with pytest.raises(colibri.errors.InvalidRequestError, match="scales must be"):
        q.fp8_matmul(
            np.zeros(64, np.uint8),
            np.zeros(3, np.float32),
            2,
            32,
            128,
            128,
            np.zeros((1, 32), np.float32),
        )
