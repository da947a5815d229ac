"""Qwen3-Next and Qwen3.5-MoE as llama.cpp's converter (the llama-cpp-python 0.3.36 sdist's
convert_hf_to_gguf.py, ``--no-mtp``) writes them, general.architecture ``qwen3next`` and
``qwen35moe``, against transformers on the tiny random checkpoints of
support/qwen3_next_factory.py (2 key and 4 value heads in the linear layers, so Qwen3.5's
file has its value heads in the converter's tiled order).

F32 files: every logit at every position within 1e-4 of the largest of transformers' on
the 140-token prompt (longer than two of transformers' 64-token delta-rule chunks), for
one prefill and for a prefill followed by token-by-token decode; the same greedy 20 tokens.
Q8_0 files (embeddings, head, projections and expert gate/up in Q8_0, expert down in F16,
norms, convolution, A and dt_bias in F32) against transformers running the very values
the file stores (support/qwen3_next_gguf.dequantized_model): the same bound and the same
greedy tokens. A file with an MTP layer runs its trunk.

Measured (seed 0, 140 tokens): colibri within 1.9e-6 (Qwen3-Next) and 9.2e-6 (Qwen3.5) of
max |logit| from the dequantized reference, while the Q8_0 weights themselves move
transformers' logits by 51% and 36% of max |logit| from the float model's (25% and 26%
over the first 12 tokens). This tiny random model is that sensitive (32-wide rows are one
Q8_0 block each; the embeddings' quantization alone moves it 21%, every other group of
tensors 0.7 to 20%), which is why a quantized file is checked against the values it stores
and not against the float model.

The converter supports both architectures (and, not tested here, Qwen3.5's dense
``qwen35``, which colibri does not run). Bad input: a linear layer's missing ssm tensor and
a convolution width that disagrees with ``ssm.conv_kernel`` are ModelFormatErrors naming
the tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import colibri
from colibri.errors import ModelFormatError
from support.deepseek_factory import convert_with_llama_cpp
from support.logit_checks import assert_decode_matches, assert_greedy_matches, assert_within
from support.modelfactory import prompt_ids, reference_greedy, reference_logits
from support.qwen3_next_factory import VOCAB, build_qwen3_next
from support.qwen3_next_gguf import convert, dequantized_model, with_mtp_layer

N_PROMPT, N_GREEDY = 140, 20
VARIANTS = {"qwen3next": ("qwen3_next", False), "qwen35moe": ("qwen3_5_moe", True)}
Tiny = tuple[Path, torch.nn.Module, dict[str, Path]]


@pytest.fixture(scope="module", params=list(VARIANTS))
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """The checkpoint, its model and the converter's F32 and Q8_0 files."""
    root = tmp_path_factory.mktemp(request.param)
    d, model = build_qwen3_next(root / "hf", seed=0, qwen3_5=VARIANTS[request.param][1])
    files = {t: convert(d, root / f"{request.param}.{t}.gguf", t) for t in ("f32", "q8_0")}
    return d, model, files


def load(p: Path) -> colibri.Model:
    return colibri.Model.load(p, engine=colibri.EngineConfig(context_length=256))


def test_the_file_maps_to_the_checkpoints_config(tiny: Tiny) -> None:
    """The GGUF's config is the checkpoint's but for what the file stores transformed:
    the norms with their offset baked in, A as -exp(A_log), Qwen3.5's tiled value heads."""
    d, _, files = tiny
    hf, gg = load(d).config, load(files["f32"]).config
    qwen3_5 = hf.arch == "qwen3_5_moe"
    assert (gg.norm_weight_offset, gg.linear_a_neg_exp, gg.linear_v_tiled) == (0.0, True, qwen3_5)
    same = ("arch", "n_layers", "linear_layers", "linear_num_key_heads", "linear_num_value_heads",
            "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel", "rotary_dim",
            "head_dim", "qk_norm", "n_experts", "n_experts_per_tok", "moe_intermediate_size",
            "shared_expert_intermediate_size", "norm_topk_prob",
            "attention_output_gate")  # fmt: skip
    assert {k: getattr(gg, k) for k in same} == {k: getattr(hf, k) for k in same}


def test_f32_prefill_and_decode_match_transformers(tiny: Tiny) -> None:
    _, model, files = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    m = load(files["f32"])
    assert_within(m.session().forward(ids, all_logits=True), ref, "gguf prefill")
    assert_decode_matches(m.session(), ids, ref, "gguf")


def test_f32_greedy_continuation_matches_transformers(tiny: Tiny) -> None:
    _, model, files = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref_tokens, ref_logits = reference_greedy(model, ids, N_GREEDY)
    assert_greedy_matches(load(files["f32"]).session(), ids, ref_tokens, ref_logits)


