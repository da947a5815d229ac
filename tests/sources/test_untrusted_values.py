"""Defects 2, 4, 5 and 8 of issue 8: hostile header values.

2. A count or size from a header never sizes a loop or an allocation before it is checked
   against the file (block_count = 0x7fffffff used to grow memory forever).
4. Metadata of the wrong type or range is a ModelFormatError naming the field, never a
   TypeError / ValueError / ZeroDivisionError / KeyError from the parsing code.
5. Values that make NaN (a RoPE base <= 0, a negative epsilon, a RoPE factor of 0, a
   rope_freqs of zeros, a type change that shrinks a tensor, a safetensors header one byte
   short) are rejected at load; non-finite logits at run time are a NumericalError.
8. A container manifest is checked against its schema at open.

Inputs that used to hang run in a child process with a memory cap and a timeout
(untrusted.bounded), so a regression fails instead of stalling the suite.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import colibri
from colibri.errors import (
    InvalidRequestError,
    ModelFormatError,
    NumericalError,
    UnsupportedArchitectureError,
)
from colibri.sources import open_model_source
from colibri.tokenizers import Tokenizer
from colibri.tokenizers.gguf_meta import TOKENIZER_PREFIXES, read_metadata
from fuzz import gguf_codec as G
from support.modelfactory import TinyModel, write_gguf
from support.realmodel import smollm2_gguf
from support.untrusted import bounded, copy_dir, edit_gguf, edit_json, set_kv


def _rejected(out: Any, error: str = "ModelFormatError", match: str = "") -> None:
    assert (out.kind, out.error) == ("colibri_error", error), (out.kind, out.error, out.detail)
    assert match in out.detail, out.detail


# ------------------------------------------------------------------------------ defect 2


@pytest.mark.parametrize(("family", "key", "value", "match"), [
    ("llama", "llama.block_count", 0x7FFFFFFF, "says 2147483647 layers"),
    ("qwen3_moe", "qwen3moe.block_count", 2**63, "block_count"),
    ("qwen3_moe", "qwen3moe.expert_count", 0x7FFFFFFF, "expert_count is 2147483647"),
    ("mixtral", "llama.expert_count", 2**40, "expert_count"),
])  # fmt: skip
def test_gguf_counts_checked_against_tensors(tiny_models: dict[str, TinyModel], tmp_path: Path,
                                             family: str, key: str, value: int,
                                             match: str) -> None:  # fmt: skip
    p = edit_gguf(tiny_models[family].gguf["Q8_0"], tmp_path / "m.gguf",
                  lambda d: set_kv(d, key, value, G.U64))  # fmt: skip
    _rejected(bounded(lambda: open_model_source(p)), match=match)


def test_gguf_layer_count_matching_a_fake_tensor_name(tiny_models: dict[str, TinyModel],
                                                      tmp_path: Path) -> None:  # fmt: skip
    """A header whose count agrees with one far-away tensor name still has gaps."""

    def edit(d: G.GGUFDoc) -> None:
        set_kv(d, "llama.block_count", 2**31 - 1)
        next(t for t in d.tensors if t.name == "blk.2.attn_norm.weight").name = (
            "blk.2147483646.attn_norm.weight")

    p = edit_gguf(tiny_models["llama"].gguf["Q8_0"], tmp_path / "m.gguf", edit)
    _rejected(bounded(lambda: open_model_source(p)), match="layers")


def test_gguf_entry_counts_checked_against_the_file(tiny_models: dict[str, TinyModel],
                                                    tmp_path: Path) -> None:  # fmt: skip
    def edit(d: G.GGUFDoc) -> None:
        d.n_tensors = 2**62

    p = edit_gguf(tiny_models["llama"].gguf["Q8_0"], tmp_path / "m.gguf", edit)
    _rejected(bounded(lambda: open_model_source(p)), match="more than the")


@pytest.mark.parametrize(("key", "value"), [("num_hidden_layers", 2**31),
                                            ("num_hidden_layers", 2**40),
                                            ("num_experts", 2**31),
                                            ("num_experts", 2**28)])  # fmt: skip
def test_hf_counts_checked_against_tensors(tiny_models: dict[str, TinyModel], tmp_path: Path,
                                           key: str, value: int) -> None:  # fmt: skip
    d = copy_dir(tiny_models["qwen3_moe"].hf_dir, tmp_path / "m")
    edit_json(d / "config.json", lambda c: c.update({key: value, "num_local_experts": value}
                                                    if key == "num_experts" else {key: value}))
    _rejected(bounded(lambda: open_model_source(d)))


@pytest.fixture(scope="module")
def container(tiny_models: dict[str, TinyModel], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from colibri.convert import write_container

    c = tmp_path_factory.mktemp("native") / "qwen3.colibri"
    write_container(tiny_models["qwen3_moe"].gguf["Q8_0"], c)
    return c


@pytest.fixture(scope="module")
def llama_container(tiny_models: dict[str, TinyModel],
                    tmp_path_factory: pytest.TempPathFactory) -> Path:  # fmt: skip
    from colibri.convert import write_container

    c = tmp_path_factory.mktemp("native") / "llama.colibri"
    write_container(tiny_models["llama"].gguf["Q8_0"], c)
    return c


def _edited_container(src: Path, dst: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    d = copy_dir(src, dst)
    edit_json(d / "manifest.json", edit)
    return d


@pytest.mark.parametrize(("what", "edit", "match"), [
    ("n_experts", lambda m: m["config"].update(n_experts=2**28), "experts"),
    ("n_layers", lambda m: m["config"].update(n_layers=2**31 - 1), "layers"),
    ("blob beyond experts.bin", lambda m: m["experts"][3].update(length=8 << 30), "blob"),
    ("blob offset", lambda m: m["experts"][3].update(offset=2**62), ""),
    ("file size claim", lambda m: m["files"]["experts"].update(size=16 << 30), "bytes"),
])  # fmt: skip
def test_container_counts_and_extents(container: Path, tmp_path: Path, what: str,
                                      edit: Callable[[dict[str, Any]], None],
                                      match: str) -> None:  # fmt: skip
    d = _edited_container(container, tmp_path / "c", edit)
    _rejected(bounded(lambda: colibri.Model.load(d)), match=match)


# ------------------------------------------------------------------------------ defect 4


@pytest.mark.parametrize(("key", "value", "vtype"), [
    ("llama.block_count", "3", G.STRING),
    ("llama.attention.head_count", 0, G.U32),
    ("llama.attention.head_count", 4.5, G.F32),
    ("llama.attention.head_count_kv", 3, G.U32),  # 4 heads in groups of 3
    ("llama.embedding_length", True, G.BOOL),
    ("llama.rope.freq_base", "10000", G.STRING),
    ("llama.attention.layer_norm_rms_epsilon", [1e-5], G.ARRAY),
    ("tokenizer.ggml.bos_token_id", "1", G.STRING),
    ("llama.context_length", -5, G.I32),
    ("llama.rope.scaling.type", 7, G.U32),
])  # fmt: skip
def test_gguf_metadata_of_the_wrong_type(tiny_models: dict[str, TinyModel], tmp_path: Path,
                                         key: str, value: Any, vtype: int) -> None:  # fmt: skip
    p = edit_gguf(tiny_models["llama"].gguf["Q8_0"], tmp_path / "m.gguf",
                  lambda d: set_kv(d, key, value, vtype))  # fmt: skip
    with pytest.raises(ModelFormatError):
        open_model_source(p)


@pytest.mark.parametrize(("key", "value"), [
    ("num_attention_heads", 0), ("num_attention_heads", "4"), ("num_attention_heads", [4]),
    ("hidden_size", {}), ("rms_norm_eps", "x"), ("num_experts_per_tok", {"x": 2}),
    ("num_experts_per_tok", 99), ("decoder_sparse_step", "x"), ("mlp_only_layers", 3),
    ("vocab_size", 1.5), ("head_dim", 7), ("max_position_embeddings", -1),
    ("norm_topk_prob", "yes"), ("rope_scaling", [1]),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}),  # no low/high_freq_factor
    ("rope_scaling", {"rope_type": "linear"}),  # no factor
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "beta_fast": "fast"}),
])  # fmt: skip
def test_hf_config_of_the_wrong_type(tiny_models: dict[str, TinyModel], tmp_path: Path,
                                     key: str, value: Any) -> None:  # fmt: skip
    d = copy_dir(tiny_models["qwen3_moe"].hf_dir, tmp_path / "m")

    def edit(c: dict[str, Any]) -> None:
        c[key] = value
        if key == "rope_scaling":
            c.pop("rope_parameters", None)

    edit_json(d / "config.json", edit)
    with pytest.raises(ModelFormatError):
        colibri.Model.load(d)


def test_hf_empty_expert_stack(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    d = copy_dir(tiny_models["qwen3_moe"].hf_dir, tmp_path / "m")
    sd = {k: v for k, v in load_file(str(d / "model.safetensors")).items()
          if ".experts." not in k or not k.startswith("model.layers.0.")}  # fmt: skip
    sd["model.layers.0.mlp.experts.gate_up_proj"] = np.zeros((0, 64, 64), np.float32)
    sd["model.layers.0.mlp.experts.down_proj"] = np.zeros((0, 64, 32), np.float32)
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(ModelFormatError):
        open_model_source(d)


def test_gguf_token_that_is_not_utf8() -> None:
    """One flipped bit in a SmolLM2 token makes it invalid UTF-8: the tokenizer still
    builds (that token can never come from text, so encoding is unchanged) and decodes
    the token to its bytes, as llama.cpp does."""
    path = smollm2_gguf()
    md = read_metadata(path, TOKENIZER_PREFIXES)
    ref = Tokenizer.from_gguf_metadata(md, str(path))
    i = ref.encode("Paris", add_special_tokens=False)[0]
    tokens = list(md["tokenizer.ggml.tokens"])
    raw = tokens[i].encode("utf-8")
    bad = bytes([raw[0] | 0x80]) + raw[1:]  # 'P' (0x50) -> 0xD0: a lead byte, no continuation
    tokens[i] = bad.decode("utf-8", "surrogateescape")  # as the header reader keeps it
    flipped = Tokenizer.from_gguf_metadata({**md, "tokenizer.ggml.tokens": tokens}, str(path))
    text = "The capital of France is not London, and never was."
    ids = ref.encode(text)
    assert i not in ids
    assert flipped.encode(text) == ids and flipped.decode(ids) == text
    assert flipped.token_bytes(i) == bad  # decodes to the bytes the file holds


def test_gguf_tokenizer_metadata_of_the_wrong_type(tiny_models: dict[str, TinyModel]) -> None:
    path = tiny_models["llama"].gguf["Q8_0"]
    md = read_metadata(path, TOKENIZER_PREFIXES)
    for key, value in (("tokenizer.ggml.scores", ["x"] * len(md["tokenizer.ggml.tokens"])),
                       ("tokenizer.ggml.token_type", [99] * len(md["tokenizer.ggml.tokens"])),
                       ("tokenizer.ggml.tokens", [1, 2, 3]), ("tokenizer.ggml.model", 5),
                       ("tokenizer.ggml.merges", [1]), ("tokenizer.chat_template", 3)):  # fmt: skip
        with pytest.raises(ModelFormatError):
            Tokenizer.from_gguf_metadata({**md, key: value}, str(path))


# ------------------------------------------------------------------------------ defect 5


@pytest.mark.parametrize(("key", "value"), [
    ("llama.rope.freq_base", 0.0), ("llama.rope.freq_base", -1.0),
    ("llama.rope.freq_base", math.nan), ("llama.rope.freq_base", math.inf),
    ("llama.attention.layer_norm_rms_epsilon", -1e-5),
    ("llama.attention.layer_norm_rms_epsilon", math.nan),
    ("llama.rope.scaling.factor", 0.0),
])  # fmt: skip
def test_gguf_values_that_make_nan(tiny_models: dict[str, TinyModel], tmp_path: Path,
                                   key: str, value: float) -> None:  # fmt: skip
    def edit(d: G.GGUFDoc) -> None:
        set_kv(d, key, value, G.F32)
        if "scaling" in key:
            set_kv(d, "llama.rope.scaling.type", "linear")

    p = edit_gguf(tiny_models["llama"].gguf["Q8_0"], tmp_path / "m.gguf", edit)
    with pytest.raises(ModelFormatError):
        colibri.Model.load(p)


@pytest.mark.parametrize(("key", "value"), [
    ("rope_theta", 0), ("rope_theta", -10000.0), ("rope_theta", math.nan),
    ("rms_norm_eps", -1e-6), ("rms_norm_eps", math.nan), ("rms_norm_eps", 10.0),
    ("rope_scaling", {"rope_type": "linear", "factor": 0.0}),
    ("rope_scaling", {"rope_type": "yarn", "factor": -4.0}),
])  # fmt: skip
def test_hf_values_that_make_nan(tiny_models: dict[str, TinyModel], tmp_path: Path,
                                 key: str, value: Any) -> None:  # fmt: skip
    d = copy_dir(tiny_models["llama"].hf_dir, tmp_path / "m")

    def edit(c: dict[str, Any]) -> None:
        c.pop("rope_parameters", None)
        c[key] = value

    edit_json(d / "config.json", edit)
    with pytest.raises(ModelFormatError):
        colibri.Model.load(d)


def test_rope_freqs_of_zeros(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    ok, bad = tmp_path / "ok.gguf", tmp_path / "zeros.gguf"
    write_gguf(tiny_models["llama"].hf_dir, ok, "Q8_0",
               extra={"rope_freqs": np.full(8, 2.0, np.float32)})  # fmt: skip
    write_gguf(tiny_models["llama"].hf_dir, bad, "Q8_0",
               extra={"rope_freqs": np.zeros(8, np.float32)})  # fmt: skip
    with colibri.Model.load(ok) as m:
        assert np.all(np.isfinite(m.session().forward([1, 2, 3])))
    with pytest.raises(ModelFormatError, match="rope_freqs must hold finite values > 0"):
        colibri.Model.load(bad)


def test_type_change_that_shrinks_a_tensor(tiny_models: dict[str, TinyModel],
                                           tmp_path: Path) -> None:  # fmt: skip
    """attn_norm F32 -> F16 halves its bytes; the file is unchanged, so every later byte
    of the old tensor would be nobody's: the layout check finds the gap."""

    def edit(d: G.GGUFDoc) -> None:
        next(t for t in d.tensors if t.name == "blk.1.attn_norm.weight").ggml_type = 1

    p = edit_gguf(tiny_models["llama"].gguf["Q8_0"], tmp_path / "m.gguf", edit)
    with pytest.raises(ModelFormatError, match="unused bytes between"):
        open_model_source(p)


