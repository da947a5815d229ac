"""The demo MoE (colibri.models.demo_moe): SmolLM2's dense FFN turned into 8 routed experts.

Every expert is a byte copy of the dense FFN and Mixtral routing renormalizes the top-k
weights. With the paired router (the named model) each token's top-2 is a pair of experts
with equal logits, weights 0.5 and 0.5, so the MoE computes the dense model's logits bit
for bit while the chosen pair changes token by token; with an independent random router
the output is the dense one up to float rounding.

``experts="halves"`` (colibri.models.demo_halves): the two experts of each pair hold complementary
halves of the FFN's neurons, with a different split for every pair, so the experts of a
layer are all distinct while the mixture stays the dense FFN (up to one float addition's
order): tested byte by byte on the structure and against the dense logits.
"""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import colibri
from colibri.errors import ConfigError, ModelFormatError, ModelNotFoundError
from colibri.models import hub
from colibri.models.demo_moe import DEMO_N_EXPERTS, DEMO_TOP_K, make_demo_moe
from colibri.sources import Manifest, TensorInfo, open_model_source
from support.modelfactory import TinyModel
from support.realmodel import smollm2_gguf

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence why the sky is blue.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
]
MAX_TOKENS = 24
EXPERT_KEYS = {"llama.expert_count", "llama.expert_used_count"}


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache directory in which the named demo model was built on first use."""
    smollm2_gguf()  # skips without the weights
    cache = tmp_path_factory.mktemp("colibri-cache")
    log = io.StringIO()
    path = hub.demo_moe_model(cache, log=log)
    assert path == cache / hub.DEMO_FILE
    assert "building the demo MoE" in log.getvalue() and "(100%)" in log.getvalue()
    assert sorted(p.name for p in cache.iterdir()) == [hub.DEMO_FILE]  # no temporary left
    return cache


@pytest.fixture(scope="module")
def demo_path(demo_cache: Path) -> Path:
    return demo_cache / hub.DEMO_FILE


@pytest.fixture(scope="module")
def models(demo_path: Path) -> tuple[colibri.Model, colibri.Model]:
    """(dense SmolLM2, demo MoE), loaded once."""
    return colibri.Model.load(smollm2_gguf()), colibri.Model.load(demo_path)


def _read(manifest: Manifest, t: TensorInfo) -> bytes:
    out = bytearray()
    for e in t.extents:
        with open(manifest.files[e.file], "rb") as fh:
            fh.seek(e.offset)
            out += fh.read(e.length)
    return bytes(out)


def test_structure(demo_path: Path) -> None:
    dense = open_model_source(smollm2_gguf())
    moe = open_model_source(demo_path)
    cfg = moe.config
    assert cfg.arch == "mixtral"
    assert (cfg.n_experts, cfg.n_experts_per_tok) == (DEMO_N_EXPERTS, DEMO_TOP_K) == (8, 2)
    assert cfg.norm_topk_prob and all(cfg.moe_layers)
    assert cfg.moe_intermediate_size == dense.config.intermediate_size == 1536
    assert cfg.intermediate_size == 0

    # All metadata copied (tokenizer, chat template, ...), plus the two expert keys.
    assert set(moe.metadata) == set(dense.metadata) | EXPERT_KEYS
    for key, value in dense.metadata.items():
        assert moe.metadata[key] == value, key
    assert moe.metadata["llama.expert_count"] == 8
    assert moe.metadata["llama.expert_used_count"] == 2

    # Every expert is the dense FFN, byte for byte, in its quantized type.
    for layer in (0, 17, 29):
        for kind in ("gate", "up", "down"):
            d = dense.tensors[f"blk.{layer}.ffn_{kind}"]
            want = _read(dense, d)
            for e in range(8):
                t = moe.tensors[f"blk.{layer}.ffn_{kind}_exps.{e}"]
                assert (t.dtype, t.shape) == (d.dtype, d.shape)
                assert _read(moe, t) == want, (layer, kind, e)

    # Routers: F32 [8, 576]; 4 rows normal(0, 1/sqrt(576)) from default_rng(0), layer by
    # layer, each used by a pair of experts.
    rng = np.random.default_rng(0)
    for layer in range(30):
        r = moe.tensors[f"blk.{layer}.ffn_gate_inp"]
        assert (r.dtype, r.shape) == ("F32", (8, 576))
        rows = (rng.standard_normal((4, 576)) / math.sqrt(576)).astype(np.float32)
        assert _read(moe, r) == np.repeat(rows, 2, axis=0).tobytes()

    # Every other tensor is unchanged.
    others = [n for n in dense.tensors if ".ffn_gate" not in n and ".ffn_up" not in n
              and ".ffn_down" not in n]
    assert len(others) == 272 - 90
    for name in others:
        assert moe.tensors[name].dtype == dense.tensors[name].dtype
        assert _read(moe, moe.tensors[name]) == _read(dense, dense.tensors[name]), name


def test_greedy_text_equals_dense(models: tuple[colibri.Model, colibri.Model]) -> None:
    dense, moe = models
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        want = dense.generate(messages=messages, max_tokens=MAX_TOKENS)
        got = moe.generate(messages=messages, max_tokens=MAX_TOKENS)
        assert got.token_ids == want.token_ids, (prompt, got.text, want.text)
        assert got.text == want.text
        assert len(got.token_ids) >= 8, prompt  # a real answer, not an immediate EOS


@pytest.mark.parametrize("precision", ["int8", "float32"])
def test_logits_bit_identical_to_dense(
    models: tuple[colibri.Model, colibri.Model], precision: str
) -> None:
    dense, moe = models
    ids = dense.encode_prompt(messages=[{"role": "user", "content": PROMPTS[1]}])
    try:
        for m in models:
            m.set_activation_precision(precision)
        a = dense.session().forward(ids, all_logits=True)
        b = moe.session().forward(ids, all_logits=True)
    finally:
        for m in models:
            m.set_activation_precision("auto")
    assert np.array_equal(a, b)


def test_routing_differs_across_tokens(models: tuple[colibri.Model, colibri.Model]) -> None:
    _, moe = models
    ids = moe.encode_prompt(messages=[{"role": "user", "content": PROMPTS[2]}])
    s = moe.session()
    s.forward(ids)
    routing = s.last_routing()
    assert routing.dtype == np.int32
    assert routing.shape == (len(ids), 30, 2)
    assert routing.min() >= 0 and routing.max() < 8  # every layer is an MoE layer
    # Each token's two experts are a pair (2j, 2j+1) of tied router rows.
    assert np.all(routing[:, :, 0] // 2 == routing[:, :, 1] // 2)
    assert np.all(routing[:, :, 0] != routing[:, :, 1])
    # Per layer, the selected pair changes from token to token.
    for layer in range(30):
        pairs = {tuple(sorted(p)) for p in routing[:, layer, :].tolist()}
        assert len(pairs) >= 2, (layer, pairs)
    assert sum(len({tuple(p) for p in routing[:, ly, :].tolist()}) for ly in range(30)) >= 60
    # Across the model every expert is used.
    assert set(np.unique(routing).tolist()) == set(range(8))

    # Decoding one more token routes just that token, and the prefill routing is repeatable.
    s.forward([int(s.last_logits().argmax())])
    assert s.last_routing().shape == (1, 30, 2)
    s2 = moe.session()
    s2.forward(ids)
    assert np.array_equal(s2.last_routing(), routing)


def test_cli_named_model(demo_cache: Path, models: tuple[colibri.Model, colibri.Model]) -> None:
    dense, _ = models
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(Path(p).parent) for p in colibri.__path__)
    proc = subprocess.run(
        [sys.executable, "-m", "colibri", "run", "--model", "smollm2-moe-demo", "--cache-dir",
         str(demo_cache), "-n", "12", "--json", PROMPTS[3]],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["model"]["name"] == "smollm2-moe-demo"
    assert rec["model"]["architecture"] == "mixtral"
    assert rec["model"]["path"] == str(demo_cache / hub.DEMO_FILE)
    want = dense.generate(messages=[{"role": "user", "content": PROMPTS[3]}], max_tokens=12)
    assert rec["token_ids"] == want.token_ids and rec["text"] == want.text


def test_random_router(models: tuple[colibri.Model, colibri.Model], tmp_path: Path) -> None:
    # Independent router rows: any pair of experts, the dense output up to float rounding.
    # With float32 activations that keeps the greedy text (int8 activations can turn a
    # last-bit difference into a flipped rounding; docs/demo-moe.md).
    dense, _ = models
    path = make_demo_moe(smollm2_gguf(), tmp_path / "random.gguf", n_experts=4, top_k=2,
                         seed=1, router="random")
    moe = colibri.Model.load(path, engine=colibri.EngineConfig(activation_precision="float32"))
    dense.set_activation_precision("float32")
    try:
        ids = dense.encode_prompt(messages=[{"role": "user", "content": PROMPTS[0]}])
        a = dense.session().forward(ids, all_logits=True)
        s = moe.session()
        b = s.forward(ids, all_logits=True)
        assert float(np.abs(a - b).max()) <= 1e-5 * float(np.abs(a).max())
        routing = s.last_routing()
        assert np.any(routing[:, :, 0] // 2 != routing[:, :, 1] // 2)  # not only pairs
        for prompt in PROMPTS[:2]:  # float32 activations are slow; the paired test has 5
            messages = [{"role": "user", "content": prompt}]
            want = dense.generate(messages=messages, max_tokens=MAX_TOKENS)
            got = moe.generate(messages=messages, max_tokens=MAX_TOKENS)
            assert got.token_ids == want.token_ids, (prompt, got.text, want.text)
    finally:
        dense.set_activation_precision("auto")


# --- on a tiny model: exact arithmetic, options, errors --------------------------------------


def test_tiny_llama(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    src = tiny_models["llama"].gguf["F32"]
    dst = make_demo_moe(src, tmp_path / "moe.gguf", n_experts=4, top_k=3, seed=7,
                        router="random")
    cfg = open_model_source(dst).config
    assert (cfg.arch, cfg.n_experts, cfg.n_experts_per_tok) == ("mixtral", 4, 3)
    dense, moe = colibri.Model.load(src), colibri.Model.load(dst)
    ids = list(range(3, 40))
    a = dense.session().forward(ids, all_logits=True)
    s = moe.session()
    b = s.forward(ids, all_logits=True)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    assert s.last_routing().shape == (len(ids), cfg.n_layers, 3)

    # Deterministic: the same seed gives the same bytes, another seed another router.
    again = make_demo_moe(src, tmp_path / "again.gguf", n_experts=4, top_k=3, seed=7,
                          router="random")
    assert again.read_bytes() == dst.read_bytes()
    other = make_demo_moe(src, tmp_path / "other.gguf", n_experts=4, top_k=3, seed=8,
                          router="random")
    assert other.read_bytes() != dst.read_bytes()
    assert other.stat().st_size == dst.stat().st_size


def test_tiny_llama_paired_is_bit_identical(tiny_models: dict[str, TinyModel],
                                            tmp_path: Path) -> None:
    for dtype in ("F32", "Q8_0", "Q4_0"):
        src = tiny_models["llama"].gguf[dtype]
        dst = make_demo_moe(src, tmp_path / f"paired-{dtype}.gguf", n_experts=6, seed=2)
        ids = list(range(3, 40))
        a = colibri.Model.load(src).session().forward(ids, all_logits=True)
        s = colibri.Model.load(dst).session()
        b = s.forward(ids, all_logits=True)
        assert np.array_equal(a, b), dtype
        pairs = s.last_routing() // 2
        assert np.all(pairs[:, :, 0] == pairs[:, :, 1])
        assert len(np.unique(pairs)) == 3


def _halves_layout(dense: Manifest, moe: Manifest, layer: int, n_experts: int,
                   all_distinct: bool = True) -> None:
    """Each expert of `layer` holds whole 32-neuron groups of the dense FFN: gate/up rows as
    they are, down columns with every block scale doubled; the two experts of a pair hold
    complementary groups, and (`all_distinct`: with enough groups for random splits to
    differ) no two experts of the layer are the same."""
    ffn = dense.tensors[f"blk.{layer}.ffn_gate"].shape[0]
    n_groups = ffn // 32
    rows = {kind: np.frombuffer(_read(dense, dense.tensors[f"blk.{layer}.ffn_{kind}"]),
                                dtype=np.uint8) for kind in ("gate", "up", "down")}  # fmt: skip
    gate_row = len(rows["gate"]) // ffn
    hidden = dense.tensors[f"blk.{layer}.ffn_down"].shape[0]
    down = rows["down"].reshape(hidden, n_groups, -1)
    dtype = dense.tensors[f"blk.{layer}.ffn_down"].dtype
    blobs = set()
    groups_of = []
    for e in range(n_experts):
        gate = np.frombuffer(_read(moe, moe.tensors[f"blk.{layer}.ffn_gate_exps.{e}"]),
                             dtype=np.uint8).reshape(ffn // 2, gate_row)
        dense_gate = rows["gate"].reshape(ffn, gate_row)
        # which dense rows: every expert row is one of them, in 32-row groups, in order
        found = [int(np.flatnonzero((dense_gate == r).all(1))[0]) for r in gate[::32]]
        groups = [f // 32 for f in found]
        assert all(f % 32 == 0 for f in found) and groups == sorted(groups), (layer, e)
        idx = (np.asarray(groups)[:, None] * 32 + np.arange(32)).reshape(-1)
        assert np.array_equal(gate, dense_gate[idx]), (layer, e)
        up = _read(moe, moe.tensors[f"blk.{layer}.ffn_up_exps.{e}"])
        assert up == rows["up"].reshape(ffn, -1)[idx].tobytes(), (layer, e)
        got = np.frombuffer(_read(moe, moe.tensors[f"blk.{layer}.ffn_down_exps.{e}"]),
                            dtype=np.uint8).reshape(hidden, len(groups), -1)
        want = down[:, groups, :]
        if dtype == "F32":
            assert np.array_equal(got.view(np.float32), 2 * want.view(np.float32))
        else:
            n_scales = 2 if dtype == "Q4_1" else 1  # fp16 d (and m) lead each block
            assert np.array_equal(got[:, :, 2 * n_scales:], want[:, :, 2 * n_scales:])
            assert np.array_equal(got[:, :, : 2 * n_scales].copy().view(np.float16),
                                  2 * want[:, :, : 2 * n_scales].copy().view(np.float16))
        blobs.add(gate.tobytes())
        groups_of.append(set(groups))
    for j in range(0, n_experts, 2):
        a, b = groups_of[j], groups_of[j + 1]
        assert not a & b and a | b == set(range(n_groups)), (layer, j)
    assert len(blobs) == (n_experts if all_distinct else len(blobs)) >= 2, layer


@pytest.mark.parametrize("dtype", ["F32", "Q8_0", "Q4_0", "Q4_1"])
def test_tiny_llama_halves(tiny_models: dict[str, TinyModel], tmp_path: Path,
                           dtype: str) -> None:
    src = tiny_models["llama"].gguf[dtype]
    dst = make_demo_moe(src, tmp_path / f"halves-{dtype}.gguf", n_experts=8, seed=4,
                        experts="halves")
    dense_src, moe_src = open_model_source(src), open_model_source(dst)
    cfg = moe_src.config
    assert (cfg.arch, cfg.n_experts, cfg.n_experts_per_tok) == ("mixtral", 8, 2)
    assert cfg.moe_intermediate_size == dense_src.config.intermediate_size // 2 == 64
    assert moe_src.metadata["llama.feed_forward_length"] == 64
    for layer in range(cfg.n_layers):  # 4 groups of 32: 6 possible halves for 8 experts
        _halves_layout(dense_src, moe_src, layer, 8, all_distinct=False)
    ids = list(range(3, 40))
    for precision in ("float32", "int8"):
        engine = colibri.EngineConfig(activation_precision=precision)
        a = colibri.Model.load(src, engine=engine).session().forward(ids, all_logits=True)
        s = colibri.Model.load(dst, engine=engine).session()
        b = s.forward(ids, all_logits=True)
        if precision == "float32":  # one float addition's order apart: float32 rounding
            assert float(np.abs(a - b).max()) <= 1e-5 * float(np.abs(a).max()), dtype
        else:  # int8: a last-bit difference can flip an 8-bit rounding (module docstring)
            assert float(np.mean(a.argmax(-1) == b.argmax(-1))) >= 0.9, dtype
        pairs = s.last_routing() // 2
        assert np.all(pairs[:, :, 0] == pairs[:, :, 1]) and len(np.unique(pairs)) == 4


def test_smollm2_halves_equal_dense(models: tuple[colibri.Model, colibri.Model],
                                    tmp_path: Path) -> None:
    """On the real model: 4 distinct experts per layer (2 pairs of halves), float32 logits
    equal to the dense model's up to float rounding, and the same greedy answer."""
    dense, _ = models
    path = make_demo_moe(smollm2_gguf(), tmp_path / "halves.gguf", n_experts=4, seed=5,
                         experts="halves")
    d, m = open_model_source(smollm2_gguf()), open_model_source(path)
    for layer in (0, 29):
        _halves_layout(d, m, layer, 4)
    moe = colibri.Model.load(path, engine=colibri.EngineConfig(activation_precision="float32"))
    dense.set_activation_precision("float32")
    try:
        messages = [{"role": "user", "content": PROMPTS[0]}]
        ids = dense.encode_prompt(messages=messages)
        a = dense.session().forward(ids, all_logits=True)
        s = moe.session()
        b = s.forward(ids, all_logits=True)
        assert float(np.abs(a - b).max()) <= 1e-5 * float(np.abs(a).max())
        assert set(np.unique(s.last_routing()).tolist()) == {0, 1, 2, 3}
        want = dense.generate(messages=messages, max_tokens=MAX_TOKENS)
        got = moe.generate(messages=messages, max_tokens=MAX_TOKENS)
        assert got.token_ids == want.token_ids, (got.text, want.text)
    finally:
        dense.set_activation_precision("auto")


