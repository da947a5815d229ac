"""Session behaviour and its bad inputs: every mistake raises a specific colibri error and
leaves the session as it was."""

from __future__ import annotations

import numpy as np
import pytest

import colibri
from colibri.errors import (
    ColibriError,
    ConfigError,
    ContextOverflowError,
    InvalidRequestError,
    TokenOutOfRangeError,
)
from colibri.settings.config import EngineConfig, ThreadConfig
from support.modelfactory import TinyModel


@pytest.fixture(scope="module")
def model(tiny_models: dict[str, TinyModel]) -> colibri.Model:
    return colibri.Model.load(
        tiny_models["qwen3_moe"].hf_dir,
        engine=EngineConfig(threads=ThreadConfig(n=2), context_length=16),
    )


def test_forward_shapes_and_token_count(model: colibri.Model) -> None:
    s = model.session()
    last = s.forward([1, 2, 3])
    assert last.shape == (model.config.vocab_size,) and last.dtype == np.float32
    assert s.n_tokens == 3
    every = s.forward(np.array([4, 5], dtype=np.int64), all_logits=True)
    assert every.shape == (2, model.config.vocab_size)
    assert s.n_tokens == 5
    s.reset()
    assert s.n_tokens == 0
    np.testing.assert_array_equal(s.forward([1, 2, 3]), last)


def test_rollback_then_replay_gives_the_same_logits(model: colibri.Model) -> None:
    s = model.session()
    s.forward([1, 2, 3, 4])
    expected = s.forward([5])
    s.rollback(2)
    assert s.n_tokens == 3
    s.forward([4])
    np.testing.assert_array_equal(s.forward([5]), expected)
    with pytest.raises(InvalidRequestError, match="roll back"):
        s.rollback(99)


@pytest.mark.parametrize("bad", [-1, 256, 10**12])
def test_token_out_of_range(model: colibri.Model, bad: int) -> None:
    s = model.session()
    s.forward([1, 2])
    with pytest.raises(TokenOutOfRangeError, match=r"outside the vocabulary \[0, 256\)"):
        s.forward([3, bad])
    assert s.n_tokens == 2  # nothing was appended


def test_context_overflow_says_the_sizes(model: colibri.Model) -> None:
    s = model.session()
    s.forward(list(range(10)))
    with pytest.raises(ContextOverflowError, match="10 tokens and 7 more.*16"):
        s.forward(list(range(7)))
    assert s.n_tokens == 10
    s.forward(list(range(6)))  # exactly full is fine
    assert s.n_tokens == 16


@pytest.mark.parametrize(
    "ids", [[], [[1, 2]], [1.5, 2.0], "abc"], ids=["empty", "2-D", "floats", "string"]
)
def test_malformed_ids(model: colibri.Model, ids: object) -> None:
    with pytest.raises(InvalidRequestError):
        model.session().forward(ids)  # type: ignore[arg-type]


def test_closed_model_refuses_new_sessions(tiny_models: dict[str, TinyModel]) -> None:
    with colibri.Model.load(tiny_models["llama"].hf_dir) as m:
        m.session().forward([1])
    with pytest.raises(InvalidRequestError, match="closed"):
        m.session()


def test_context_longer_than_the_model_allows(tiny_models: dict[str, TinyModel]) -> None:
    with pytest.raises(ConfigError, match="context_length"):
        colibri.Model.load(tiny_models["llama"].hf_dir, engine=EngineConfig(context_length=10**6))


def test_errors_share_a_base_class() -> None:
    for cls in (ContextOverflowError, TokenOutOfRangeError, InvalidRequestError, ConfigError):
        assert issubclass(cls, ColibriError) and issubclass(cls, ValueError)


def test_last_routing_records_the_router_choice(tiny_models: dict[str, TinyModel]) -> None:
    m = colibri.Model.load(tiny_models["mixtral"].hf_dir)
    cfg = m.config
    s = m.session()
    s.forward([1, 2, 3, 4, 5])
    r = s.last_routing()
    assert r.shape == (5, cfg.n_layers, cfg.n_experts_per_tok) and r.dtype == np.int32
    assert ((r >= 0) & (r < cfg.n_experts)).all()
    for row in r.reshape(-1, cfg.n_experts_per_tok):  # top-k picks distinct experts
        assert len(set(row.tolist())) == cfg.n_experts_per_tok
    # Batched and single-token forwards route alike.
    s2 = m.session()
    singles = []
    for t in [1, 2, 3, 4, 5]:
        s2.forward([t])
        singles.append(s2.last_routing()[0])
    np.testing.assert_array_equal(np.stack(singles), r)
    dense = colibri.Model.load(tiny_models["llama"].hf_dir).session()
    dense.forward([1, 2])
    assert dense.last_routing().size == 0