def test_safetensors_header_length_one_short(tiny_models: dict[str, TinyModel],
                                             tmp_path: Path) -> None:  # fmt: skip
    """A header padded with spaces still parses when its length is one short; then every
    tensor would be read one byte early. The data region must be exactly covered."""
    d = copy_dir(tiny_models["llama"].hf_dir, tmp_path / "m")
    f = d / "model.safetensors"
    data = f.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + n].rstrip(b" ") + b"    "
    data = struct.pack("<Q", len(header)) + header + data[8 + n :]
    f.write_bytes(data)
    assert open_model_source(d).config.arch == "llama"  # padded: fine
    f.write_bytes(struct.pack("<Q", len(header) - 1) + data[8:])
    with pytest.raises(ModelFormatError, match="belong to no tensor"):
        open_model_source(d)


def test_nan_logits_are_a_model_error(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    """Weights that compute NaN (they pass every load check: NaN is a valid float) make
    generate() raise NumericalError, a ModelFormatError, not a request error."""
    p = tmp_path / "nan.gguf"

    def nan_norm(name: str, a: np.ndarray) -> tuple[np.ndarray, Any]:
        return (np.full_like(a, np.nan), None) if name == "output_norm.weight" else (a, None)

    write_gguf(tiny_models["llama"].hf_dir, p, "F32", edit=nan_norm)
    with colibri.Model.load(p) as m:
        assert np.all(np.isnan(m.session().forward([1, 2])))  # forward returns them as they are
        with pytest.raises(NumericalError, match="non-finite logits") as err:
            m.generate([1, 2, 3], max_tokens=2)
        assert isinstance(err.value, ModelFormatError)
        assert not isinstance(err.value, InvalidRequestError)


# ------------------------------------------------------------------------------ defect 8


@pytest.mark.parametrize(("what", "edit", "error", "match"), [
    ("arch", lambda m: m["config"].update(arch="abc"), UnsupportedArchitectureError, "'abc'"),
    ("crc32 null", lambda m: m["dense"][0].update(crc32=None), ModelFormatError, "crc32"),
    ("crc32 string", lambda m: m["experts"][0].update(crc32="0"), ModelFormatError, "crc32"),
    ("crc32 too big", lambda m: m["dense"][0].update(crc32=2**32), ModelFormatError, "crc32"),
    ("permute bool", lambda m: m["dense"][2].update(rope_unpermute_heads=True),
     ModelFormatError, "rope_unpermute_heads"),
    ("permute on a norm", lambda m: m["dense"][1].update(rope_unpermute_heads=4),
     ModelFormatError, "rope_unpermute_heads"),
    ("permute missing", lambda m: m["dense"][0].pop("rope_unpermute_heads"),
     ModelFormatError, "rope_unpermute_heads"),
    ("expert width 0", lambda m: m["experts"][0]["gate"].update(shape=[0, 64]),
     ModelFormatError, "shape"),
    ("record not an object", lambda m: m["experts"].__setitem__(0, 5), ModelFormatError,
     r"experts\[0\]"),
    ("unknown key", lambda m: m["dense"][0].update(crc=1), ModelFormatError, "unknown key"),
    ("missing key", lambda m: m["experts"][0].pop("down"), ModelFormatError, "'down'"),
    ("file name", lambda m: m["files"]["dense"].update(name="../x.bin"), ModelFormatError,
     "files.dense.name"),
    ("tokenizer file", lambda m: m.update(tokenizer_files=["../../etc/passwd"]),
     ModelFormatError, "tokenizer_files"),
    ("dense not a list", lambda m: m.update(dense={}), ModelFormatError, "dense"),
    ("config type", lambda m: m["config"].update(n_heads="4"), ModelFormatError, "n_heads"),
    # A model without linear layers still has their fields (found by the model-file fuzz
    # campaign: a list here was a TypeError in the budget's linear_state_bytes).
    ("linear field type", lambda m: m["config"].update(linear_conv_kernel=[0]),
     ModelFormatError, "linear_conv_kernel"),
    ("linear flag type", lambda m: m["config"].update(linear_kda=[0]), ModelFormatError,
     "linear_kda"),
    ("source kind", lambda m: m["source"].update(kind="onnx"), ModelFormatError, "kind"),
])  # fmt: skip
def test_container_manifest_schema(container: Path, tmp_path: Path, what: str,
                                   edit: Callable[[dict[str, Any]], None], error: type,
                                   match: str) -> None:  # fmt: skip
    d = _edited_container(container, tmp_path / "c", edit)
    with pytest.raises(error, match=match):
        colibri.Model.load(d)
    from colibri.convert import verify_container

    problems = verify_container(d)  # `colibri verify` reports the same, without a traceback
    assert len(problems) == 1 and re.search(match, problems[0])


def test_container_permutation_allowed_on_q_and_k(llama_container: Path) -> None:
    doc = json.loads((llama_container / "manifest.json").read_text())
    heads = {r["name"]: r["rope_unpermute_heads"] for r in doc["dense"]}
    assert heads["blk.0.attn_q"] == 4 and heads["blk.0.attn_k"] == 2
    assert colibri.Model.load(llama_container).config.arch == "llama"


def test_config_validated_in_one_place_for_every_source(
    container: Path, tmp_path: Path, tiny_models: dict[str, TinyModel]
) -> None:
    """The same bad value (top-k above the experts) is the same error from each source."""
    d = _edited_container(container, tmp_path / "c",
                          lambda m: m["config"].update(n_experts_per_tok=99))  # fmt: skip
    h = copy_dir(tiny_models["qwen3_moe"].hf_dir, tmp_path / "h")
    edit_json(h / "config.json", lambda c: c.update(num_experts_per_tok=99))
    g = edit_gguf(tiny_models["qwen3_moe"].gguf["Q8_0"], tmp_path / "g.gguf",
                  lambda doc: set_kv(doc, "qwen3moe.expert_used_count", 99))  # fmt: skip
    for path in (d, h, g):
        with pytest.raises(ModelFormatError, match=r"n_experts_per_tok must be in \[1, n_exp"):
            open_model_source(path)


@pytest.mark.parametrize("eos", [2**31 - 1, -(2**63), 256])
def test_generation_config_eos_beyond_the_vocabulary(tmp_path: Path, eos: int) -> None:
    """Found by the long campaign (tests/fuzz/regressions/safetensors-eos-id-beyond-vocab):
    an eos id no token has raised IndexError while the tokenizer was built."""
    from fuzz.seeds import _byte_level_tokenizer

    _byte_level_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, 3]}))
    tok = Tokenizer.from_hf(tmp_path)
    assert tok.eos_ids == frozenset({3})