def test_errors(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    src = tiny_models["llama"].gguf["Q8_0"]
    out = tmp_path / "out.gguf"
    with pytest.raises(ModelNotFoundError):
        make_demo_moe(tmp_path / "missing.gguf", out)
    with pytest.raises(ConfigError, match="top_k"):
        make_demo_moe(src, out, n_experts=4, top_k=5, router="random")
    with pytest.raises(ConfigError, match="n_experts"):
        make_demo_moe(src, out, n_experts=0)
    with pytest.raises(ConfigError, match="paired"):
        make_demo_moe(src, out, n_experts=4, top_k=3)
    with pytest.raises(ConfigError, match="paired"):
        make_demo_moe(src, out, n_experts=5, top_k=2)
    with pytest.raises(ConfigError, match="router"):
        make_demo_moe(src, out, router="tied")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="experts"):
        make_demo_moe(src, out, experts="thirds")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="paired"):
        make_demo_moe(src, out, n_experts=4, top_k=2, router="random", experts="halves")
    with pytest.raises(ModelFormatError, match="already a mixture of experts"):
        make_demo_moe(tiny_models["mixtral"].gguf["Q8_0"], out)
    with pytest.raises(ModelFormatError, match="qwen3moe"):
        make_demo_moe(tiny_models["qwen3_moe"].gguf["Q8_0"], out)
    notgguf = tmp_path / "x.gguf"
    notgguf.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelFormatError, match="not a readable GGUF"):
        make_demo_moe(notgguf, out)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.gguf"]  # no temporaries left


def test_gguf_reader_sees_a_mixtral_file(tiny_models: dict[str, TinyModel],
                                         tmp_path: Path) -> None:
    # What llama.cpp reads: stacked expert tensors with GGML ne = [cols, rows, n_experts].
    src = tiny_models["llama"].gguf["Q8_0"]
    dst = make_demo_moe(src, tmp_path / "moe.gguf", n_experts=4, top_k=2)
    r = gguf.GGUFReader(dst)
    t = {x.name: x for x in r.tensors}
    d = {x.name: x for x in gguf.GGUFReader(src).tensors}
    dense = d["blk.0.ffn_up.weight"]
    up = t["blk.0.ffn_up_exps.weight"]
    assert up.tensor_type == dense.tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert up.shape.tolist() == [*dense.shape.tolist(), 4]
    router = t["blk.0.ffn_gate_inp.weight"]
    assert router.tensor_type == gguf.GGMLQuantizationType.F32
    assert router.shape.tolist() == [64, 4]
    assert "blk.0.ffn_up.weight" not in t
