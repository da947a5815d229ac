"""The DeepSeek / GLM family through ``colibri convert`` into the native container: MLA's
W_UK transposed out of kv_b_proj before it is (re)quantized, the MTP layers kept (dense
tensors and expert blobs), FP8 block-scaled checkpoints (the official DeepSeek-V3 / GLM
release format) dequantized, kv_b_proj's FP8 scales included.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import colibri
from colibri.convert import verify_container, write_container
from colibri.convert.container import DENSE
from colibri.sources import open_model_source
from colibri.sources.native_source import load_native
from support import fp8_factory
from support.deepseek_factory import (
    N_LAYERS,
    TinyDeepseek,
    build_tiny,
    prompt_ids,
    transformers_model,
)
from support.logit_checks import assert_logits_close
from support.modelfactory import reference_logits

BLOCK = fp8_factory.SMALL
FLOAT32 = colibri.EngineConfig(context_length=64, activation_precision="float32")
# Linear weights the FP8 releases store as e4m3 (norms, routers, biases and the
# embedding / head stay BF16/F32).
_FP8_PROJ = ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
             "gate_proj", "up_proj", "down_proj", "wq_b", "wk")  # fmt: skip


def test_keep_container_is_bit_identical(deepseek_model: TinyDeepseek, tmp_path: Path) -> None:
    dst = tmp_path / "m.colibri"
    write_container(deepseek_model.hf_dir, dst)
    assert verify_container(dst) == []
    src = open_model_source(deepseek_model.hf_dir)
    nat = load_native(dst)
    assert nat.config == src.config
    assert set(nat.tensors) == set(src.tensors)
    assert all(t.transpose_heads == 0 for t in nat.tensors.values())  # written transposed
    if src.config.n_mtp_layers:
        assert f"blk.{N_LAYERS}.nextn.eh_proj" in nat.tensors
        assert (N_LAYERS, 0) in nat.expert_blobs  # the MTP layer's experts stream from blobs
    ids = prompt_ids(24)
    with colibri.Model.load(deepseek_model.hf_dir, engine=FLOAT32) as a, \
            colibri.Model.load(dst, engine=FLOAT32) as b:  # fmt: skip
        np.testing.assert_array_equal(b.session().forward(ids, all_logits=True),
                                      a.session().forward(ids, all_logits=True))


def _container_tensor(path: Path, name: str) -> np.ndarray:
    """A dense tensor of a container, dequantized with gguf.quants (an independent decoder)."""
    doc = json.loads((path / "manifest.json").read_text())
    rec = next(r for r in doc["dense"] if r["name"] == name)
    raw = np.fromfile(path / DENSE, dtype=np.uint8, count=rec["length"], offset=rec["offset"])
    if rec["dtype"] == "BF16":
        out = (raw.view("<u2").astype(np.uint32) << 16).view("<f4")
    else:
        out = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[rec["dtype"]])
    return np.asarray(out, dtype=np.float32).reshape(rec["shape"])


@pytest.mark.parametrize("quant", ["q8_0", "bf16", "f16"])
def test_quantized_container_holds_w_uk_transposed(deepseek_models: dict[str, TinyDeepseek],
                                                   tmp_path: Path, quant: str) -> None:
    """attn_k_b is each head's W_UK^T quantized along the nope axis (as llama.cpp's
    converter splits it), attn_v_b each head's W_UV rows: recomputed here from kv_b_proj
    with gguf.quants, they agree exactly."""
    tiny = deepseek_models["glm4_moe_lite"]
    cfg = open_model_source(tiny.hf_dir).config
    dst = tmp_path / "m.colibri"
    write_container(tiny.hf_dir, dst, quant=quant)
    sd = load_file(str(tiny.hf_dir / "model.safetensors"))
    kv_b = sd["model.layers.1.self_attn.kv_b_proj.weight"]
    nope, v, r = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    per_head = kv_b.numpy().reshape(cfg.n_heads, nope + v, r)
    k_b = per_head[:, :nope, :].transpose(0, 2, 1).reshape(-1, nope)
    v_b = per_head[:, nope:, :].reshape(-1, r)
    got_k = _container_tensor(dst, "blk.1.attn_k_b")
    got_v = _container_tensor(dst, "blk.1.attn_v_b")
    for want, got in ((k_b, got_k), (v_b, got_v)):
        qt = {"q8_0": "Q8_0", "bf16": "BF16", "f16": "F16"}[quant]
        if want.shape[1] % 32 and qt == "Q8_0":
            qt = "F16"  # rows not a whole number of Q8_0 blocks: the F16 fallback
        if qt == "BF16":
            exp = torch.from_numpy(want).to(torch.bfloat16).float().numpy()
        else:
            t = gguf.GGMLQuantizationType[qt]
            exp = gguf.quants.dequantize(gguf.quants.quantize(want, t), t).reshape(want.shape)
        np.testing.assert_array_equal(got, exp)


def _fp8_checkpoint(tiny: TinyDeepseek, root: Path) -> tuple[Path, Path]:
    """(FP8 block-scaled checkpoint, its dequantized F32 twin): every linear projection in
    e4m3 with (32 x 48) block scales (partial blocks on every 32-wide matrix, and kv_b's
    per-head row ranges cross the scale blocks), the rest BF16."""
    fp8_dir, ref_dir = root / "fp8", root / "deq"
    fp8_sd: dict[str, torch.Tensor] = {}
    ref_sd: dict[str, torch.Tensor] = {}
    for name, w in load_file(str(tiny.hf_dir / "model.safetensors")).items():
        if w.ndim == 2 and name.split(".")[-2] in _FP8_PROJ:
            q, scale = fp8_factory.to_fp8(w, BLOCK)
            fp8_sd[name], fp8_sd[name + "_scale_inv"] = q, scale
            ref_sd[name] = q.float() * fp8_factory.expand(scale, tuple(w.shape), BLOCK)
        else:
            fp8_sd[name] = w.to(torch.bfloat16)
            ref_sd[name] = fp8_sd[name].float()
    cfg = json.loads((tiny.hf_dir / "config.json").read_text())
    for d, sd in ((fp8_dir, fp8_sd), (ref_dir, ref_sd)):
        d.mkdir(parents=True)
        save_file(sd, str(d / "model.safetensors"), metadata={"format": "pt"})
    fp8_cfg = dict(cfg, quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
        "weight_block_size": list(BLOCK),
    })  # fmt: skip
    (fp8_dir / "config.json").write_text(json.dumps(fp8_cfg))
    (ref_dir / "config.json").write_text(json.dumps(cfg))
    return fp8_dir, ref_dir


@pytest.mark.parametrize("variant", ["deepseek_v3", "glm_moe_dsa", "deepseek_v2_lite"])
def test_fp8_checkpoint_converts_and_matches_transformers(
    deepseek_models: dict[str, TinyDeepseek], variant: str, tmp_path: Path
) -> None:
    fp8_dir, ref_dir = _fp8_checkpoint(deepseek_models[variant], tmp_path / "src")
    ids = prompt_ids(24)
    ref = reference_logits(transformers_model(str(ref_dir)), ids)
    # It also runs directly, kv_b_proj's parts in FP8 (tests/sources/test_fp8_mla.py).
    with colibri.Model.load(fp8_dir, engine=FLOAT32) as m:
        assert_logits_close(m.session().forward(ids, all_logits=True), ref, f"{variant} FP8")
    dst = tmp_path / "f32.colibri"
    write_container(fp8_dir, dst, quant="f32")
    assert verify_container(dst) == []
    with colibri.Model.load(dst, engine=FLOAT32) as m:
        assert_logits_close(m.session().forward(ids, all_logits=True), ref, f"{variant} FP8 -> F32")
    # keep: FP8 matrices become BF16 (DeepSeek's fp8_cast_bf16), including W_UK transposed.
    kept = tmp_path / "keep.colibri"
    write_container(fp8_dir, kept)
    nat = load_native(kept)
    assert nat.tensors["blk.1.attn_k_b"].dtype == "BF16"
    with colibri.Model.load(kept, engine=FLOAT32) as m:
        got = m.session().forward(ids, all_logits=True)
    assert np.isfinite(got).all()


def test_gguf_converts_to_container_bit_identical(tmp_path: Path) -> None:
    """A llama.cpp GGUF (here Q8_0, glm-dsa with its MTP layer) relaid out as a container
    computes the same logits as the file itself."""
    tiny = build_tiny("glm_moe_dsa")
    dst = tmp_path / "m.colibri"
    write_container(tiny.gguf["Q8_0"], dst)
    ids = prompt_ids(24)
    eng = colibri.EngineConfig(context_length=64)
    with colibri.Model.load(tiny.gguf["Q8_0"], engine=eng) as a, \
            colibri.Model.load(dst, engine=eng) as b:  # fmt: skip
        assert b.config.n_mtp_layers == 1
        np.testing.assert_array_equal(b.session().forward(ids, all_logits=True),
                                      a.session().forward(ids, all_logits=True))
    shutil.rmtree(dst)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("n_mtp_layers", 2**31, "n_mtp_layers"),  # refused as data, before any loop over layers
    ("n_mtp_layers", 0, "layers"),  # the file's MTP layer is then a layer nobody declared
    ("indexer_types", ["shared", "full", "full"], "indexer_types"),
    ("router", "sparsemixer", "routing rule"),
])
def test_container_config_fields_are_checked(deepseek_models: dict[str, TinyDeepseek],
                                             tmp_path: Path, field: str, value: object,
                                             match: str) -> None:
    """The family's fields in a container's manifest go through the same validation as
    every source's config (validate.check_family_fields, the layer count with MTP layers)."""
    dst = tmp_path / "m.colibri"
    write_container(deepseek_models["glm_moe_dsa"].hf_dir, dst)
    doc = json.loads((dst / "manifest.json").read_text())
    assert doc["config"]["n_mtp_layers"] == 1
    doc["config"][field] = value
    (dst / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises((colibri.errors.ModelFormatError, colibri.errors.UnsupportedError),
                       match=match):
        open_model_source(dst)
