"""Kimi-Linear as llama.cpp's converter (the llama-cpp-python 0.3.36 sdist's
convert_hf_to_gguf.py) writes it, general.architecture ``kimi-linear``, against
transformers on the tiny random checkpoint of support/kimi_linear_factory.py with one
expert group (the converter writes no group count) and the dense layer's FFN under the
released ``mlp.*`` names (support/kimi_linear_gguf.py: the converter cannot map the
``block_sparse_moe.*`` names transformers saves it under). Its KDA layers have 2 heads
beside the MLA layer's 4 (colibri reads the KDA count from ``ssm_a``).

F32 file: every logit at every position within 1e-4 of the largest of transformers' on
the 140-token prompt, for one prefill, for the chunked form of the delta rule and for a
prefill followed by token-by-token decode; the same greedy 20 tokens.
Q8_0 file (embeddings, head, the projections with 32-wide rows and expert gate/up in
Q8_0; narrower rows, norms, convolutions, A and dt_bias in F32) against transformers
running the very values the file stores (support/kimi_linear_gguf.dequantized_model): the
same bound and the same greedy tokens.

Measured (seed 0, 140 tokens): colibri within 3.6e-6 of max |logit| of transformers on the
F32 file and 2.0e-6 on the Q8_0 file (against its dequantized reference), while the Q8_0
weights themselves move transformers' logits by 42% of max |logit| from the float model's
(this tiny random model is that sensitive: its 32-wide rows are one Q8_0 block each),
which is why a quantized file is checked against the values it stores and not against
the float model. MLA's ``attn_k_b`` / ``attn_v_b`` (16-wide rows) are F16 in that file:
the reference joins their decoded values back into ``kv_b_proj``.

A native container written from either file computes the same bits. Bad input: a KDA
layer's missing ssm tensor is a ModelFormatError naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from colibri.errors import ModelFormatError
from support.kimi_linear_factory import VOCAB
from support.kimi_linear_gguf import build, convert, dequantized_model
from support.linear_attn_models import load
from support.logit_checks import assert_decode_matches, assert_greedy_matches, assert_within
from support.modelfactory import prompt_ids, reference_greedy, reference_logits

RTOL = 1e-4
N_PROMPT, N_GREEDY = 140, 20
Tiny = tuple[Path, torch.nn.Module, dict[str, Path]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Tiny:
    """The transformers checkpoint, its model and the converter's F32 and Q8_0 files."""
    root = tmp_path_factory.mktemp("kimi-linear-gguf")
    d, model, released = build(root, seed=0)
    files = {t: convert(released, root / f"kimi.{t}.gguf", t) for t in ("f32", "q8_0")}
    return d, model, files


def test_the_file_maps_to_the_checkpoints_config(tiny: Tiny) -> None:
    """The GGUF's config is the checkpoint's but for A stored as -exp(A_log)."""
    d, _, files = tiny
    hf, gg = load(d).config, load(files["f32"]).config
    assert (hf.linear_a_neg_exp, gg.linear_a_neg_exp) == (False, True)
    assert gg.linear_num_key_heads == 2 and gg.n_heads == 4
    skip = {"linear_a_neg_exp", "max_position_embeddings", "rope_interleaved"}
    diff = {k for k in vars(hf) if k not in skip and getattr(hf, k) != getattr(gg, k)}
    assert not diff, {k: (getattr(hf, k), getattr(gg, k)) for k in diff}


@pytest.mark.parametrize("chunked", [False, True], ids=["recurrent", "chunked"])
def test_f32_prefill_and_decode_match_transformers(tiny: Tiny, chunked: bool) -> None:
    _, model, files = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(model, ids)
    m = load(files["f32"], chunked=chunked)
    assert_within(m.session().forward(ids, all_logits=True), ref, "gguf prefill", RTOL)
    assert_decode_matches(m.session(), ids, ref, "gguf")


def test_f32_greedy_continuation_matches_transformers(tiny: Tiny) -> None:
    _, model, files = tiny
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref_tokens, ref_logits = reference_greedy(model, ids, N_GREEDY)
    assert_greedy_matches(load(files["f32"]).session(), ids, ref_tokens, ref_logits)


def test_q8_0_matches_its_dequantized_weights(tiny: Tiny, tmp_path: Path) -> None:
    d, model, files = tiny
    ref_model = dequantized_model(d, files["q8_0"], tmp_path / "deq")
    ids = prompt_ids(N_PROMPT, vocab=VOCAB)
    ref = reference_logits(ref_model, ids)
    float_ref = reference_logits(model, ids)
    moved = float(np.abs(ref - float_ref).max() / np.abs(float_ref).max())
    assert moved > 1e-2, moved  # the quantization is real (measured: see the docstring)
    m = load(files["q8_0"])
    assert_within(m.session().forward(ids, all_logits=True), ref, "q8_0 prefill", RTOL)
    assert_decode_matches(m.session(), ids, ref, "q8_0")
    ref_tokens, ref_logits = reference_greedy(ref_model, ids, N_GREEDY)
    assert_greedy_matches(m.session(), ids, ref_tokens, ref_logits)


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_a_native_container_of_the_file_computes_the_same_bits(
    tiny: Tiny, tmp_path: Path, kind: str
) -> None:
    """``colibri convert`` of the GGUF keeps the joined convolutions and
    ``linear_a_neg_exp``: the same logits, bit for bit."""
    from colibri.convert import verify_container, write_container

    _, _, files = tiny
    write_container(files[kind], tmp_path / "native")
    verify_container(tmp_path / "native")
    native = load(tmp_path / "native")
    assert native.config.linear_a_neg_exp
    ids = prompt_ids(40, vocab=VOCAB)
    a = load(files[kind]).session().forward(ids, all_logits=True)
    np.testing.assert_array_equal(native.session().forward(ids, all_logits=True), a)


def _renamed(src: Path, dst: Path, old: bytes, new: bytes) -> Path:
    """A copy of the file with the tensor name ``old`` (in the header) renamed ``new``."""
    data = src.read_bytes()
    at = data.index(old)
    assert len(old) == len(new) and at < 1 << 16
    dst.write_bytes(data[:at] + new + data[at + len(old) :])
    return dst


@pytest.mark.parametrize("name", ["ssm_f_b", "ssm_a", "ssm_conv1d_k"])
def test_a_missing_kda_tensor_is_named(tiny: Tiny, tmp_path: Path, name: str) -> None:
    _, _, files = tiny
    old = f"blk.1.{name}".encode()
    bad = _renamed(files["f32"], tmp_path / "bad.gguf", old, b"blk.1.xx" + b"x" * (len(old) - 8))
    with pytest.raises(ModelFormatError, match=f"blk.1.{name}'"):
        load(bad)
