"""Model sources -> manifest: tensor sets, shapes, types, expert slicing, extents, errors."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import transformers
from safetensors.numpy import load_file, save_file

from colibri.errors import (
    ModelFormatError,
    ModelNotFoundError,
    UnsupportedArchitectureError,
    UnsupportedError,
)
from colibri.sources import Manifest, load_gguf, load_hf, open_model_source
from colibri.sources.validate import SUPPORTED_FAMILIES, check_extents, expected_shapes
from support.modelfactory import (
    FAMILIES,
    TinyModel,
    build_hf_model,
    hf_config,
    unpermute_qk,
    write_gguf,
)
from support.realmodel import smollm2_gguf

# Tensor count per family (the spec, written out): token_embd + output_norm (+ output when
# untied) + per layer: attn_norm, q, k, v, o, ffn_norm (+ q/k norms, + q/k/v biases) and the
# FFN: 3 dense matrices, or router + 3 per expert (+ 4 for the shared expert).
COUNTS = {
    "llama": 3 + 3 * (6 + 3),
    "qwen3_moe": 2 + 3 * (6 + 2 + 1 + 8 * 3),  # tied embeddings: no output
    "qwen2_moe": 3 + 3 * (6 + 3 + 1 + 16 * 3 + 4),
    "olmoe": 3 + 3 * (6 + 2 + 1 + 8 * 3),
    "mixtral": 3 + 3 * (6 + 1 + 8 * 3),
}
PERMUTED = {"llama", "mixtral"}  # llama.cpp's "llama" architecture


def read_f32(m: Manifest, name: str) -> np.ndarray:
    t = m.tensors[name]
    assert t.dtype == "F32"
    buf = bytearray()
    for e in t.extents:
        with open(m.files[e.file], "rb") as fh:
            fh.seek(e.offset)
            buf += fh.read(e.length)
    return np.frombuffer(bytes(buf), dtype=np.float32).reshape(t.shape)


# --------------------------------------------------------------------------- good models


def test_hf_manifest(tiny_model: TinyModel) -> None:
    m = open_model_source(tiny_model.hf_dir)
    cfg = hf_config(tiny_model.family)
    assert m.source == "hf" and m.config.arch == tiny_model.family
    assert len(m.tensors) == COUNTS[tiny_model.family]
    assert list(m.tensors) == list(expected_shapes(m.config))
    assert all(t.dtype == "F32" and t.rope_unpermute_heads == 0 for t in m.tensors.values())
    c = m.config
    dims = (c.vocab_size, c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads)
    assert dims == (256, 64, 3, 4, 2)
    assert c.head_dim == (32 if tiny_model.family == "qwen3_moe" else 16)
    assert c.tie_word_embeddings == (tiny_model.family == "qwen3_moe")
    assert c.rms_norm_eps == cfg.rms_norm_eps
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,)
    if tiny_model.family != "llama":
        assert c.n_experts == (16 if tiny_model.family == "qwen2_moe" else 8)
        assert c.moe_layers == (True, True, True) and c.intermediate_size == 0
        assert c.moe_intermediate_size == 32
        e0, e1 = m.tensors["blk.1.ffn_down_exps.0"], m.tensors["blk.1.ffn_down_exps.1"]
        assert e0.shape == (64, 32) and e0.nbytes == 64 * 32 * 4
        assert e1.extents[0].offset != e0.extents[0].offset
    check_extents(m.tensors, m.files)


def test_hf_config_details(tiny_models: dict[str, TinyModel]) -> None:
    q2 = load_hf(tiny_models["qwen2_moe"].hf_dir).config
    assert q2.attention_bias and q2.shared_expert_intermediate_size == 64
    assert (q2.n_experts_per_tok, q2.norm_topk_prob) == (4, False)
    q3 = load_hf(tiny_models["qwen3_moe"].hf_dir).config
    assert (q3.qk_norm, q3.norm_topk_prob, q3.rope_theta) == ("head", True, 1e6)
    olmoe = load_hf(tiny_models["olmoe"].hf_dir)
    assert olmoe.config.qk_norm == "full"
    assert olmoe.tensors["blk.0.attn_q_norm"].shape == (64,)
    assert olmoe.tensors["blk.0.attn_k_norm"].shape == (32,)
    mix = load_hf(tiny_models["mixtral"].hf_dir).config
    assert mix.norm_topk_prob and mix.rope_theta == 1e6 and mix.head_dim == 16


def test_hf_bytes_match_safetensors(tiny_models: dict[str, TinyModel]) -> None:
    t = tiny_models["mixtral"]
    m = load_hf(t.hf_dir)
    sd = load_file(str(t.hf_dir / "model.safetensors"))
    pairs = {
        "token_embd": "model.embed_tokens.weight",
        "blk.2.attn_q": "model.layers.2.self_attn.q_proj.weight",
        "blk.1.ffn_gate_exps.5": "model.layers.1.block_sparse_moe.experts.5.w1.weight",
        "blk.1.ffn_down_exps.5": "model.layers.1.block_sparse_moe.experts.5.w2.weight",
        "blk.1.ffn_up_exps.5": "model.layers.1.block_sparse_moe.experts.5.w3.weight",
        "blk.0.ffn_gate_inp": "model.layers.0.block_sparse_moe.gate.weight",
    }
    for canon, hf in pairs.items():
        np.testing.assert_array_equal(read_f32(m, canon), sd[hf])


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_0"])
def test_gguf_manifest_matches_hf(tiny_model: TinyModel, qtype: str) -> None:
    hf = load_hf(tiny_model.hf_dir)
    g = open_model_source(tiny_model.gguf[qtype])
    assert g.source == "gguf"
    assert g.config == hf.config
    assert list(g.tensors) == list(hf.tensors)
    for name, t in g.tensors.items():
        assert t.shape == hf.tensors[name].shape, name
        f32 = t.shape[0] == 1 or len(t.shape) == 1 or name.endswith(("_norm", "ffn_gate_inp"))
        assert t.dtype == ("F32" if qtype == "F32" or f32 else qtype), name
        is_qk = name.endswith(("attn_q", "attn_k"))
        want = 0
        if tiny_model.family in PERMUTED and is_qk:
            want = 4 if name.endswith("attn_q") else 2
        assert t.rope_unpermute_heads == want, name
    check_extents(g.tensors, g.files)
    if hf.config.n_experts:
        # Experts are consecutive slices of one stacked tensor.
        exps = [g.tensors[f"blk.2.ffn_up_exps.{e}"].extents[0] for e in range(hf.config.n_experts)]
        for a, b in itertools.pairwise(exps):
            assert b.offset == a.offset + a.length and b.length == a.length


def test_gguf_f32_bytes_equal_hf_after_unpermute(tiny_model: TinyModel) -> None:
    hf = load_hf(tiny_model.hf_dir)
    g = load_gguf(tiny_model.gguf["F32"])
    for name, t in g.tensors.items():
        a = read_f32(g, name)
        if t.rope_unpermute_heads:
            a = unpermute_qk(a, t.rope_unpermute_heads)
        np.testing.assert_array_equal(a, read_f32(hf, name), err_msg=name)


def test_gguf_q8_0_expert_dequantizes_to_hf(tiny_models: dict[str, TinyModel]) -> None:
    t = tiny_models["qwen3_moe"]
    hf, g = load_hf(t.hf_dir), load_gguf(t.gguf["Q8_0"])
    name = "blk.1.ffn_down_exps.6"
    e = g.tensors[name].extents[0]
    with open(g.files[0], "rb") as fh:
        fh.seek(e.offset)
        raw = np.frombuffer(fh.read(e.length), dtype=np.uint8)
    rows, cols = g.tensors[name].shape
    deq = gguf.quants.dequantize(raw.reshape(rows, cols // 32 * 34), gguf.GGMLQuantizationType.Q8_0)
    ref = read_f32(hf, name)
    np.testing.assert_allclose(deq, ref, atol=np.abs(ref).max() / 127)


def test_smollm2_manifest() -> None:
    m = open_model_source(smollm2_gguf())
    c = m.config
    assert (c.arch, c.n_layers, c.hidden_size, c.intermediate_size) == ("llama", 30, 576, 1536)
    assert (c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.rope_theta == 1e5 and c.rms_norm_eps == 1e-5 and c.tie_word_embeddings
    assert c.n_experts == 0 and c.bos_token_id == 1 and 2 in c.eos_token_ids
    dtypes = [t.dtype for t in m.tensors.values()]
    assert (dtypes.count("Q4_1"), dtypes.count("Q8_0"), dtypes.count("F32")) == (210, 1, 61)
    assert m.tensors["blk.7.attn_q"].rope_unpermute_heads == 9
    assert m.tensors["blk.7.attn_k"].rope_unpermute_heads == 3
    assert m.tensors["blk.7.attn_v"].rope_unpermute_heads == 0
    assert "<|im_start|>" in m.metadata["tokenizer.chat_template"]
    assert len(m.metadata["tokenizer.ggml.tokens"]) == 49152


def test_directory_with_one_gguf_and_config_json_path(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    t = tiny_models["olmoe"]
    shutil.copy(t.gguf["Q4_0"], tmp_path / "model.gguf")
    assert open_model_source(tmp_path).source == "gguf"
    assert open_model_source(t.hf_dir / "config.json").source == "hf"
    shutil.copy(t.gguf["Q4_0"], tmp_path / "model.bin")  # GGUF magic, another suffix
    assert open_model_source(tmp_path / "model.bin").config.arch == "olmoe"


def test_sharded_checkpoint(tmp_path: Path) -> None:
    model = build_hf_model("qwen2_moe")
    model.save_pretrained(tmp_path / "one", safe_serialization=True)
    model.save_pretrained(tmp_path / "sharded", safe_serialization=True, max_shard_size="300KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    one, sharded = load_hf(tmp_path / "one"), load_hf(tmp_path / "sharded")
    assert len(sharded.files) > 1 and sharded.config == one.config
    assert list(sharded.tensors) == list(one.tensors)
    used = {e.file for t in sharded.tensors.values() for e in t.extents}
    assert used == set(range(len(sharded.files)))
    for name in ("token_embd", "blk.2.ffn_gate_inp_shexp", "blk.1.ffn_up_exps.15", "output"):
        np.testing.assert_array_equal(read_f32(sharded, name), read_f32(one, name))


def test_fused_experts_on_disk_are_split(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    src = tiny_models["qwen3_moe"].hf_dir
    sd = load_file(str(src / "model.safetensors"))
    fused: dict[str, np.ndarray] = {}
    for name, arr in sd.items():
        if ".experts." not in name:
            fused[name] = arr
    for i in range(3):
        p = f"model.layers.{i}.mlp.experts"
        gate_up = [
            np.concatenate([sd[f"{p}.{e}.gate_proj.weight"], sd[f"{p}.{e}.up_proj.weight"]])
            for e in range(8)
        ]
        fused[f"{p}.gate_up_proj"] = np.stack(gate_up)
        fused[f"{p}.down_proj"] = np.stack([sd[f"{p}.{e}.down_proj.weight"] for e in range(8)])
    save_file(fused, str(tmp_path / "model.safetensors"))
    shutil.copy(src / "config.json", tmp_path / "config.json")
    a, b = load_hf(tmp_path), load_hf(src)
    assert list(a.tensors) == list(b.tensors)
    for name in ("blk.0.ffn_gate_exps.0", "blk.1.ffn_up_exps.7", "blk.2.ffn_down_exps.3"):
        np.testing.assert_array_equal(read_f32(a, name), read_f32(b, name))


def test_dense_and_moe_layers_mixed(tmp_path: Path) -> None:
    cfg = hf_config("qwen2_moe")
    cfg.mlp_only_layers = [1]
    model = transformers.Qwen2MoeForCausalLM(cfg)
    model.save_pretrained(tmp_path, safe_serialization=True)
    m = load_hf(tmp_path)
    assert m.config.moe_layers == (True, False, True)
    assert m.config.intermediate_size == 128
    assert m.tensors["blk.1.ffn_gate"].shape == (128, 64)
    assert "blk.1.ffn_gate_inp" not in m.tensors and "blk.0.ffn_gate_inp" in m.tensors


# --------------------------------------------------------------------------- bad input


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist") as info:
        open_model_source(tmp_path / "nope.gguf")
    assert isinstance(info.value, FileNotFoundError)


def test_directory_that_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelFormatError, match=r"no config\.json and no \.gguf"):
        open_model_source(tmp_path)
    with pytest.raises(ModelFormatError, match="neither a GGUF file"):
        open_model_source(tmp_path / "notes.txt")


def test_directory_with_two_ggufs(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    for q in ("F32", "Q8_0"):
        shutil.copy(tiny_models["llama"].gguf[q], tmp_path / f"m-{q}.gguf")
    with pytest.raises(ModelFormatError, match="several GGUF files"):
        open_model_source(tmp_path)


def test_config_without_weights(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    shutil.copy(tiny_models["llama"].hf_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelFormatError, match=r"no \*\.safetensors"):
        open_model_source(tmp_path)


@pytest.mark.parametrize("cut", [100, 5000])
def test_truncated_gguf(tiny_models: dict[str, TinyModel], tmp_path: Path, cut: int) -> None:
    src = tiny_models["qwen2_moe"].gguf["F32"]
    data = src.read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:-cut])
    with pytest.raises(ModelFormatError, match="truncated") as info:
        open_model_source(bad)
    assert str(bad) in str(info.value)
    assert str(len(data)) in str(info.value) and str(len(data) - cut) in str(info.value)


@pytest.mark.parametrize("size", [0, 3, 40, 2000])
def test_gguf_with_broken_header(
    tiny_models: dict[str, TinyModel], tmp_path: Path, size: int
) -> None:
    bad = tmp_path / "head.gguf"
    bad.write_bytes(tiny_models["llama"].gguf["Q8_0"].read_bytes()[:size])
    with pytest.raises(ModelFormatError, match=re.escape(str(bad))):
        open_model_source(bad)


def test_not_gguf_at_all(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(1000))
    with pytest.raises(ModelFormatError, match="not a readable GGUF"):
        open_model_source(bad)


def _rewrite_header(src: Path, dst: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    """Copy a checkpoint dir, editing its safetensors header (padded to the same length)."""
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    data = f.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    mutate(header)
    raw = json.dumps(header, separators=(",", ":")).encode()
    assert len(raw) <= n, "edited header must not grow"
    f.write_bytes(data[:8] + raw + b" " * (n - len(raw)) + data[8 + n :])
    return dst


def _entry(h: dict[str, Any], name: str) -> dict[str, Any]:
    e: dict[str, Any] = h[name]
    return e


@pytest.mark.parametrize(
    ("case", "mutate", "match"),
    [
        (
            "beyond-file",
            lambda h: _entry(h, "model.norm.weight").update(data_offsets=[0, 10**9]),
            "file is truncated or its header is corrupt",
        ),
        (
            "wrong-length",
            lambda h: _entry(h, "model.norm.weight").update(shape=[65]),
            "needs 260 bytes but its header gives 256",
        ),
        (
            "overlap",
            lambda h: _entry(h, "model.layers.0.self_attn.q_proj.weight").update(
                data_offsets=_entry(h, "model.layers.0.self_attn.o_proj.weight")["data_offsets"]
            ),
            "overlap",
        ),
        (
            # The format has no holes: bytes no tensor claims mean the header lies.
            "missing-tensor",
            lambda h: h.pop("model.layers.1.self_attn.k_proj.weight"),
            "unused bytes between",
        ),
    ],
)
def test_lying_safetensors_header(
    tiny_models: dict[str, TinyModel],
    tmp_path: Path,
    case: str,
    mutate: Callable[[dict[str, Any]], None],
    match: str,
) -> None:
    d = _rewrite_header(tiny_models["llama"].hf_dir, tmp_path / case, mutate)
    with pytest.raises(ModelFormatError, match=match):
        open_model_source(d)


def test_truncated_safetensors(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    d = tmp_path / "cut"
    shutil.copytree(tiny_models["llama"].hf_dir, d)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-4096])
    with pytest.raises(ModelFormatError, match="truncated"):
        open_model_source(d)
    f.write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(ModelFormatError, match="not a safetensors file") as err:
        open_model_source(d)
    assert str(2**64 - 1) not in str(err.value)  # the 8 bytes are not echoed


def test_config_that_disagrees_with_weights(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    d = tmp_path / "m"
    shutil.copytree(tiny_models["llama"].hf_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_key_value_heads"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFormatError, match=r"'blk.0.attn_k' has shape \(32, 64\)"):
        open_model_source(d)


def test_unknown_architecture_hf(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(tiny_models["llama"].hf_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2' is not supported") as info:
        open_model_source(d)
    assert isinstance(info.value, ModelFormatError)
    for family in SUPPORTED_FAMILIES:
        assert family in str(info.value)


def test_unknown_architecture_gguf(tmp_path: Path) -> None:
    p = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(p), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2' is not supported") as info:
        open_model_source(p)
    for arch in ("llama", "qwen2moe", "qwen3moe", "olmoe"):
        assert arch in str(info.value)


def test_gguf_missing_tensor(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"

    def drop(name: str, data: np.ndarray) -> tuple[np.ndarray, None] | None:
        return None if name == "blk.2.ffn_down_exps.weight" else (data, None)

    write_gguf(tiny_models["olmoe"].hf_dir, p, "Q8_0", edit=drop)
    with pytest.raises(ModelFormatError, match=r"'blk\.2\.ffn_down_exps\.0' is missing"):
        open_model_source(p)


def test_gguf_unsupported_tensor_type(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"
    tq1 = gguf.GGMLQuantizationType.TQ1_0  # ternary: a GGUF type colibri does not run

    def to_tq1(name: str, data: np.ndarray) -> tuple[np.ndarray, Any]:
        if name != "blk.1.ffn_up.weight":
            return data, None
        # TQ1_0 needs 256-wide rows: write the bytes a (rows/4, 256) tensor would take.
        return np.zeros((data.shape[0] // 4, 54), dtype=np.uint8), tq1

    write_gguf(tiny_models["llama"].hf_dir, p, "F32", edit=to_tq1)
    with pytest.raises(
        UnsupportedError,
        match=r"'blk\.1\.ffn_up\.weight' has element type TQ1_0, which colibri cannot read yet "
        r"\(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K",
    ):
        open_model_source(p)


def test_unsupported_safetensors_dtype(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    src = tiny_models["llama"].hf_dir
    sd = load_file(str(src / "model.safetensors"))
    sd["model.norm.weight"] = sd["model.norm.weight"].astype(np.float64)
    d = tmp_path / "m"
    d.mkdir()
    save_file(sd, str(d / "model.safetensors"))
    shutil.copy(src / "config.json", d / "config.json")
    with pytest.raises(UnsupportedError, match=r"'model\.norm\.weight' has dtype F64"):
        open_model_source(d)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_is_supported(family: str) -> None:
    assert family in SUPPORTED_FAMILIES


def _edit_config(src: Path, dst: Path, **changes: Any) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_rope_settings_old_and_new_keys(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    src = tiny_models["llama"].hf_dir
    new = _edit_config(
        src,
        tmp_path / "new",
        rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
    )
    c = load_hf(new).config
    assert c.rope_theta == 5e5 and c.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    old = _edit_config(
        src,
        tmp_path / "old",
        rope_parameters=None,
        rope_theta=2e5,
        rope_scaling={"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
    )
    c = load_hf(old).config
    assert c.rope_theta == 2e5
    assert c.rope_scaling == {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 64,
    }
    default = _edit_config(src, tmp_path / "default", rope_parameters=None, head_dim=None)
    c = load_hf(default).config
    assert c.rope_theta == 10000.0 and c.rope_scaling is None and c.head_dim == 16


def test_bf16_checkpoint(tmp_path: Path) -> None:
    import torch

    model = build_hf_model("olmoe").to(torch.bfloat16)
    model.save_pretrained(tmp_path, safe_serialization=True)
    m = load_hf(tmp_path)
    assert {t.dtype for t in m.tensors.values()} == {"BF16"}
    assert m.tensors["blk.0.ffn_up_exps.3"].nbytes == 32 * 64 * 2
    check_extents(m.tensors, m.files)


def test_unsupported_hf_settings(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    d = _edit_config(tiny_models["olmoe"].hf_dir, tmp_path / "clip", clip_qkv=8.0)
    with pytest.raises(UnsupportedError, match="clip_qkv"):
        load_hf(d)
    d = _edit_config(tiny_models["llama"].hf_dir, tmp_path / "act", hidden_act="gelu")
    with pytest.raises(UnsupportedError, match="hidden_act 'gelu'"):
        load_hf(d)
