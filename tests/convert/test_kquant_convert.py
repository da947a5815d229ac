"""``colibri convert --quant`` into the K-quants and llama.cpp's mixes (q4_k_m, q5_k_m).

The oracle is llama.cpp itself: ``llama-quantize`` (``llama_cpp.llama_model_quantize``) of
the same source GGUF. Both dequantize the source to float32 and requantize with ggml's
reference quantizers (no importance matrix), so a container written by colibri must hold,
tensor for tensor, the type llama.cpp chose and the very bytes it wrote; loaded, the two
files then give bit-identical logits in colibri. The rules themselves (fallbacks, layer
choices) are checked on synthetic tensors, and the writer's bounded-memory, resumable path
on a synthetic MoE whose rows are multiples of 256.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import colibri
from colibri.convert import quantize, verify_container, write_container
from colibri.convert.kquant_mix import use_more_bits
from colibri.convert.quantize import target_dtype
from colibri.sources import Extent, Manifest, TensorInfo, open_model_source
from colibri.sources.native_source import load_native
from support.llamacpp_quant import quantize_gguf, smollm2_quantized
from support.modelfactory import REPO
from support.realmodel import smollm2_gguf

ENGINE = colibri.EngineConfig(context_length=64)


def _synthetic_moe() -> ModuleType:
    name = "synthetic_moe"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, REPO / "benchmarks" / "synthetic_moe.py"
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def tensor_bytes(m: Manifest, name: str) -> bytes:
    out = b""
    for e in m.tensors[name].extents:
        with open(m.files[e.file], "rb") as f:
            f.seek(e.offset)
            out += f.read(e.length)
    return out


# ------------------------------------------------------------------------------ rules


def _t(name: str, shape: tuple[int, ...]) -> TensorInfo:
    return TensorInfo(name, "F32", shape, (Extent(0, 0, 0),))


def test_plain_k_types_and_fallbacks() -> None:
    assert target_dtype(_t("blk.0.attn_q", (512, 512)), "q4_k") == "Q4_K"
    assert target_dtype(_t("blk.0.ffn_down_exps.3", (256, 768)), "q6_k") == "Q6_K"
    # rows that are not whole super-blocks: llama.cpp's 32-element fallbacks, then F16
    assert target_dtype(_t("blk.0.attn_q", (512, 576)), "q2_k") == "Q4_0"
    assert target_dtype(_t("blk.0.attn_q", (512, 576)), "q3_k") == "Q4_0"
    assert target_dtype(_t("blk.0.attn_q", (512, 576)), "q4_k") == "Q5_0"
    assert target_dtype(_t("blk.0.attn_q", (512, 576)), "q5_k") == "Q5_1"
    assert target_dtype(_t("blk.0.attn_q", (512, 576)), "q6_k") == "Q8_0"
    assert target_dtype(_t("blk.0.attn_q", (512, 72)), "q4_k") == "F16"
    assert target_dtype(_t("blk.0.attn_q", (512, 96)), "q5_0") == "Q5_0"
    assert target_dtype(_t("blk.0.attn_q", (512, 72)), "q5_1") == "F16"
    # norms and routers stay F32
    assert target_dtype(_t("blk.0.attn_norm", (512,)), "q4_k_m") == "F32"
    assert target_dtype(_t("blk.0.ffn_gate_inp", (8, 512)), "q4_k_m") == "F32"


def test_mix_rules() -> None:
    assert [i for i in range(30) if use_more_bits(i, 30)] == [
        0,
        1,
        2,
        5,
        8,
        11,
        14,
        17,
        20,
        23,
        26,
        27,
        28,
        29,
    ]
    cfg = open_model_source(smollm2_gguf()).config  # tied embeddings, 30 layers
    for quant, base in (("q4_k_m", "Q4_K"), ("q5_k_m", "Q5_K")):
        assert target_dtype(_t("token_embd", (1024, 512)), quant, cfg) == "Q6_K"  # tied: the output
        assert target_dtype(_t("blk.5.attn_v", (192, 512)), quant, cfg) == "Q6_K"
        assert target_dtype(_t("blk.6.attn_v", (192, 512)), quant, cfg) == base
        assert target_dtype(_t("blk.6.attn_q", (576, 512)), quant, cfg) == base
        assert target_dtype(_t("blk.29.ffn_down", (576, 1536)), quant, cfg) == "Q6_K"
        assert target_dtype(_t("blk.4.ffn_down_exps.7", (576, 1536)), quant, cfg) == base
    untied = dataclasses.replace(cfg, tie_word_embeddings=False, n_experts=8)
    assert target_dtype(_t("token_embd", (1024, 512)), "q4_k_m", untied) == "Q4_K"
    assert target_dtype(_t("output", (1024, 512)), "q4_k_m", untied) == "Q6_K"
    # 8 experts (Mixtral): attn_v / attn_k at Q8_0, attn_output at Q5_K (q4_k_m)
    assert target_dtype(_t("blk.6.attn_v", (192, 512)), "q4_k_m", untied) == "Q8_0"
    assert target_dtype(_t("blk.6.attn_k", (192, 512)), "q4_k_m", untied) == "Q8_0"
    assert target_dtype(_t("blk.6.attn_output", (512, 512)), "q4_k_m", untied) == "Q5_K"
    assert target_dtype(_t("blk.6.attn_output", (512, 512)), "q5_k_m", untied) == "Q5_K"


# ------------------------------------------------------------- against llama.cpp's files


@pytest.mark.parametrize(
    ("quant", "mix"), [("q4_k_m", "Q4_K_M"), ("q5_k_m", "Q5_K_M"), ("q6_k", "Q6_K")]
)
def test_smollm2_container_equals_llama_cpp_file(tmp_path: Path, quant: str, mix: str) -> None:
    theirs_path = smollm2_quantized(mix)
    out = tmp_path / f"smollm2-{quant}.colibri"
    report = write_container(smollm2_gguf(), out, quant=quant)
    assert report.items_written == report.items_total
    verify_container(out)
    mine, theirs = load_native(out), open_model_source(theirs_path)
    assert set(mine.tensors) == set(theirs.tensors)
    for name, t in theirs.tensors.items():
        assert mine.tensors[name].dtype == t.dtype, name
        assert tensor_bytes(mine, name) == tensor_bytes(theirs, name), name
    # Same bytes, same kernels: the two files give the same logits, bit for bit.
    ids = [1, 504, 3458, 282, 4649, 314, 253, 1789, 30, 2]
    with (
        colibri.Model.load(out, engine=ENGINE) as a,
        colibri.Model.load(theirs_path, engine=ENGINE) as b,
    ):
        assert (
            a.session().forward(ids, all_logits=True).tobytes()
            == b.session().forward(ids, all_logits=True).tobytes()
        )


# ---------------------------------------------------------- the writer on a K-quant MoE


@pytest.fixture(scope="module")
def tiny_k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = tmp_path_factory.mktemp("tiny-k") / "tiny-k.gguf"
    _synthetic_moe().write_synthetic_gguf("tiny-k", path, seed=0)
    return path


def test_moe_q4_k_m_container_types_and_bounded_chunks(
    tiny_k: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chunks of a few rows: each tensor is converted in many pieces, never whole.
    monkeypatch.setattr(quantize, "CHUNK_ELEMENTS", 3 * 256)
    calls: list[int] = []
    encode = quantize.encode

    def counting(dtype: str, x: np.ndarray) -> np.ndarray:
        calls.append(x.size)
        return encode(dtype, x)

    monkeypatch.setattr(quantize, "encode", counting)
    out = tmp_path / "moe.colibri"
    write_container(tiny_k, out, quant="q4_k_m")
    verify_container(out)
    assert max(calls) <= 3 * 256
    m = load_native(out)
    types = {n: t.dtype for n, t in m.tensors.items()}
    assert types["output"] == "Q6_K" and types["token_embd"] == "Q4_K"
    assert types["blk.0.attn_q"] == "Q4_K" and types["blk.0.attn_output"] == "Q5_K"  # 8 experts
    assert types["blk.0.attn_v"] == types["blk.0.attn_k"] == "Q8_0"
    assert types["blk.0.ffn_down_exps.5"] == "Q4_K" and types["blk.3.ffn_down_exps.5"] == "Q6_K"
    assert types["blk.0.ffn_gate_exps.5"] == types["blk.2.ffn_up_exps.0"] == "Q4_K"
    # each expert blob holds its three matrices in their own types, and runs
    assert len(m.expert_blobs) == 4 * 8
    with colibri.Model.load(out, engine=ENGINE) as model:
        assert np.isfinite(model.session().forward(list(range(20)), all_logits=True)).all()


def test_moe_q4_k_m_container_equals_llama_cpp_file(tiny_k: Path, tmp_path: Path) -> None:
    theirs_path = quantize_gguf(tiny_k, "Q4_K_M", tmp_path / "tiny-k-Q4_K_M.gguf")
    out = tmp_path / "moe.colibri"
    write_container(tiny_k, out, quant="q4_k_m")
    mine, theirs = load_native(out), open_model_source(theirs_path)
    for name, t in theirs.tensors.items():
        assert mine.tensors[name].dtype == t.dtype, name
        assert tensor_bytes(mine, name) == tensor_bytes(theirs, name), name


class Interrupt(Exception):
    pass


def test_resume_after_interruption(tiny_k: Path, tmp_path: Path) -> None:
    whole = tmp_path / "whole.colibri"
    write_container(tiny_k, whole, quant="q4_k_m")
    calls = [0]

    def progress(done: int, total: int) -> None:
        calls[0] += 1
        if calls[0] > 30:  # past the dense tensors, into the expert blobs
            raise Interrupt

    out = tmp_path / "moe.colibri"
    with pytest.raises(Interrupt):
        write_container(tiny_k, out, quant="q4_k_m", progress=progress)
    report = write_container(tiny_k, out, quant="q4_k_m")
    assert report.items_reused == 30 and report.items_written == report.items_total - 30
    for p in sorted(whole.iterdir()):
        assert (out / p.name).read_bytes() == p.read_bytes(), p.name
