"""benchmarks/synthetic_moe.py: random-weight Qwen3-MoE GGUFs shaped like real models.

The tiny preset (1 MB) is written into a temporary directory and checked end to end: the
file is deterministic in its seed, its header is what llama.cpp's converter would write,
colibri loads it (manifest shapes and bytes, a forward pass with finite logits, routing
that varies from token to token, ``colibri info --json``), and llama.cpp loads it too and
computes nearly the same logits. The big presets are checked by arithmetic only; writing
one is a benchmark step (docs/benchmarks.md, "Synthetic MoE presets").
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import gguf
import numpy as np
import pytest

import colibri
from colibri.sources import open_model_source

REPO = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join(str(Path(p).parent) for p in colibri.__path__)
TEXT = "Hello there, the cat is on the mat. Routing should vary from token to token!"


def _load_module() -> ModuleType:
    name = "synthetic_moe"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / "synthetic_moe.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


sm = _load_module()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path: Path = tmp_path_factory.mktemp("synthetic") / "tiny.gguf"
    report = sm.write_synthetic_gguf("tiny", path, seed=0)
    assert report.file_bytes == path.stat().st_size
    return path


@pytest.fixture(scope="module")
def model(tiny: Path) -> colibri.Model:
    return colibri.Model.load(tiny)


# --- presets ------------------------------------------------------------------------------


def test_presets() -> None:
    q = sm.PRESETS["qwen3-30b-a3b"]
    assert (q.n_layers, q.hidden, q.n_heads, q.n_kv_heads, q.head_dim) == (48, 2048, 32, 4, 128)
    assert (q.n_experts, q.top_k, q.expert_ffn, q.vocab) == (128, 8, 768, 151936)
    # Q4_0: 18 bytes per 32 weights; an expert is gate + up + down of 768 x 2048.
    assert q.bytes_per_expert == 3 * 768 * 2048 // 32 * 18 == 2_654_208
    assert q.expert_bytes == 48 * 128 * q.bytes_per_expert
    assert q.routed_bytes_per_token == 8 * 48 * q.bytes_per_expert
    big = [p for p in sm.PRESETS.values() if p.expert_bytes >= 8 << 30]
    assert "moe-8g" in {p.name for p in big}
    small = sm.PRESETS["small"]
    assert 0.9e9 < small.expert_bytes < 1.1e9
    assert sm.PRESETS["tiny"].summary()["tensor_bytes"] < 4 << 20
    for p in sm.PRESETS.values():
        s = p.summary()
        assert s["expert_bytes"] + s["resident_bytes"] == s["tensor_bytes"]
        assert s["tensors"] == 1 + 12 * p.n_layers + 2
    with pytest.raises(ValueError, match="multiple of 32"):
        sm.Preset("bad", 1, 100, 4, 2, 32, 8, 2, 64, 512)


def test_vocabulary() -> None:
    tokens, types, merges = sm.vocabulary(300)
    assert len(tokens) == len(types) == 300
    assert len(set(tokens)) == 300
    assert types[:256] == [1] * 256 and types[-1] == 5
    for m in merges:
        a, b = m.split(" ")
        assert a in tokens and b in tokens and a + b in tokens
    ids = sm.special_ids()
    assert [tokens[i] for i in ids.values()] == list(ids)


# --- the file -----------------------------------------------------------------------------


def test_file_is_deterministic_and_streamed(tiny: Path, tmp_path: Path) -> None:
    again = sm.write_synthetic_gguf("tiny", tmp_path / "again.gguf", seed=0)
    other = sm.write_synthetic_gguf("tiny", tmp_path / "other.gguf", seed=1)
    data = tiny.read_bytes()
    assert again.path.read_bytes() == data
    assert other.path.read_bytes() != data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.gguf", "other.gguf"]
    # A layer's tensors do not depend on how many layers the model has.
    import dataclasses

    two = dataclasses.replace(sm.PRESETS["tiny"], name="tiny-2", n_layers=2)
    sm.write_synthetic_gguf(two, tmp_path / "two.gguf", seed=0)
    a, b = gguf.GGUFReader(tiny), gguf.GGUFReader(tmp_path / "two.gguf")
    ta = {t.name: t for t in a.tensors}
    for t in b.tensors:
        assert np.array_equal(np.asarray(t.data), np.asarray(ta[t.name].data)), t.name


def test_gguf_header(tiny: Path) -> None:
    p = sm.PRESETS["tiny"]
    r = gguf.GGUFReader(tiny)

    def field(key: str) -> object:
        f = r.fields[key]
        v = f.contents()
        return v

    assert field("general.architecture") == "qwen3moe"
    assert field("qwen3moe.block_count") == p.n_layers
    assert field("qwen3moe.embedding_length") == p.hidden
    assert field("qwen3moe.attention.head_count") == p.n_heads
    assert field("qwen3moe.attention.head_count_kv") == p.n_kv_heads
    assert field("qwen3moe.attention.key_length") == p.head_dim
    assert field("qwen3moe.expert_count") == p.n_experts
    assert field("qwen3moe.expert_used_count") == p.top_k
    assert field("qwen3moe.expert_feed_forward_length") == p.expert_ffn
    assert field("tokenizer.ggml.model") == "gpt2"
    assert field("tokenizer.ggml.pre") == "qwen2"
    assert len(r.fields["tokenizer.ggml.tokens"].data) == p.vocab
    specs = {t.name: t for t in p.tensors()}
    assert [t.name for t in r.tensors] == list(specs)
    for t in r.tensors:
        s = specs[t.name]
        assert tuple(reversed(t.shape.tolist())) == s.shape, t.name
        assert t.tensor_type == s.ggml_type, t.name
        assert int(t.n_bytes) == s.nbytes, t.name
    # Weights have the intended spread; norms are ~1; the router is a plain normal.
    tensors = {t.name: t for t in r.tensors}
    up = tensors["blk.0.ffn_up_exps.weight"]
    w = gguf.quants.dequantize(up.data, up.tensor_type)
    assert np.isfinite(w).all()
    assert abs(float(w.std()) - p.hidden**-0.5) < 0.2 * p.hidden**-0.5
    # Zero mean: with q - 8 averaging -0.5, positive scales would give every matrix a
    # rank-one part that collapses all tokens onto one hidden state within a few layers.
    assert abs(float(w.mean())) < 0.02 * float(w.std())
    norm = np.asarray(tensors["blk.0.attn_norm.weight"].data)
    assert 0.9 < float(norm.mean()) < 1.1
    router = np.asarray(tensors["blk.0.ffn_gate_inp.weight"].data)
    assert abs(float(router.std()) - p.hidden**-0.5) < 0.2 * p.hidden**-0.5


def test_bounded_memory(tmp_path: Path) -> None:
    """Peak RSS while writing ~270 MB stays far below the file size (a subprocess)."""
    out = tmp_path / "small4.gguf"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "synthetic_moe.py"), "small", "--layers",
         "4", "-o", str(out), "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["file_bytes"] == out.stat().st_size > 250e6
    assert rep["expert_bytes"] == 4 * 64 * rep["bytes_per_expert"]
    assert rep["peak_rss_bytes"] - rep["rss_before_bytes"] < 80 << 20
    assert "(100%)" in proc.stderr


# --- colibri ------------------------------------------------------------------------------


def test_manifest(tiny: Path) -> None:
    p = sm.PRESETS["tiny"]
    m = open_model_source(tiny)
    c = m.config
    assert c.arch == "qwen3_moe" and c.qk_norm == "head" and not c.tie_word_embeddings
    assert (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim) == (
        p.n_layers, p.hidden, p.n_heads, p.n_kv_heads, p.head_dim
    )  # fmt: skip
    assert (c.n_experts, c.n_experts_per_tok, c.moe_intermediate_size) == (
        p.n_experts, p.top_k, p.expert_ffn
    )  # fmt: skip
    assert c.vocab_size == p.vocab and all(c.moe_layers)
    experts = [t for t in m.tensors.values() if "_exps." in t.name]
    assert len(experts) == 3 * p.n_layers * p.n_experts
    assert all(t.dtype == "Q4_0" for t in experts)
    assert sum(t.nbytes for t in experts) == p.expert_bytes
    one = [m.tensors[f"blk.1.ffn_{w}_exps.5"] for w in ("gate", "up", "down")]
    assert sum(t.nbytes for t in one) == p.bytes_per_expert
    assert one[0].shape == (p.expert_ffn, p.hidden) and one[2].shape == (p.hidden, p.expert_ffn)
    assert m.tensors["blk.0.ffn_gate_inp"].dtype == "F32"
    assert sum(t.nbytes for t in m.tensors.values()) == p.summary()["tensor_bytes"]


def test_forward_and_routing(model: colibri.Model) -> None:
    p = sm.PRESETS["tiny"]
    ids = model.tokenizer.encode(TEXT)
    assert len(ids) >= 16
    s = model.session()
    logits = s.forward(ids, all_logits=True)
    assert logits.shape == (len(ids), p.vocab)
    assert np.isfinite(logits).all() and float(logits.std()) > 0.1
    routing = s.last_routing()
    assert routing.dtype == np.int32 and routing.shape == (len(ids), p.n_layers, p.top_k)
    assert routing.min() >= 0 and routing.max() < p.n_experts
    for layer in range(p.n_layers):
        sets = {frozenset(r) for r in routing[:, layer, :].tolist()}
        assert len(sets) >= len(ids) // 2, (layer, sets)
    assert len(np.unique(routing)) == p.n_experts  # every expert is used somewhere
    # Decoding continues and stays finite.
    for _ in range(4):
        nxt = s.append(int(s.last_logits().argmax()))
        assert np.isfinite(nxt).all()


def test_routing_varies_in_deep_layers(tmp_path: Path) -> None:
    """Twelve layers on: tokens still pick different experts (no collapse of the hidden
    states onto one direction, which random Q4_0 weights with a biased mean produce)."""
    import dataclasses

    deep = dataclasses.replace(sm.PRESETS["tiny"], name="tiny-deep", n_layers=12)
    path = sm.write_synthetic_gguf(deep, tmp_path / "deep.gguf").path
    m = colibri.Model.load(path)
    ids = m.tokenizer.encode(TEXT + " " + TEXT[::-1])
    s = m.session()
    s.forward(ids)
    r = s.last_routing()
    k = deep.top_k
    for layer in range(deep.n_layers):
        used = len(np.unique(r[:, layer, :]))
        same = np.mean(
            [len(set(r[t, layer]) & set(r[t + 1, layer])) / k for t in range(len(ids) - 1)]
        )
        assert used >= deep.n_experts * 3 // 4, (layer, used)
        assert same < 0.75, (layer, same)


def test_chat_template(model: colibri.Model) -> None:
    ids = model.encode_prompt(messages=[{"role": "user", "content": "hi"}])
    sp = sm.special_ids()
    assert ids[0] == sp["<|im_start|>"] and sp["<|im_end|>"] in ids
    assert model.config.eos_token_ids == (sp["<|im_end|>"],)


def test_colibri_info(tiny: Path) -> None:
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    proc = subprocess.run(
        [sys.executable, "-m", "colibri", "info", str(tiny), "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    p = sm.PRESETS["tiny"]
    assert info["architecture"] == "qwen3_moe" and info["source_architecture"] == "qwen3moe"
    moe = info["moe"]
    assert moe["experts_per_layer"] == p.n_experts
    assert moe["experts_per_token"] == p.top_k
    assert moe["moe_layers"] == p.n_layers and moe["dense_layers"] == 0
    assert moe["expert_ffn"] == p.expert_ffn
    assert moe["bytes_per_expert"] == p.bytes_per_expert
    assert moe["routed_bytes"] == p.expert_bytes
    assert info["file_bytes"] == tiny.stat().st_size


# --- llama.cpp ----------------------------------------------------------------------------


def test_llama_cpp_loads_it(tiny: Path, model: colibri.Model) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(tiny), n_ctx=256, n_threads=2, logits_all=True, verbose=False)
    try:
        ids = llm.tokenize(TEXT.encode(), add_bos=False, special=False)
        assert ids == model.tokenizer.encode(TEXT)  # same tokenizer in both engines
        llm.eval(ids)
        ref = np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()
    assert ref.shape == (len(ids), sm.PRESETS["tiny"].vocab)
    assert np.isfinite(ref).all()
    ours = model.session().forward(ids, all_logits=True)
    # Same weights, different activation rounding (8-bit blocks in both, not the same code).
    corr = float(np.corrcoef(ours.ravel(), ref.ravel())[0, 1])
    assert corr > 0.99, corr
    assert float(np.mean(ours.argmax(-1) == ref.argmax(-1))) >= 0.8
