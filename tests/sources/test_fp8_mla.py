"""FP8 block-scaled MLA checkpoints run directly: the tiny deepseek_v3 model (q-LoRA, grouped
sigmoid routing, YaRN, an MTP layer), and the other MLA variants of deepseek_factory (Kimi-K2,
V2-Lite without q-LoRA, V3.2 and GLM-5 with DSA, GLM-4.7-Flash), written in the official
DeepSeek-V3 FP8 layout
(every projection ``weight`` as float8_e4m3fn with an F32 ``weight_scale_inv``, one scale
per 128 x 128 block, ``quantization_config.weight_block_size``), ``kv_b_proj`` included.

``kv_b_proj`` is split per head into ``attn_k_b`` (transposed) and ``attn_v_b`` for the
absorbed decode; the parts keep their FP8 codes with scales re-blocked per row
(colibri/sources/fp8_parts.py). A second block shape (24 x 16) makes the heads start
inside a scale block, so the re-blocking really has work to do.

Oracles: transformers on the same weights dequantized by torch (``fp8.float() * scale``);
for the re-blocked scales, torch's dequantization of the whole kv_b_proj split the way
transformers' MLA splits it, bit for bit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

import colibri
from colibri._core import quant as q
from colibri.sources.fp8_parts import part_scales
from colibri.sources.hf_source import Fp8TensorInfo, load_hf
from support.deepseek_factory import prompt_ids, transformers_model
from support.fp8_factory import OFFICIAL, fp8_deepseek
from support.modelfactory import reference_logits
from support.streaming_helpers import assert_same_trace, budget_for_slots, engine, prompt, run_trace

ODD = (24, 16)  # heads of nope + v = 32 rows start at rows 0, 32, 64, 96: inside blocks
CONTEXT = 64


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fp8mla")


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max()) / float(np.abs(ref).max())


@pytest.mark.parametrize(("variant", "block"), [
    ("deepseek_v3", OFFICIAL), ("deepseek_v3", ODD), ("kimi_k2", OFFICIAL),
    ("deepseek_v2_lite", ODD), ("deepseek_v32", ODD), ("glm_moe_dsa", ODD),
    ("glm4_moe_lite", ODD),
])  # fmt: skip
def test_fp8_mla_matches_transformers(variant: str, block: tuple[int, int], root: Path) -> None:
    """Every position of a 32-token prompt, prefilled at once and prefilled then decoded
    token by token (the absorbed path over FP8 attn_k_b / attn_v_b; the DSA variants'
    indexer wq_b / wk in FP8 too, as DeepSeek-V3.2's release has them)."""
    fp8_dir, ref_dir = fp8_deepseek(root, block, variant)
    ids = prompt_ids(32)
    ref = reference_logits(transformers_model(str(ref_dir)), ids)
    eng = colibri.EngineConfig(context_length=CONTEXT, activation_precision="float32",
                               kv_cache_type="f32")  # the oracle keeps float32 latents
    with colibri.Model.load(fp8_dir, engine=eng) as m:
        assert m.stats().memory is not None
        whole = m.session().forward(ids, all_logits=True)
        s = m.session()
        steps = [s.forward(ids[:16], all_logits=True)] + [s.forward([t])[None] for t in ids[16:]]
    # Same dequantized weights, float32 arithmetic up to summation order and the absorbed
    # form's reassociation: measured 5.6e-7 to 9.6e-7 over these cases.
    err = rel_err(whole, ref)
    assert err <= 1e-4, (variant, block, err)
    err_steps = rel_err(np.concatenate(steps), ref)
    assert err_steps <= 1e-4, (variant, block, err_steps)
    assert np.array_equal(whole.argmax(-1), ref.argmax(-1))


def test_fp8_mla_streamed_equals_resident(root: Path) -> None:
    fp8_dir, _ = fp8_deepseek(root, OFFICIAL)
    ids = prompt()
    with colibri.Model.load(fp8_dir, engine=engine()) as m:
        want = run_trace(m, ids)
    budget = budget_for_slots(fp8_dir, 5)  # top-4 routing: at least 4 slots
    for workers in (0, 2):
        for prefetch in (False, True):
            eng = engine(budget=budget, workers=workers, prefetch=prefetch)
            with colibri.Model.load(fp8_dir, engine=eng) as m:
                got = run_trace(m, ids, want.decode_ids)
                st = m.stats().experts
                assert st is not None and st.misses > 0 and st.bytes_read > 0
            assert_same_trace(got, want, workers)


@pytest.mark.parametrize("block", [OFFICIAL, ODD, (8, 8), (5, 7)])
def test_part_scales_dequantize_like_torch(block: tuple[int, int], root: Path) -> None:
    """attn_k_b / attn_v_b as the core holds them (codes transposed per head for k_b), with
    the re-blocked scales, dequantize to exactly torch's kv_b_proj split per head."""
    fp8_dir, ref_dir = fp8_deepseek(root, block)
    cfg = json.loads((fp8_dir / "config.json").read_text())
    nh, nope, v, r = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"],
                      cfg["kv_lora_rank"])  # fmt: skip
    man = load_hf(fp8_dir)
    ref = load_file(str(ref_dir / "model.safetensors"))
    for layer in range(cfg["num_hidden_layers"]):
        kv_b = ref[f"model.layers.{layer}.self_attn.kv_b_proj.weight"].view(nh, nope + v, r)
        want_k = kv_b[:, :nope, :].transpose(1, 2).reshape(nh * r, nope).numpy()
        want_v = kv_b[:, nope:, :].reshape(nh * v, r).numpy()
        for name, want in (("attn_k_b", want_k), ("attn_v_b", want_v)):
            t = man.tensors[f"blk.{layer}.{name}"]
            assert isinstance(t, Fp8TensorInfo)
            raw = b"".join(_read(man.files[e.file], e.offset, e.length) for e in t.extents)
            codes = np.frombuffer(raw, np.uint8)
            if t.transpose_heads:  # what the core does at load
                codes = codes.reshape(nh, nope, r).transpose(0, 2, 1)
            codes = np.ascontiguousarray(codes.reshape(t.shape))
            scales, (b0, b1) = part_scales(t, man.files)
            assert b0 == 1 and scales.shape == (t.shape[0], -(-t.shape[1] // b1))
            got = q.fp8_dequantize(codes, scales, t.shape[0], t.shape[1], b0, b1)
            assert np.array_equal(got, want), (block, layer, name)


def test_fp8_mla_int8_mode_loads_and_tracks(root: Path) -> None:
    """activation_precision "int8" (the default for quantized weights): FP8 weights still
    meet float activations, so it matches the float32 run's argmax everywhere and its
    logits within the F16 KV cache's rounding (the auto KV type on FP8 weights)."""
    fp8_dir, ref_dir = fp8_deepseek(root, OFFICIAL)
    ids = prompt_ids(32)
    ref = reference_logits(transformers_model(str(ref_dir)), ids)
    with colibri.Model.load(fp8_dir, engine=colibri.EngineConfig(context_length=CONTEXT)) as m:
        got = m.session().forward(ids, all_logits=True)
    # F16 latents round each value by up to 2^-11 relative; measured 3.3e-4 (float32 KV: 6e-7).
    assert rel_err(got, ref) <= 2e-3
    assert np.array_equal(got.argmax(-1), ref.argmax(-1))


def _read(path: Path, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


@pytest.mark.parametrize("damage", ["missing", "nan"])
def test_bad_kv_b_scales_are_named(damage: str, root: Path, tmp_path: Path) -> None:
    """kv_b_proj without its scale_inv, or with a NaN scale: ModelFormatError naming it."""
    fp8_dir, _ = fp8_deepseek(root, ODD)
    bad = tmp_path / "bad"
    shutil.copytree(fp8_dir, bad)
    sd = load_file(str(bad / "model.safetensors"))
    name = "model.layers.1.self_attn.kv_b_proj.weight_scale_inv"
    if damage == "missing":
        del sd[name]
    else:
        sd[name][0, 0] = float("nan")
    save_file(sd, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(colibri.errors.ModelFormatError, match="kv_b_proj|attn_k_b|attn_v_b"):
        colibri.Model.load(bad, engine=colibri.EngineConfig(context_length=CONTEXT))
