"""Routing regimes of the synthetic writers (benchmarks/synthetic_routing.py): what the
router weights do to the routing, measured from colibri's own router on text.

* ``uniform``: the router reads only the token channel, so every token's experts are a
  function of the token alone; the oracle recomputes them from the file with gguf.quants
  (Q4_0 embedding rows, F32 norm and router) and NumPy's top-k;
* the regimes order as intended on the same text: distinct experts per 32 tokens
  uniform > realistic > local, per-layer LRU hit rates local > realistic > uniform, each
  in the band measured for this test preset;
* a regime changes only what it must: the channel rows of the residual writers are zero,
  the routers are rescaled, every other tensor is byte for byte the local file's.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

import colibri

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import routing_stats as rs
import synthetic_moe as sm
import synthetic_routing as sr

PRESET = dataclasses.replace(
    sm.PRESETS["small"], name="regimes", n_layers=6, hidden=256, n_heads=4, n_kv_heads=2,
    head_dim=64, n_experts=64, top_k=8, expert_ffn=64, vocab=512, context_length=1024,
)  # fmt: skip
TEXT = ("The river had carved its way through the valley for ten thousand years, and the "
        "town that grew along its banks learned to read the water the way other towns read "
        "the sky. Fishermen argued about currents over breakfast; children raced paper boats.")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("regimes")
    return {r: sm.write_synthetic_gguf(sm.with_routing(PRESET, r), d / f"{r}.gguf").path
            for r in sr.REGIMES}  # fmt: skip


def _routing(path: Path) -> tuple[np.ndarray, list[int]]:
    m = colibri.Model.load(path)
    ids = m.tokenizer.encode(TEXT)
    s = m.session()
    s.forward(ids)
    r = s.last_routing()
    m.close()
    return r, ids


def _tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def test_unknown_regime_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown routing regime 'bursty'"):
        sm.with_routing("tiny", "bursty")


def test_local_is_the_regime_free_file(files: dict[str, Path], tmp_path: Path) -> None:
    plain = sm.write_synthetic_gguf(PRESET, tmp_path / "plain.gguf").path
    assert plain.read_bytes() == files["local"].read_bytes()
    assert sm.default_path(sm.with_routing("moe-8g", "local")) == sm.default_path("moe-8g")
    assert "realistic" in sm.default_path(sm.with_routing("moe-8g", "realistic")).name


def test_a_regime_changes_only_residual_rows_and_routers(files: dict[str, Path]) -> None:
    local, real = _tensors(files["local"]), _tensors(files["realistic"])
    width = sr.REGIMES["realistic"].channel_for(PRESET.hidden)
    h = PRESET.hidden
    changed = set()
    for name, t in local.items():
        a, b = np.asarray(t.data), np.asarray(real[name].data)
        if a.tobytes() != b.tobytes():
            changed.add(name.split(".", 2)[-1])
        if name.endswith(("attn_output.weight", "ffn_down_exps.weight")):
            w = gguf.quants.dequantize(b, gguf.GGMLQuantizationType.Q4_0)
            w = w.reshape(-1, h, w.shape[-1])
            assert not np.any(w[:, h - width:, :]), name  # the channel: nobody writes there
            assert np.any(w[:, : h - width, :]), name
    assert changed == {"attn_output.weight", "ffn_down_exps.weight", "ffn_gate_inp.weight"}


def test_uniform_routing_is_a_function_of_the_token(files: dict[str, Path]) -> None:
    """The oracle: top-k of (router channel columns) @ (embedding channel * ffn_norm)."""
    routing, ids = _routing(files["uniform"])
    t = _tensors(files["uniform"])
    h, k = PRESET.hidden, PRESET.top_k
    width = sr.REGIMES["uniform"].channel_for(h)
    emb = gguf.quants.dequantize(np.asarray(t["token_embd.weight"].data),
                                 gguf.GGMLQuantizationType.Q4_0).reshape(PRESET.vocab, h)
    for layer in range(PRESET.n_layers):
        router = np.asarray(t[f"blk.{layer}.ffn_gate_inp.weight"].data).reshape(-1, h)
        assert not np.any(router[:, : h - width])  # full = 0: the channel only
        norm = np.asarray(t[f"blk.{layer}.ffn_norm.weight"].data)
        x = emb[ids][:, h - width:] * norm[h - width:]
        logits = x.astype(np.float64) @ router[:, h - width:].T.astype(np.float64)
        want = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        margin = np.sort(logits, axis=1)[:, -k] - np.sort(logits, axis=1)[:, -k - 1]
        clear = margin > 1e-4 * np.abs(logits).max()  # leave near-ties to float rounding
        got = routing[:, layer, :]
        for i in np.nonzero(clear)[0]:
            assert set(got[i].tolist()) == set(want[i].tolist()), (layer, i)
        assert clear.mean() > 0.9


def test_regimes_order_as_documented(files: dict[str, Path]) -> None:
    st = {}
    for name, path in files.items():
        r, _ = _routing(path)
        st[name] = rs.summarize([r], PRESET.n_experts)
    d = {n: s["distinct32"]["mean"] for n, s in st.items()}
    lru25 = {n: s["lru25"]["mean"] for n, s in st.items()}
    lru50 = {n: s["lru50"]["mean"] for n, s in st.items()}
    assert d["uniform"] > d["realistic"] > d["local"], d
    assert lru25["local"] > lru25["realistic"] > lru25["uniform"], lru25
    assert lru50["local"] > lru50["realistic"] > lru50["uniform"], lru50
    # Uniform: about what independent choices give (k/E of a quarter cache is 25 %), the
    # text's repeated characters adding a little.
    assert 0.2 < lru25["uniform"] < 0.4, lru25
    assert d["uniform"] > 0.85 * st["uniform"]["uniform_distinct32"]


def test_lru_and_reuse_helpers() -> None:
    assert rs.lru_hits([1, 2, 1, 3, 2, 4, 1], 2) == pytest.approx(1 / 7)
    assert rs.lru_hits([1, 2, 1, 3, 2, 4, 1], 3) == pytest.approx(2 / 7)
    r = np.array([[[0, 1]], [[1, 2]], [[3, 4]], [[3, 4]]], dtype=np.int32)
    assert rs.previous_token_reuse(r, 0) == pytest.approx((0.5 + 0 + 1) / 3)
    assert rs.distinct_per_window(r, 0, window=2) == pytest.approx((3 + 2) / 2)
    assert rs.uniform_distinct(128, 8) == pytest.approx(128 * (1 - (1 - 1 / 16) ** 32))


def test_gap_predictors_on_a_known_trace() -> None:
    """gap_predictors against a hand-simulated LRU of 2 slots (one layer, top-2 of 6): at
    each token boundary the candidates are each predictor's uncached experts, scored
    against the next token's choices and its misses."""
    r = np.array([[[0, 1]], [[1, 2]], [[0, 3]], [[0, 1]]], dtype=np.int32)
    g = rs.gap_predictors(r, n_experts=6, capacity=2, reads=4)
    assert g["misses"]["per_token"] == pytest.approx(4 / 3)  # {2}, {0, 3}, {1}
    assert g["previous"]["candidates_per_token"] == 0.0  # always still cached here
    assert np.isnan(g["previous"]["accuracy"]) and g["previous"]["coverage"] == 0.0
    assert g["previous4"]["candidates_per_token"] == pytest.approx(3 / 3)  # {}, {0}, {1, 2}
    assert g["previous4"]["accuracy"] == pytest.approx(2 / 3)
    assert g["previous4"]["coverage"] == pytest.approx(2 / 4)
    assert g["popular"]["candidates_per_token"] == pytest.approx(4.0)
    assert g["popular"]["accuracy"] == pytest.approx(4 / 12)
    assert g["popular"]["coverage"] == pytest.approx(1.0)