def test_q8_0_matches_its_dequantized_weights(tiny: Tiny, tmp_path: Path) -> None:
    d, model, files = tiny
    ref_model = dequantized_model(d, files["q8_0"], tmp_path / "deq",
                                  qwen3_5=load(d).config.arch == "qwen3_5_moe")  # fmt: skip
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(ref_model, ids)
    float_ref = reference_logits(model, ids)
    moved = float(np.abs(ref - float_ref).max() / np.abs(float_ref).max())
    assert moved > 1e-2, moved  # the quantization is real (measured: see the docstring)
    m = load(files["q8_0"])
    assert_within(m.session().forward(ids, all_logits=True), ref, "q8_0 prefill")
    assert_decode_matches(m.session(), ids, ref, "q8_0")
    ref_tokens, ref_logits = reference_greedy(ref_model, ids, N_GREEDY)
    assert_greedy_matches(m.session(), ids, ref_tokens, ref_logits)


def test_a_file_with_an_mtp_layer_runs_its_trunk(tiny: Tiny, tmp_path: Path) -> None:
    """Converted without ``--no-mtp``, a checkpoint with an MTP layer gives a file whose
    block_count counts it (``nextn_predict_layers`` 1, its ``blk.4.*`` and ``nextn.*``
    tensors present); colibri drops it, as the checkpoint path skips ``mtp.*``: the same
    logits, bit for bit, as the file without it."""
    d, _, files = tiny
    mtp = with_mtp_layer(d, tmp_path / "hf-mtp")
    out = tmp_path / "mtp.f32.gguf"
    convert_with_llama_cpp(mtp, out, "f32")
    m = load(out)
    assert (m.config.n_layers, m.config.n_mtp_layers) == (4, 0)
    ids = prompt_ids(40, vocab=VOCAB)
    got = m.session().forward(ids, all_logits=True)
    np.testing.assert_array_equal(got, load(files["f32"]).session().forward(ids, all_logits=True))


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_a_native_container_of_the_file_computes_the_same_bits(
    tiny: Tiny, tmp_path: Path, kind: str
) -> None:
    """``colibri convert`` of the GGUF keeps the cut tensors and the file's conventions
    (``linear_a_neg_exp``, ``linear_v_tiled``): the same logits, bit for bit."""
    from colibri.convert import verify_container, write_container

    _, _, files = tiny
    write_container(files[kind], tmp_path / "native")
    verify_container(tmp_path / "native")
    native = load(tmp_path / "native")
    assert native.config.linear_a_neg_exp
    ids = prompt_ids(40, vocab=VOCAB)
    a = load(files[kind]).session().forward(ids, all_logits=True)
    np.testing.assert_array_equal(native.session().forward(ids, all_logits=True), a)


def _patched(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    """A copy of the file with the first ``old`` (in the header) replaced by ``new``."""
    data = src.read_bytes()
    at = data.index(old)
    assert len(old) == len(new) and at < 1 << 16
    dst.write_bytes(data[:at] + new + data[at + len(old) :])
    return dst


def test_a_missing_ssm_tensor_is_refused(tiny: Tiny, tmp_path: Path) -> None:
    _, _, files = tiny
    bad = _patched(files["f32"], tmp_path / "bad.gguf", b"blk.2.ssm_a", b"blk.2.ssm_x")
    with pytest.raises(ModelFormatError, match=r"'blk\.2\.ssm_a' of linear-attention layer 2 is "
                                               r"missing"):  # fmt: skip
        load(bad)


def test_a_convolution_width_off_the_metadata_is_refused(tiny: Tiny, tmp_path: Path) -> None:
    _, _, files = tiny
    arch = "qwen35moe" if b"qwen35moe" in files["f32"].read_bytes()[:4096] else "qwen3next"
    key = f"{arch}.ssm.conv_kernel".encode()
    u32 = (4).to_bytes(4, "little")  # GGUF value type 4: uint32
    bad = _patched(files["f32"], tmp_path / "bad.gguf", key + u32 + (4).to_bytes(4, "little"),
                   key + u32 + (3).to_bytes(4, "little"))  # fmt: skip
    msg = r"'blk\.0\.ssm_conv1d\.weight' has shape \(64, 4\), but the convolution is 3 wide"
    with pytest.raises(ModelFormatError, match=msg):
        load(bad)


@pytest.mark.parametrize("flag", ["linear_a_neg_exp", "linear_v_tiled"])
def test_the_core_needs_what_the_file_says(tiny: Tiny, flag: str) -> None:
    """The bound is not met by accident: the core told the opposite of one of the file's
    conventions (A taken as log A; Qwen3.5's value heads paired in grouped order) moves
    the logits far past it. (Qwen3-Next's file is grouped: the pairing flag is moot.)"""
    from colibri.engine import handle

    _, model, files = tiny
    cfg = load(files["f32"]).config
    if flag == "linear_v_tiled" and not cfg.linear_v_tiled:
        return
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    plain = handle.model_spec

    def spec(*args: object, **kw: object) -> object:
        s = plain(*args, **kw)
        setattr(s, flag, not getattr(s, flag))
        return s

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(handle, "model_spec", spec)
        m = load(files["f32"])
    got = m.session().forward(ids, all_logits=True)
    assert float(np.abs(got - ref).max()) > 1e-2 * float(np.abs(ref).max())
