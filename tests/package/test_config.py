"""Typed settings: defaults, coercion, validation, unknown fields, updates."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from colibri.errors import ConfigError
from colibri.sampling import Sampling
from colibri.settings.config import (
    DEFAULT_CONTEXT_CAP,
    MAX_RAM_BUDGET,
    MAX_SPIN_US,
    MAX_THREADS,
    ActivationPrecision,
    CacheConfig,
    CachePolicy,
    EngineConfig,
    IOConfig,
    KvCacheType,
    ThreadConfig,
    WaitPolicy,
    default_history_dir,
    format_bytes,
    parse_bytes,
)


def test_defaults() -> None:
    t = ThreadConfig()
    assert (t.n, t.wait_policy, t.spin_us) == (None, WaitPolicy.AUTO, 100)
    e = EngineConfig()
    assert e.threads == ThreadConfig()
    assert e.context_length is None
    assert e.ram_budget is None
    assert e.io == IOConfig() and e.cache == CacheConfig()
    io = IOConfig()
    assert (io.workers, io.direct, io.prefetch, io.checksums) == (2, True, True, "first")
    c = CacheConfig()
    assert (c.policy, c.pin_fraction, c.history, c.history_path, c.preload) == (
        CachePolicy.LFRU, 0.5, True, None, False)


def test_strings_are_coerced_to_enums() -> None:
    for text, member in [("spin", WaitPolicy.SPIN), ("PASSIVE", WaitPolicy.PASSIVE),
                         (" hybrid ", WaitPolicy.HYBRID), ("Auto", WaitPolicy.AUTO)]:
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
        ({"wait_policy": "busy"}, "ThreadConfig.wait_policy",
         "'spin', 'passive', 'hybrid', 'auto'"),
        ({"wait_policy": 0}, "ThreadConfig.wait_policy", "'spin', 'passive', 'hybrid', 'auto'"),
        ({"wait_policy": None}, "ThreadConfig.wait_policy", "'auto'"),
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


@pytest.mark.parametrize("value", [0, -1, 1.5, "512", True])
def test_bad_prefill_chunk(value: object) -> None:
    with pytest.raises(ConfigError, match=r"EngineConfig\.prefill_chunk.*one batch"):
        EngineConfig(prefill_chunk=value)  # type: ignore[arg-type]
    assert EngineConfig().prefill_chunk == 512
    assert EngineConfig(prefill_chunk=None).prefill_chunk is None


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
                           "context_length": 2048, "activation_precision": "auto",
                           "ram_budget": None, "io": IOConfig().to_dict(),
                           "cache": CacheConfig().to_dict(), "prefill_chunk": 512,
                           "kv_cache_type": "auto", "prompt_cache": 0,
                           "spec": {"drafter": "off", "max_draft": 8, "ngram_sizes": [3, 2, 1]},
                           "device": "cpu", "gpu": {"adapter": None, "memory_budget": None},
                           "cluster": None}
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
    assert t.wait_policy is WaitPolicy.AUTO  # the original is unchanged
    with pytest.raises(ConfigError, match=r"ThreadConfig\.spin_us"):
        t.replace(spin_us=-5)
    e = EngineConfig().replace(threads={"n": 3}, context_length=512)
    assert e.threads.n == 3 and e.context_length == 512
    # dataclasses.replace goes through the same validation.
    with pytest.raises(ConfigError):
        dataclasses.replace(e, context_length=0)


def test_team_size() -> None:
    from colibri.hardware import performance_cores

    assert ThreadConfig(n=3).team_size() == 3
    assert ThreadConfig().team_size() == performance_cores()


def test_resolve_context_length() -> None:
    assert EngineConfig().resolve_context_length(131072) == DEFAULT_CONTEXT_CAP
    assert EngineConfig().resolve_context_length(2048) == 2048
    assert EngineConfig(context_length=8192).resolve_context_length(131072) == 8192
    with pytest.raises(ConfigError, match=r"context_length: 9000 exceeds .* 4096"):
        EngineConfig(context_length=9000).resolve_context_length(4096)


def test_repr_reads_like_a_spec() -> None:
    c = EngineConfig(threads=ThreadConfig(n=2, wait_policy="spin"), ram_budget="6GiB")
    r = repr(c)
    assert r == "EngineConfig(threads=ThreadConfig(n=2, wait_policy='spin'), ram_budget='6GiB')"
    assert eval(r) == c  # only what differs from the defaults, and valid Python
    assert repr(EngineConfig()) == "EngineConfig()"
    odd = EngineConfig(ram_budget=1_000_001, io=IOConfig(workers=4, direct=False),
                       cache=CacheConfig(policy="pinned", history_path="/tmp/h.json"))
    assert eval(repr(odd)) == odd and "1000001" in repr(odd)


def test_activation_precision() -> None:
    assert EngineConfig().activation_precision is ActivationPrecision.AUTO
    assert EngineConfig(activation_precision="float32").activation_precision is (
        ActivationPrecision.FLOAT32
    )
    with pytest.raises(ConfigError, match=r"activation_precision.*'auto', 'int8', 'float32'"):
        EngineConfig(activation_precision="fp16")
    # "auto": float32 up to 1 GiB of weights, int8 above; an explicit choice stays.
    auto = EngineConfig()
    assert auto.resolve_activation_precision(1 << 30) is ActivationPrecision.FLOAT32
    assert auto.resolve_activation_precision((1 << 30) + 1) is ActivationPrecision.INT8
    for explicit in ("int8", "float32"):
        e = EngineConfig(activation_precision=explicit)
        assert e.resolve_activation_precision(1) is e.resolve_activation_precision(1 << 40)


# --- the streaming tier: ram_budget, io, cache ----------------------------------------------

GiB, MiB = 1 << 30, 1 << 20


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("6GiB", 6 * GiB),
        ("512MiB", 512 * MiB),
        ("1.5GB", 1_500_000_000),
        ("800M", 800 * MiB),  # a bare letter is binary, as in dd and head -c
        ("800m", 800 * MiB),
        ("6gib", 6 * GiB),
        (" 6 GiB ", 6 * GiB),
        ("2Gi", 2 * GiB),
        ("1.5GiB", 3 * GiB // 2),
        ("10kB", 10_000),
        ("10KB", 10_000),
        ("10K", 10_240),
        ("4096", 4096),
        ("4096B", 4096),
        (".5K", 512),
        ("1T", 1 << 40),
        ("1TB", 10**12),
        ("0.0000001K", 0),  # rounded down to whole bytes
        (12345, 12345),
    ],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "six GiB", "-1", "-1GiB", "1e9", "5i", "5 iB",
                                  "1.2.3G", "1GiBs", "1 XB", "0x10", "1,000"])
def test_parse_bytes_rejects_garbage(text: str) -> None:
    with pytest.raises(ConfigError, match="not a size.*6GiB"):
        parse_bytes(text)


def test_parse_bytes_rejects_non_sizes() -> None:
    for value in (True, 1.5, None, [1]):
        with pytest.raises(ConfigError):
            parse_bytes(value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="negative"):
        parse_bytes(-1)


@pytest.mark.parametrize(
    ("n", "nearest", "up", "down"),
    [
        (0, "0 B", "0 B", "0 B"),
        (1023, "1023 B", "1023 B", "1023 B"),
        (1024, "1.0 KiB", "1.0 KiB", "1.0 KiB"),
        (1536, "1.5 KiB", "1.5 KiB", "1.5 KiB"),
        (512 * MiB, "512 MiB", "512 MiB", "512 MiB"),
        (3 * GiB + 563 * MiB, "3.5 GiB", "3.6 GiB", "3.5 GiB"),  # 3.5498 GiB
        (int(3.1 * GiB), "3.1 GiB", "3.1 GiB", "3.0 GiB"),  # a byte short of 3.1 GiB
        (3 * GiB + 1, "3.0 GiB", "3.1 GiB", "3.0 GiB"),
        (120 * GiB, "120 GiB", "120 GiB", "120 GiB"),
        (int(99.97 * MiB), "100 MiB", "100 MiB", "99.9 MiB"),
        (GiB - 1, "1.0 GiB", "1.0 GiB", "1023 MiB"),
        (-2 * MiB, "-2.0 MiB", "-2.0 MiB", "-2.0 MiB"),
    ],
)
def test_format_bytes(n: int, nearest: str, up: str, down: str) -> None:
    assert format_bytes(n) == nearest
    assert format_bytes(n, rounding="up") == up
    assert format_bytes(n, rounding="down") == down


def test_ram_budget_is_normalized_to_bytes() -> None:
    assert EngineConfig(ram_budget="6GiB").ram_budget == 6 * GiB
    assert EngineConfig(ram_budget="1.5GB").ram_budget == 1_500_000_000
    assert EngineConfig(ram_budget=123_456_789).ram_budget == 123_456_789
    assert EngineConfig(ram_budget=MAX_RAM_BUDGET).ram_budget == 1 << 50
    e = EngineConfig.from_dict({"ram_budget": "800M"})
    assert e.ram_budget == 800 * MiB
    assert e.to_dict()["ram_budget"] == 800 * MiB
    assert EngineConfig.from_dict(e.to_dict()) == e
    assert EngineConfig().replace(ram_budget="2GiB").ram_budget == 2 * GiB
    assert EngineConfig(ram_budget="2GiB") == EngineConfig(ram_budget=2 * GiB)


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        (0, "more than 0"),
        ("0GiB", "more than 0"),
        ("0.0000001K", "more than 0"),
        (-5, "negative"),
        ("-5G", "not a size"),
        ("lots", "not a size"),
        ("6 gigabytes", "not a size"),
        ((1 << 50) + 1, "largest allowed, 1.0 PiB"),
        ("2PiB", "'2PiB' (2.0 PiB) is more than the largest allowed"),
        (1.5e9, "expected bytes"),
        (True, "expected bytes"),
        ([6], "expected bytes"),
    ],
)
def test_bad_ram_budget(value: object, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        EngineConfig(ram_budget=value)  # type: ignore[arg-type]
    msg = str(info.value)
    assert msg.startswith("EngineConfig.ram_budget: "), msg
    assert hint in msg, msg


def test_cache_and_io_configs() -> None:
    c = CacheConfig(policy="PINNED", pin_fraction=0, history=False,
                    history_path=Path("/tmp/r.json"), preload=True)
    assert c.policy is CachePolicy.PINNED and c.pin_fraction == 0.0
    assert isinstance(c.pin_fraction, float)
    assert c.history_path == "/tmp/r.json" and c.preload and not c.history
    assert CachePolicy.LRU == "lru" and CacheConfig(policy=CachePolicy.LRU).policy == "lru"
    assert CacheConfig.from_dict(c.to_dict()) == c
    assert c.to_dict() == {"policy": "pinned", "pin_fraction": 0.0, "history": False,
                           "history_path": "/tmp/r.json", "preload": True}
    io = IOConfig(workers=0, direct=False, prefetch=False, checksums="ALWAYS")  # type: ignore[arg-type]
    assert (io.workers, io.direct, io.prefetch, io.checksums) == (0, False, False, "always")
    assert IOConfig(workers=64).workers == 64
    assert IOConfig.from_dict(io.to_dict()) == io
    assert io.to_dict() == {"workers": 0, "direct": False, "prefetch": False,
                            "checksums": "always", "first_layer_guess": True,
                            "max_in_flight": 0, "prefetch_min_accuracy": 0.55}
    assert hash(io) == hash(IOConfig(workers=0, direct=False, prefetch=False,
                                     checksums="always"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        io.workers = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("cls", "kwargs", "field", "hint"),
    [
        (IOConfig, {"workers": -1}, "IOConfig.workers", "0..64 threads"),
        (IOConfig, {"workers": 65}, "IOConfig.workers", "0..64"),
        (IOConfig, {"workers": "4"}, "IOConfig.workers", "integer"),
        (IOConfig, {"direct": 1}, "IOConfig.direct", "True or False"),
        (IOConfig, {"direct": "no"}, "IOConfig.direct", "True or False"),
        (IOConfig, {"prefetch": None}, "IOConfig.prefetch", "True or False"),
        (IOConfig, {"checksums": "sometimes"}, "IOConfig.checksums",
         "'first', 'always', 'off'"),
        (IOConfig, {"checksums": False}, "IOConfig.checksums", "'first', 'always', 'off'"),
        (IOConfig, {"prefetch_min_accuracy": 1.5}, "IOConfig.prefetch_min_accuracy", "0..1"),
        (IOConfig, {"prefetch_min_accuracy": "0.5"}, "IOConfig.prefetch_min_accuracy",
         "a number"),
        (CacheConfig, {"policy": "lfu"}, "CacheConfig.policy", "'lru', 'lfru', 'pinned'"),
        (CacheConfig, {"pin_fraction": 0.95}, "CacheConfig.pin_fraction", "0..0.9"),
        (CacheConfig, {"pin_fraction": -0.1}, "CacheConfig.pin_fraction", "0..0.9"),
        (CacheConfig, {"pin_fraction": float("nan")}, "CacheConfig.pin_fraction", "0..0.9"),
        (CacheConfig, {"pin_fraction": "0.5"}, "CacheConfig.pin_fraction", "a number"),
        (CacheConfig, {"pin_fraction": True}, "CacheConfig.pin_fraction", "a number"),
        (CacheConfig, {"history": "yes"}, "CacheConfig.history", "True or False"),
        (CacheConfig, {"history_path": ""}, "CacheConfig.history_path", "non-empty path"),
        (CacheConfig, {"history_path": 3}, "CacheConfig.history_path", "non-empty path"),
        (CacheConfig, {"preload": 0}, "CacheConfig.preload", "True or False"),
    ],
)
def test_bad_cache_and_io_values(cls: type, kwargs: dict[str, Any], field: str,
                                 hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        cls(**kwargs)
    msg = str(info.value)
    assert msg.startswith(field + ":"), msg
    assert hint in msg, msg


def test_nested_from_dict_and_replace() -> None:
    d = {"threads": {"wait_policy": "auto"}, "ram_budget": "8GiB",
         "io": {"workers": 8, "checksums": "off"},
         "cache": {"policy": "pinned", "pin_fraction": 0.25}}
    e = EngineConfig.from_dict(d)
    assert e.io == IOConfig(workers=8, checksums="off")
    assert e.cache == CacheConfig(policy="pinned", pin_fraction=0.25)
    assert e.ram_budget == 8 * GiB and e.threads.wait_policy is WaitPolicy.AUTO
    assert EngineConfig.from_dict(e.to_dict()) == e
    # Objects are accepted where mappings are, and replace takes either.
    assert EngineConfig(io=IOConfig(workers=2)).io.workers == 2
    e2 = e.replace(io={"prefetch": False}, cache=CacheConfig(policy="lru"))
    assert e2.io == IOConfig(prefetch=False)  # a mapping replaces the whole sub-config
    assert e2.cache.policy is CachePolicy.LRU and e2.ram_budget == e.ram_budget
    assert e.io.workers == 8  # unchanged
    with pytest.raises(ConfigError, match=r"IOConfig: unknown setting 'threads'.*allowed: "
                                          r"workers, direct, prefetch, checksums"):
        EngineConfig.from_dict({"io": {"threads": 2}})
    with pytest.raises(ConfigError, match=r"CacheConfig: unknown setting 'size'"):
        EngineConfig.from_dict({"cache": {"size": "4GiB"}})
    with pytest.raises(ConfigError, match=r"IOConfig\.workers"):
        EngineConfig.from_dict({"io": {"workers": 100}})
    with pytest.raises(ConfigError, match=r"EngineConfig\.io: expected a IOConfig"):
        EngineConfig(io=4)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"EngineConfig\.cache: expected a CacheConfig"):
        EngineConfig(cache="lru")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown setting 'budget'"):
        EngineConfig().replace(budget="1GiB")
    with pytest.raises(ConfigError, match=r"CacheConfig\.pin_fraction"):
        CacheConfig().replace(pin_fraction=1.0)


def test_default_history_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_history_dir() == tmp_path / "colibri" / "routing"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_history_dir() == Path.home() / ".cache" / "colibri" / "routing"


def test_kv_cache_type() -> None:
    assert EngineConfig().kv_cache_type is KvCacheType.AUTO
    for name in ("f32", "f16", "bf16", "q8_0"):
        e = EngineConfig(kv_cache_type=name)
        assert e.kv_cache_type.value == name
        assert e.resolve_kv_cache_type(float_weights=False) == name  # explicit: as given
        assert EngineConfig.from_dict(e.to_dict()) == e
    assert EngineConfig(kv_cache_type=" F16 ").kv_cache_type is KvCacheType.F16
    # auto: f32 on the exact path (float weights, or float32 activations), else f16.
    auto = EngineConfig()
    assert auto.resolve_kv_cache_type(float_weights=True) == "f32"
    assert auto.resolve_kv_cache_type(float_weights=False) == "f16"
    exact = EngineConfig(activation_precision="float32")
    assert exact.resolve_kv_cache_type(float_weights=False) == "f32"
    for bad in ("q4_0", "fp16", 16, None, True):
        with pytest.raises(ConfigError, match="EngineConfig.kv_cache_type"):
            EngineConfig(kv_cache_type=bad)  # type: ignore[arg-type]


# --- misspelled settings: ConfigError with the closest name, for every settings class ----


@pytest.mark.parametrize(
    ("cls", "wrong", "right"),
    [
        (EngineConfig, "ram_budjet", "ram_budget"),
        (EngineConfig, "context_len", "context_length"),
        (ThreadConfig, "wait_polcy", "wait_policy"),
        (IOConfig, "worker", "workers"),
        (CacheConfig, "pin_fractoin", "pin_fraction"),
        (Sampling, "temprature", "temperature"),
        (Sampling, "top_pp", "top_p"),
    ],
)
def test_misspelled_setting_names_the_closest(cls: type, wrong: str, right: str) -> None:
    pattern = rf"{cls.__name__}: unknown setting '{wrong}' \(did you mean '{right}'\?\)"
    with pytest.raises(ConfigError, match=pattern):
        cls(**{wrong: 1})
    with pytest.raises(ConfigError, match=pattern):
        cls.from_dict({wrong: 1})  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=pattern):
        cls().replace(**{wrong: 1})  # type: ignore[attr-defined]
    # No near name: no suggestion, still the list of valid ones.
    with pytest.raises(ConfigError, match=r"unknown setting 'zzz'; allowed: ") as info:
        cls(zzz=1)
    assert "did you mean" not in str(info.value)


def test_positional_and_duplicate_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"IOConfig: takes at most 6 settings by position"):
        IOConfig(2, True, True, "first", True, 0, 5)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"IOConfig: setting 'workers' given twice"):
        IOConfig(2, workers=3)  # type: ignore[misc]
    assert IOConfig(3, False).workers == 3  # positional use still works


def test_prompt_cache_size() -> None:
    assert EngineConfig().prompt_cache == 0
    assert EngineConfig(prompt_cache="1GiB").prompt_cache == 1 << 30
    assert EngineConfig(prompt_cache=4096).prompt_cache == 4096
    with pytest.raises(ConfigError, match=r"EngineConfig.prompt_cache: a size cannot be negative"):
        EngineConfig(prompt_cache=-1)
    with pytest.raises(ConfigError, match=r"EngineConfig.prompt_cache: expected bytes"):
        EngineConfig(prompt_cache=None)  # type: ignore[arg-type]
    assert eval(repr(EngineConfig(prompt_cache="256MiB"))) == EngineConfig(prompt_cache=256 << 20)
