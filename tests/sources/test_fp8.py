"""FP8 block-scaled Hugging Face checkpoints (DeepSeek-V3 / GLM / Qwen3-FP8 style):
recognized by the HF source, dequantized by ``colibri convert`` (direct loading:
tests/sources/test_fp8_direct.py)
(docs/format.md, "FP8 checkpoints").

The checkpoints are made here from the tiny test models: every attention and FFN/expert
projection quantized to ``torch.float8_e4m3fn`` with one scale per (32 x 48) block (the
block size comes from ``quantization_config.weight_block_size``; 48 does not divide the
64-wide rows, so partial blocks are exercised), scale = block amax / 448 stored as the F32
``<name>_scale_inv``; the other tensors in BF16, as DeepSeek ships them. The reference is
transformers on the same weights dequantized with torch (``fp8.float() * scale_inv``).
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import colibri
from colibri.convert import quantize, verify_container, write_container
from colibri.convert.container import MANIFEST
from colibri.convert.fp8 import E4M3_TABLE, dequantize_block_fp8
from colibri.errors import ModelFormatError, UnsupportedError
from colibri.sources import open_model_source
from colibri.sources.hf_source import Fp8TensorInfo, load_hf
from colibri.sources.native_source import load_native
from colibri.sources.safetensors_files import FP8_DTYPE
from support import fp8_factory
from support.modelfactory import build_tiny_model, prompt_ids, reference_logits, transformers_model

BLOCK = fp8_factory.SMALL
_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
         "w1", "w2", "w3")  # fmt: skip
FLOAT32 = colibri.EngineConfig(context_length=64, activation_precision="float32")


def expand(scale: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return fp8_factory.expand(scale, shape, BLOCK)


def to_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 values, F32 scale_inv per BLOCK) of a 2-D weight."""
    return fp8_factory.to_fp8(w, BLOCK)


@functools.cache
def fp8_checkpoint(family: str, root: Path) -> tuple[Path, Path]:
    """(FP8 checkpoint, its dequantized F32 twin) of a family's tiny model, under root."""
    hf = build_tiny_model(family).hf_dir
    fp8_dir, ref_dir = root / f"{family}-fp8", root / f"{family}-deq"
    return fp8_factory.write_fp8_pair(hf, fp8_dir, ref_dir, BLOCK, _PROJ)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fp8")


def test_e4m3_table_matches_torch() -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(E4M3_TABLE, want)  # NaN where torch has NaN (0x7f, 0xff)
    assert np.isnan(E4M3_TABLE[[0x7F, 0xFF]]).all() and np.isfinite(E4M3_TABLE).sum() == 254
    assert (E4M3_TABLE[0x7E], E4M3_TABLE[0x01]) == (448.0, 2.0**-9)


def test_block_dequantization_matches_torch() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(70, 100, generator=g)
    q, scale = to_fp8(w)
    got = dequantize_block_fp8(q.view(torch.uint8).numpy(), scale.numpy(), BLOCK)
    np.testing.assert_array_equal(got, (q.float() * expand(scale, (70, 100))).numpy())


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "llama"])
def test_fp8_to_f32_matches_transformers(family: str, root: Path, tmp_path: Path) -> None:
    fp8_dir, ref_dir = fp8_checkpoint(family, root)
    dst = tmp_path / "c"
    write_container(fp8_dir, dst, quant="f32")
    assert verify_container(dst) == []
    nat = load_native(dst)
    assert {t.dtype for t in nat.tensors.values()} == {"F32"}
    ids = prompt_ids(16)
    ref = reference_logits(transformers_model(str(ref_dir)), ids)
    with colibri.Model.load(dst, engine=FLOAT32) as m:
        got = m.session().forward(ids, all_logits=True)
    err = float(np.abs(got - ref).max())  # measured 6-8e-7 of the largest logit
    assert err <= 1e-5 * float(np.abs(ref).max()), (family, err)
    # The container's weights are the dequantized ones, bit for bit.
    deq = open_model_source(ref_dir)
    for name in ("blk.0.attn_q", "blk.1.attn_output", "blk.2.ffn_down_exps.5"):
        if name in deq.tensors:
            assert _bytes(nat, name) == _bytes(deq, name), name
    doc = json.loads((dst / MANIFEST).read_text())
    assert "quantization_config" not in doc["metadata"] and doc["quant"] == "f32"


