"""The GQA unit with gpt-oss's attention extras, end to end through the core engine: a tiny
two-layer model (4 query / 2 KV heads) built from a ModelConfig and numpy weights, with a
learned sink per head (``attention_sinks``), a sliding window of 3 positions in layer 0
only (``sliding_window`` / ``sliding_layers``) and a bias after the output projection
(``attention_out_bias``), q/k/v biases too.

* Prefill logits match a numpy forward of the same model (RMSNorm, rotate-half RoPE, the
  windowed softmax with the sink column appended then dropped, SwiGLU FFN).
* Decode token by token, any prefill chunking and several sessions batched give the
  same logits as one prefill, at positions well past the window; the window and the sinks
  change the logits (the comparison is not vacuous).
* Bad specs: sinks of the wrong shape, sliding_layers of the wrong length, a window larger
  than the model's context, the extras on MLA: clear colibri.errors exceptions.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from colibri import _core
from colibri.engine.core_spec import model_spec, tensor_specs, thread_settings
from colibri.engine.rope import rope_table
from colibri.errors import ColibriError, ModelFormatError, UnsupportedError
from colibri.settings.config import ThreadConfig
from colibri.sources import Manifest, ModelConfig, TensorInfo
from colibri.sources.manifest import Extent
from colibri.sources.validate import check_config, expected_shapes

CONTEXT = 64
WINDOW = 3

CFG = ModelConfig(
    arch="llama", vocab_size=48, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2,
    head_dim=8, intermediate_size=24, rms_norm_eps=1e-5, rope_theta=10000.0,
    max_position_embeddings=128, tie_word_embeddings=False, attention_bias=True,
    attention_sinks=True, sliding_window=WINDOW, sliding_layers=(True, False),
    attention_out_bias=True,
)  # fmt: skip


def _weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("norm"):
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("attn_sinks"):
            w = 2.0 * rng.standard_normal(shape)  # N(0, 2): the sinks matter
        else:
            w = (0.3 if len(shape) == 2 else 0.5) * rng.standard_normal(shape)
        out[name] = w.astype(np.float32)
    return out


def _manifest(tmp: Path, cfg: ModelConfig, w: dict[str, np.ndarray]) -> Manifest:
    path = tmp / "weights.bin"
    tensors, offset = {}, 0
    with path.open("wb") as f:
        for name, a in w.items():
            f.write(a.tobytes())
            tensors[name] = TensorInfo(name, "F32", a.shape, (Extent(0, offset, a.nbytes),))
            offset += a.nbytes
    return Manifest(source="hf", path=tmp, files=(path,), config=cfg, tensors=tensors)


def _engine(m: Manifest) -> _core.Engine:
    return _core.Engine(model_spec(m, CONTEXT), tensor_specs(m, False), [str(f) for f in m.files],
                        thread_settings(ThreadConfig(n=2)))  # fmt: skip


# The numpy forward -----------------------------------------------------------------------

def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:  # x: [n, heads, hd]
    ang = np.arange(x.shape[0])[:, None] * inv_freq[None, :]  # [n, hd/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    half = inv_freq.size
    a, b = x[..., :half], x[..., half:2 * half]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin, x[..., 2 * half:]], -1)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: int,
               sinks: np.ndarray | None) -> np.ndarray:
    n, nh, hd = q.shape
    group = nh // k.shape[1]
    out = np.zeros_like(q)
    for t in range(n):
        j0 = max(0, t + 1 - window) if window else 0
        for h in range(nh):
            s = k[j0:t + 1, h // group] @ q[t, h] / np.sqrt(hd)
            if sinks is not None:
                s = np.append(s, sinks[h])
            p = np.exp(s - s.max())
            p = p / p.sum()
            if sinks is not None:
                p = p[:-1]
            out[t, h] = p @ v[j0:t + 1, h // group]
    return out


def numpy_forward(cfg: ModelConfig, w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    inv_freq = rope_table(cfg.head_dim, cfg.rope_theta, None,
                          cfg.max_position_embeddings).inv_freq.astype(np.float64)
    nh, nkv, hd, eps = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    x = w64["token_embd"][ids]
    n = len(ids)
    for i in range(cfg.n_layers):
        b = f"blk.{i}."
        h = _rms(x, w64[b + "attn_norm"], eps)
        q = (h @ w64[b + "attn_q"].T + w64[b + "attn_q.bias"]).reshape(n, nh, hd)
        k = (h @ w64[b + "attn_k"].T + w64[b + "attn_k.bias"]).reshape(n, nkv, hd)
        v = (h @ w64[b + "attn_v"].T + w64[b + "attn_v.bias"]).reshape(n, nkv, hd)
        window = cfg.sliding_window if cfg.sliding_layers and cfg.sliding_layers[i] else 0
        sinks = w64[b + "attn_sinks"] if cfg.attention_sinks else None
        a = _attention(_rope(q, inv_freq), _rope(k, inv_freq), v, window, sinks)
        o = a.reshape(n, nh * hd) @ w64[b + "attn_output"].T
        if cfg.attention_out_bias:
            o = o + w64[b + "attn_output.bias"]
        x = x + o
        h = _rms(x, w64[b + "ffn_norm"], eps)
        g, u = h @ w64[b + "ffn_gate"].T, h @ w64[b + "ffn_up"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w64[b + "ffn_down"].T
    return _rms(x, w64["output_norm"], eps) @ w64["output"].T


# Tests -----------------------------------------------------------------------------------

IDS = [5, 17, 3, 40, 22, 9, 31, 1, 12, 44]  # 10 tokens, window 3


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, np.ndarray], _core.Engine]:
    check_config(CFG, "tiny gpt-oss-style config")
    w = _weights(CFG)
    return w, _engine(_manifest(tmp_path_factory.mktemp("gqa_extras"), CFG, w))


def _prefill(engine: _core.Engine, ids: list[int], chunk: int = 0) -> np.ndarray:
    s = _core.Session(engine, CONTEXT)
    return np.asarray(s.forward(np.array(ids, np.int32), all_logits=True, chunk=chunk))


def test_prefill_matches_numpy(model: tuple[dict[str, np.ndarray], _core.Engine]) -> None:
    w, engine = model
    got = _prefill(engine, IDS)
    ref = numpy_forward(CFG, w, IDS)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-4 * float(np.abs(ref).max()))
    # The extras are live: without the window, the sinks or the output bias the numpy
    # forward moves far more than the tolerance.
    for change in (dict(sliding_window=0, sliding_layers=()), dict(attention_sinks=False),
                   dict(attention_out_bias=False)):
        other = numpy_forward(dataclasses.replace(CFG, **change), w, IDS)  # type: ignore[arg-type]
        assert float(np.abs(other - ref).max()) > 1e-2 * float(np.abs(ref).max()), change


def test_decode_past_the_window_matches_prefill(
        model: tuple[dict[str, np.ndarray], _core.Engine]) -> None:  # fmt: skip
    _, engine = model
    rng = np.random.default_rng(7)
    ids = [int(t) for t in rng.integers(0, CFG.vocab_size, 40)]  # 13 windows long
    full = _prefill(engine, ids)
    np.testing.assert_allclose(full[:10], numpy_forward(CFG, model[0], ids[:10]), rtol=0,
                               atol=2e-4 * float(np.abs(full).max()))
    s = _core.Session(engine, CONTEXT)
    s.forward(np.array(ids[:5], np.int32))
    for t in range(5, 40):  # one token at a time, up to 37 positions past the window
        step = np.asarray(s.forward(np.array([ids[t]], np.int32)))
        np.testing.assert_allclose(step, full[t], rtol=0, atol=1e-5, err_msg=f"position {t}")
    # A fresh prefill in chunks of 7 gives the last logits too.
    np.testing.assert_allclose(_prefill(engine, ids, chunk=7)[-1], full[-1], rtol=0, atol=1e-5)


def test_batched_sessions_match_alone(model: tuple[dict[str, np.ndarray], _core.Engine]) -> None:
    _, engine = model
    a_ids, b_ids = [*IDS, 7, 8, 9], [2, 30, 11, 4, 4, 19]
    a_alone, b_alone = _prefill(engine, a_ids), _prefill(engine, b_ids)
    sa, sb = _core.Session(engine, CONTEXT), _core.Session(engine, CONTEXT)
    sa.forward(np.array(a_ids[:8], np.int32))
    out = _core.forward_batch([sa, sb], [np.array(a_ids[8:], np.int32),
                                         np.array(b_ids, np.int32)], [True, True])  # fmt: skip
    np.testing.assert_allclose(out[0], a_alone[8:], rtol=0, atol=1e-5)
    np.testing.assert_allclose(out[1], b_alone, rtol=0, atol=1e-5)


def test_bad_specs_are_refused(tmp_path: Path) -> None:
    w = _weights(CFG)
    bad_sinks = dict(w)
    bad_sinks["blk.1.attn_sinks"] = np.zeros(3, np.float32)
    with pytest.raises(ColibriError, match="attn_sinks"):
        _engine(_manifest(tmp_path, CFG, bad_sinks))
    with pytest.raises(ModelFormatError, match="sliding_layers has 3 entries for 2 layers"):
        check_config(dataclasses.replace(CFG, sliding_layers=(True, False, True)), "cfg")
    with pytest.raises(ModelFormatError, match="larger than the context length"):
        check_config(dataclasses.replace(CFG, sliding_window=129), "cfg")
    with pytest.raises(ModelFormatError, match="sliding_window"):
        check_config(dataclasses.replace(CFG, sliding_window=-1), "cfg")
    with pytest.raises(ModelFormatError, match="sliding_window is 0"):
        check_config(dataclasses.replace(CFG, sliding_window=0), "cfg")
    with pytest.raises(ModelFormatError, match="needs sliding_layers"):
        check_config(dataclasses.replace(CFG, sliding_layers=()), "cfg")
    with pytest.raises(ModelFormatError, match="attention_sinks"):
        check_config(dataclasses.replace(CFG, attention_sinks=1), "cfg")  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match="GQA attention only"):
        check_config(dataclasses.replace(CFG, attention="mla"), "cfg")
    # The core checks its spec too (a spec built by hand, not through check_config).
    spec = model_spec(_manifest(tmp_path, CFG, w), CONTEXT)
    spec.sliding_layers = [1, 0, 1]
    with pytest.raises(ColibriError, match="sliding_layers must have one entry per layer"):
        _core.Engine(spec, [], [], thread_settings(ThreadConfig(n=1)))
