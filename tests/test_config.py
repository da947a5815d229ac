"""Typed settings: defaults, coercion, validation, unknown fields, updates."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from colibri.config import (
    DEFAULT_CONTEXT_CAP,
    MAX_SPIN_US,
    MAX_THREADS,
    ActivationPrecision,
    EngineConfig,
    ThreadConfig,
    WaitPolicy,
)
from colibri.errors import ConfigError


def test_defaults() -> None:
    t = ThreadConfig()
    assert (t.n, t.wait_policy, t.spin_us) == (None, WaitPolicy.HYBRID, 100)
    e = EngineConfig()
    assert e.threads == ThreadConfig()
    assert e.context_length is None


def test_strings_are_coerced_to_enums() -> None:
    for text, member in [("spin", WaitPolicy.SPIN), ("PASSIVE", WaitPolicy.PASSIVE),
                         (" hybrid ", WaitPolicy.HYBRID)]:
        t = ThreadConfig(wait_policy=text)  # type: ignore[arg-type]
        assert t.wait_policy is member
    assert ThreadConfig(wait_policy=WaitPolicy.SPIN).wait_policy is WaitPolicy.SPIN
    # WaitPolicy is a str enum: it compares equal to its value.
    assert WaitPolicy.SPIN == "spin"


def test_frozen() -> None:
    t = ThreadConfig(n=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.n = 5  # type: ignore[misc]
    assert hash(t) == hash(ThreadConfig(n=4))


@pytest.mark.parametrize(
    ("kwargs", "field", "hint"),
    [
        ({"n": 0}, "ThreadConfig.n", "1..1024"),
        ({"n": MAX_THREADS + 1}, "ThreadConfig.n", "1..1024"),
        ({"n": -3}, "ThreadConfig.n", "1..1024"),
        ({"n": 2.0}, "ThreadConfig.n", "integer"),
        ({"n": "4"}, "ThreadConfig.n", "integer"),
        ({"n": True}, "ThreadConfig.n", "integer"),
        ({"wait_policy": "busy"}, "ThreadConfig.wait_policy", "'spin', 'passive', 'hybrid'"),
        ({"wait_policy": "auto"}, "ThreadConfig.wait_policy", "'spin', 'passive', 'hybrid'"),
        ({"wait_policy": 0}, "ThreadConfig.wait_policy", "'spin', 'passive', 'hybrid'"),
        ({"spin_us": -1}, "ThreadConfig.spin_us", "0..1000000 microseconds"),
        ({"spin_us": MAX_SPIN_US + 1}, "ThreadConfig.spin_us", "0..1000000"),
        ({"spin_us": None}, "ThreadConfig.spin_us", "integer"),
    ],
)
def test_bad_thread_values(kwargs: dict[str, Any], field: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        ThreadConfig(**kwargs)
    msg = str(info.value)
    print(msg)
    assert field in msg
    assert hint in msg
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [0, -1, 1.5, "2048", True])
def test_bad_context_length(value: object) -> None:
    with pytest.raises(ConfigError, match=r"EngineConfig\.context_length"):
        EngineConfig(context_length=value)  # type: ignore[arg-type]


def test_bad_threads_type() -> None:
    with pytest.raises(ConfigError, match=r"EngineConfig\.threads: expected a ThreadConfig"):
        EngineConfig(threads=4)  # type: ignore[arg-type]


def test_unknown_fields_are_named() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting 'thread'.*allowed: threads, "
                                          r"context_length"):
        EngineConfig.from_dict({"thread": {"n": 2}})
    with pytest.raises(ConfigError, match=r"ThreadConfig: unknown setting 'num_threads'.*"
                                          r"allowed: n, wait_policy, spin_us"):
        EngineConfig.from_dict({"threads": {"num_threads": 2}})
    with pytest.raises(ConfigError, match="unknown setting 'wait'"):
        ThreadConfig().replace(wait="spin")
    with pytest.raises(ConfigError, match="unknown setting 'ctx'"):
        EngineConfig().replace(ctx=10)


def test_from_dict_and_round_trip() -> None:
    e = EngineConfig.from_dict({"threads": {"n": 4, "wait_policy": "spin", "spin_us": 0},
                                "context_length": 2048})
    assert e.threads == ThreadConfig(n=4, wait_policy=WaitPolicy.SPIN, spin_us=0)
    assert e.context_length == 2048
    assert e.to_dict() == {"threads": {"n": 4, "wait_policy": "spin", "spin_us": 0},
                           "context_length": 2048, "activation_precision": "int8"}
    assert EngineConfig.from_dict(e.to_dict()) == e
    assert EngineConfig.from_dict({}) == EngineConfig()
    # A ThreadConfig object is accepted where a mapping is.
    assert EngineConfig.from_dict({"threads": ThreadConfig(n=2)}).threads.n == 2
    with pytest.raises(ConfigError, match="expected a mapping"):
        EngineConfig.from_dict([("context_length", 5)])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"ThreadConfig\.n"):
        EngineConfig.from_dict({"threads": {"n": 0}})


def test_replace_validates() -> None:
    t = ThreadConfig(n=2)
    t2 = t.replace(wait_policy="passive")
    assert t2.wait_policy is WaitPolicy.PASSIVE and t2.n == 2
    assert t.wait_policy is WaitPolicy.HYBRID  # the original is unchanged
    with pytest.raises(ConfigError, match=r"ThreadConfig\.spin_us"):
        t.replace(spin_us=-5)
    e = EngineConfig().replace(threads={"n": 3}, context_length=512)
    assert e.threads.n == 3 and e.context_length == 512
    # dataclasses.replace goes through the same validation.
    with pytest.raises(ConfigError):
        dataclasses.replace(e, context_length=0)


def test_team_size() -> None:
    from colibri.plan import performance_cores

    assert ThreadConfig(n=3).team_size() == 3
    assert ThreadConfig().team_size() == performance_cores()


def test_resolve_context_length() -> None:
    assert EngineConfig().resolve_context_length(131072) == DEFAULT_CONTEXT_CAP
    assert EngineConfig().resolve_context_length(2048) == 2048
    assert EngineConfig(context_length=8192).resolve_context_length(131072) == 8192
    with pytest.raises(ConfigError, match=r"context_length: 9000 exceeds .* 4096"):
        EngineConfig(context_length=9000).resolve_context_length(4096)


def test_repr_reads_like_a_spec() -> None:
    r = repr(EngineConfig(threads=ThreadConfig(n=2, wait_policy="spin")))
    assert "ThreadConfig(n=2" in r and "SPIN" in r


def test_activation_precision() -> None:
    assert EngineConfig().activation_precision is ActivationPrecision.INT8
    assert EngineConfig(activation_precision="float32").activation_precision is (
        ActivationPrecision.FLOAT32
    )
    with pytest.raises(ConfigError, match=r"activation_precision.*'int8', 'float32'"):
        EngineConfig(activation_precision="fp16")