def test_source_reports_fp8(root: Path) -> None:
    fp8_dir, _ = fp8_checkpoint("qwen3_moe", root)
    with pytest.raises(UnsupportedError, match=r"FP8 .*Model.load .*colibri convert .* --quant"):
        load_hf(fp8_dir, allow_fp8=False)
    m = load_hf(fp8_dir)
    t = m.tensors["blk.1.ffn_down_exps.3"]
    assert isinstance(t, Fp8TensorInfo)
    assert (t.dtype, t.shape, t.nbytes, t.block) == (FP8_DTYPE, (64, 32), 64 * 32, BLOCK)
    assert t.scale.name.endswith("down_proj.weight_scale_inv")
    assert (t.scale.dtype, t.scale.shape) == ("F32", (2, 1))
    assert m.tensors["blk.0.attn_q"].scale.shape == (4, 2)  # type: ignore[attr-defined]
    assert m.tensors["blk.0.attn_norm"].dtype == "BF16"
    assert not isinstance(m.tensors["blk.0.ffn_gate_inp"], Fp8TensorInfo)


def test_fp8_keep_is_bf16_and_quant_types(root: Path, tmp_path: Path) -> None:
    """keep writes FP8 weights as BF16 (DeepSeek's fp8_cast_bf16), leaves the BF16
    matrices alone and widens vectors to F32; q4_0 quantizes the dequantized floats."""
    fp8_dir, ref_dir = fp8_checkpoint("qwen3_moe", root)
    src, deq = load_hf(fp8_dir, allow_fp8=True), open_model_source(ref_dir)
    write_container(fp8_dir, tmp_path / "keep")
    write_container(fp8_dir, tmp_path / "q4", quant="q4_0")
    keep, q4 = load_native(tmp_path / "keep"), load_native(tmp_path / "q4")
    for name, t in src.tensors.items():
        x = np.frombuffer(_bytes(deq, name), dtype=np.float32).reshape(-1, t.shape[-1])
        if isinstance(t, Fp8TensorInfo):
            bf16 = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.uint16).numpy()
            assert keep.tensors[name].dtype == "BF16" and _bytes(keep, name) == bf16.tobytes()
        elif len(t.shape) == 2:
            assert keep.tensors[name].dtype == "BF16"
            assert _bytes(keep, name) == _bytes(src, name), name
        else:
            assert keep.tensors[name].dtype == "F32" and _bytes(keep, name) == x.tobytes()
        q = q4.tensors[name]
        if q.dtype == "Q4_0":
            want = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0)
            assert _bytes(q4, name) == want.tobytes(), name
        else:
            assert "norm" in name or "ffn_gate_inp" in name, name
            assert q.dtype == "F32" and _bytes(q4, name) == x.tobytes(), name
    with colibri.Model.load(tmp_path / "keep", engine=FLOAT32) as m:
        assert np.isfinite(m.session().forward(prompt_ids(8), all_logits=True)).all()


def test_fp8_conversion_is_chunked_by_row_blocks(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp8_dir, _ = fp8_checkpoint("mixtral", root)
    write_container(fp8_dir, tmp_path / "whole", quant="q8_0")
    monkeypatch.setattr(quantize, "CHUNK_ELEMENTS", 100)  # one row block at a time
    write_container(fp8_dir, tmp_path / "blocks", quant="q8_0")
    for name in ("dense.bin", "experts.bin", "manifest.json"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "blocks" / name).read_bytes()


def _broken(root: Path, tmp_path: Path, edit: object) -> Path:
    fp8_dir, _ = fp8_checkpoint("llama", root)
    d = tmp_path / "bad"
    shutil.copytree(fp8_dir, d)
    sd = load_file(str(d / "model.safetensors"))
    edit(sd)  # type: ignore[operator]
    save_file(sd, str(d / "model.safetensors"))
    return d


def test_bad_fp8_checkpoints(root: Path, tmp_path: Path) -> None:
    scale = "model.layers.1.self_attn.k_proj.weight_scale_inv"
    d = _broken(root, tmp_path, lambda sd: sd.pop(scale))
    with pytest.raises(ModelFormatError, match=r"k_proj\.weight.* has no .*_scale_inv"):
        load_hf(d, allow_fp8=True)
    shutil.rmtree(d)
    d = _broken(root, tmp_path, lambda sd: sd.__setitem__(scale, torch.ones(1, 1)))
    with pytest.raises(ModelFormatError, match=r"shape \(1, 1\), but a 32x64 .* needs \(1, 2\)"):
        load_hf(d, allow_fp8=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = [128]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match="weight_block_size"):
        load_hf(d, allow_fp8=True)
    del cfg["quantization_config"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError, match="F8_E4M3 but config.json has no"):
        write_container(d, tmp_path / "out")


def _bytes(m: object, name: str) -> bytes:
    from colibri.sources import Manifest

    assert isinstance(m, Manifest)
    out = b""
    for e in m.tensors[name].extents:
        with open(m.files[e.file], "rb") as f:
            f.seek(e.offset)
            out += f.read(e.length)
    return out
