"""Saved sessions (Session.save / Session.load): a reloaded session continues bit for bit
(the same last logits, the same next-token logits, the same sampler draws), on a dense
model and a MoE; files from another model, a corrupt or truncated file, a newer format,
another activation precision or a context too small are refused clearly."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import colibri as co
from colibri.errors import ContextOverflowError, InvalidRequestError, ModelFormatError
from colibri.generate import session_store
from support.modelfactory import TinyModel, prompt_ids
from support.realmodel import smollm2_gguf


@pytest.fixture(scope="module")
def model() -> co.Model:
    return co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=256))


def test_a_reloaded_session_continues_bit_for_bit(model: co.Model, tmp_path: Path) -> None:
    s = model.session()
    ids = model.encode_prompt(messages=[{"role": "user", "content": "Tell me a story."}])
    s.forward(ids)
    s.generate([], max_tokens=5, sampling=co.Sampling(temperature=0.9, seed=4))
    sampler = co.Sampler(co.Sampling(temperature=0.8, top_k=40, seed=12))
    logits = s.forward([42])  # the session now has last logits
    draws = [sampler(logits) for _ in range(3)]
    path = tmp_path / "chat.session"
    s.save(path, sampler=sampler)
    r = co.Session.load(path, model)
    assert r.token_ids == s.token_ids and r.n_tokens == s.n_tokens
    np.testing.assert_array_equal(r.last_logits(), s.last_logits())
    assert r.sampler is not None and r.sampler.sampling == sampler.sampling
    # The random state went along: the next draws are the saved sampler's next draws.
    assert [r.sampler(logits) for _ in range(4)] == [sampler(logits) for _ in range(4)]
    assert draws  # (the saved state was not the initial one)
    # Next-token logits are bit-identical, and so is a continued generation.
    np.testing.assert_array_equal(r.forward([7042]), s.forward([7042]))
    a = r.generate([], max_tokens=8)
    b = s.generate([], max_tokens=8)
    assert a.token_ids == b.token_ids
    assert model.load_session(path).token_ids[:len(ids)] == ids
    # A session without logits or sampler round-trips too.
    empty = model.session()
    empty.save(tmp_path / "empty.session")
    e = co.Session.load(tmp_path / "empty.session", model)
    assert e.n_tokens == 0 and e.sampler is None


def test_a_moe_session_round_trips(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    m = co.Model.load(tiny_models["qwen3_moe"].gguf["F32"],
                      engine=co.EngineConfig(cache=co.CacheConfig(history=False)))
    s = m.session()
    s.forward(prompt_ids(20))
    s.save(tmp_path / "moe.session")
    r = co.Session.load(tmp_path / "moe.session", m)
    np.testing.assert_array_equal(r.forward([5, 6, 7], all_logits=True),
                                  s.forward([5, 6, 7], all_logits=True))


def test_fork_copies_a_prefix(model: co.Model) -> None:
    s = model.session()
    ids = model.encode_prompt("The capital of France is Paris, and the capital of Italy")
    s.forward(ids)
    f = s.fork(5)
    assert f.token_ids == ids[:5] and f.n_tokens == 5
    fresh = model.session()
    fresh.forward(ids[:5])
    np.testing.assert_array_equal(f.forward(ids[5:]), fresh.forward(ids[5:]))
    whole = s.fork()
    np.testing.assert_array_equal(whole.last_logits(), s.last_logits())


def _rewrite(path: Path, edit: dict[str, object]) -> None:
    """The file with header fields changed and a valid checksum (a well-formed file that
    must still be refused)."""
    data = path.read_bytes()
    (hlen,) = struct.unpack_from("<Q", data, 16)
    header = json.loads(data[24:24 + hlen])
    header.update(edit)
    head = json.dumps(header).encode()
    body = data[:16] + struct.pack("<Q", len(head)) + head + data[24 + hlen:-32]
    path.write_bytes(body + hashlib.sha256(body).digest())


def test_bad_files_are_refused_clearly(model: co.Model, tmp_path: Path,
                                       tiny_models: dict[str, TinyModel]) -> None:
    s = model.session()
    s.forward(model.encode_prompt("Hello there"))
    good = tmp_path / "good.session"
    s.save(good)
    data = good.read_bytes()

    flipped = tmp_path / "flipped.session"
    flipped.write_bytes(data[:-100] + bytes([data[-100] ^ 1]) + data[-99:])
    with pytest.raises(ModelFormatError, match="corrupt or truncated"):
        co.Session.load(flipped, model)
    cut = tmp_path / "cut.session"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match="corrupt or truncated"):
        co.Session.load(cut, model)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelFormatError, match="not a colibri session file"):
        co.Session.load(tmp_path / "notes.txt", model)
    newer = tmp_path / "newer.session"
    shutil.copy(good, newer)
    _rewrite(newer, {"version": 2})
    with pytest.raises(ModelFormatError, match="version 2; this colibri reads version 1"):
        co.Session.load(newer, model)
    with pytest.raises(InvalidRequestError, match="no session file"):
        co.Session.load(tmp_path / "absent.session", model)

    # Another model: different shapes, or the same header with other weights.
    tiny = tiny_models["llama"].gguf["F32"]
    with pytest.raises(InvalidRequestError, match="saved from another model"):
        co.Session.load(good, co.Model.load(tiny))
    t = co.Model.load(tiny).session()
    t.forward([3, 4, 5])
    t.save(tmp_path / "tiny.session")
    other = tmp_path / "other.gguf"
    raw = bytearray(tiny.read_bytes())
    raw[-8] ^= 0x40  # one weight of the last tensor
    other.write_bytes(bytes(raw))
    with pytest.raises(InvalidRequestError, match="saved from another model"):
        co.Session.load(tmp_path / "tiny.session", co.Model.load(other))
    assert co.Session.load(tmp_path / "tiny.session", co.Model.load(tiny)).n_tokens == 3

    # `good` was saved under the default ("auto": float32 for SmolLM2): an int8 model refuses it.
    int8 = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(
        context_length=256, activation_precision="int8"))
    with pytest.raises(InvalidRequestError, match="activation_precision 'float32'"):
        co.Session.load(good, int8)
    small = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=1))
    with pytest.raises(ContextOverflowError, match="raise EngineConfig.context_length"):
        co.Session.load(good, small)
    assert session_store.VERSION == 1
