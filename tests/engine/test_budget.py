"""The RAM budget split (colibri.engine.budget): pure arithmetic, checked against numbers worked
out by hand in each test."""

from __future__ import annotations

import pytest

from colibri.engine import budget as budget_module
from colibri.engine.budget import (
    MIN_SAFETY_MARGIN,
    BudgetPlan,
    attention_work_floats,
    default_budget,
    estimate_work_bytes,
    format_bytes,
    kv_bytes,
    kv_row_bytes,
    parse_bytes,
    plan_budget,
    safety_margin,
)
from colibri.errors import ConfigError

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


def test_safety_margin_is_10_percent_or_512_mib() -> None:
    assert MIN_SAFETY_MARGIN == 512 * MiB
    assert safety_margin(32 * GiB) == 32 * GiB // 10  # 3.2 GiB > 512 MiB
    assert safety_margin(4 * GiB) == 512 * MiB  # 10 % would be 409.6 MiB
    assert safety_margin(5 * GiB + 1) == (5 * GiB + 1) // 10  # just past the crossover
    assert default_budget(32 * GiB) == 32 * GiB - 32 * GiB // 10
    assert default_budget(4 * GiB) == 3584 * MiB
    assert default_budget(256 * MiB) == -256 * MiB  # nothing left: plan_budget refuses it


def test_explicit_budget_split() -> None:
    # 12 GiB: dense 3 GiB + KV 512 MiB + work 100 MiB = 3684 MiB resident, leaving
    # 12288 - 3684 = 8604 MiB for slots of 12.5 MiB: 688 slots (8600 MiB), 4 MiB unused.
    p = plan_budget(budget=12 * GiB, dense_bytes=3 * GiB, kv_bytes=512 * MiB,
                    work_bytes=100 * MiB, slot_bytes=12 * MiB + 512 * KiB,
                    total_experts=48 * 128, min_slots=8)
    assert p == BudgetPlan(budget=12 * GiB, dense_bytes=3 * GiB, kv_bytes=512 * MiB,
                           work_bytes=100 * MiB, cache_bytes=8600 * MiB, cache_slots=688,
                           slot_bytes=12 * MiB + 512 * KiB, available=None)
    assert p.resident_bytes == 3684 * MiB
    assert p.unused_bytes == 4 * MiB
    assert p.describe() == ("budget 12.0 GiB: dense 3.0 GiB, KV 512 MiB, work 100 MiB, "
                            "expert cache 8.4 GiB (688 slots of 12.5 MiB)")
    assert p.to_dict()["cache_slots"] == 688


def test_cache_never_exceeds_all_experts() -> None:
    # 24 experts of 1 MiB need 24 MiB; a 1 GiB budget holds them all and leaves the rest.
    p = plan_budget(budget=GiB, dense_bytes=100 * MiB, kv_bytes=10 * MiB, work_bytes=5 * MiB,
                    slot_bytes=MiB, total_experts=24, min_slots=2)
    assert (p.cache_slots, p.cache_bytes) == (24, 24 * MiB)
    assert p.unused_bytes == GiB - 115 * MiB - 24 * MiB


def test_default_budget_from_available_memory() -> None:
    # 16 GiB available: margin 1.6 GiB (1717986918 bytes after rounding down), budget the rest.
    avail = 16 * GiB
    margin = int(avail * 0.1)
    p = plan_budget(budget=None, available=avail, dense_bytes=2 * GiB, kv_bytes=GiB,
                    work_bytes=GiB, slot_bytes=10 * MiB, total_experts=10_000, min_slots=4)
    assert p.budget == avail - margin == 15461882266
    assert p.available == avail
    # 15461882266 - 4 GiB = 11166914970 bytes; // 10485760 = 1064 slots (1064.97).
    assert p.cache_slots == (15461882266 - 4 * GiB) // (10 * MiB) == 1064
    assert p.cache_bytes == 1064 * 10 * MiB


def test_default_budget_probes_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from colibri import hardware as plan

    calls: list[int] = []

    def fake_available(root: str = "/") -> int:
        calls.append(1)
        return 4 * GiB

    monkeypatch.setattr(plan, "available_memory", fake_available)
    p = plan_budget(budget=None, dense_bytes=GiB, kv_bytes=0, work_bytes=0, slot_bytes=MiB,
                    total_experts=100, min_slots=1)
    assert calls == [1]
    assert (p.budget, p.available, p.cache_slots) == (3584 * MiB, 4 * GiB, 100)
    # An explicit budget never probes.
    plan_budget(budget=2 * GiB, dense_bytes=GiB, kv_bytes=0, work_bytes=0, slot_bytes=MiB,
                total_experts=100, min_slots=1)
    assert calls == [1]


def test_dense_model_gets_no_cache() -> None:
    p = plan_budget(budget=GiB, dense_bytes=94 * MiB, kv_bytes=90 * MiB, work_bytes=8 * MiB,
                    slot_bytes=0, total_experts=0, min_slots=2)
    assert (p.cache_slots, p.cache_bytes) == (0, 0)
    # The resident part alone must still fit.
    with pytest.raises(ConfigError, match="cannot hold the resident part: dense weights"):
        plan_budget(budget=100 * MiB, dense_bytes=94 * MiB, kv_bytes=90 * MiB,
                    work_bytes=8 * MiB, slot_bytes=0, total_experts=0, min_slots=0)


def test_exactly_the_minimum_fits() -> None:
    # resident 3 GiB + 8 slots of 16 MiB = 3 GiB + 128 MiB: exactly enough.
    kw = dict(dense_bytes=2 * GiB, kv_bytes=768 * MiB, work_bytes=256 * MiB,
              slot_bytes=16 * MiB, total_experts=1000, min_slots=8)
    p = plan_budget(budget=3 * GiB + 128 * MiB, **kw)
    assert (p.cache_slots, p.unused_bytes) == (8, 0)
    with pytest.raises(ConfigError):
        plan_budget(budget=3 * GiB + 128 * MiB - 1, **kw)


def test_too_small_budget_says_the_minimum_and_what_takes_the_space() -> None:
    # dense 3.1 GiB (3328599654 B) + KV 384 MiB + work 100 MiB + 8 x 12.5 MiB
    # = 3328599654 + 402653184 + 104857600 + 104857600 = 3940968038 bytes = 3.67 GiB.
    with pytest.raises(ConfigError) as info:
        plan_budget(budget=2 * GiB, dense_bytes=int(3.1 * GiB), kv_bytes=384 * MiB,
                    work_bytes=100 * MiB, slot_bytes=12 * MiB + 512 * KiB,
                    total_experts=6144, min_slots=8)
    msg = str(info.value)
    print(msg)
    assert msg == (
        "EngineConfig.ram_budget: 2.0 GiB cannot hold the resident part and the smallest "
        "expert cache: dense weights 3.1 GiB + KV cache 384 MiB + work buffers 100 MiB; "
        "the minimum is 3.7 GiB (the resident part plus room for 8 experts of 12.5 MiB; "
        "3940968038 bytes); raise EngineConfig.ram_budget or lower EngineConfig.context_length"
    )


def test_too_little_available_memory_names_the_margin() -> None:
    # 3 GiB available - 512 MiB margin = 2.5 GiB < 3.7 GiB needed.
    with pytest.raises(ConfigError) as info:
        plan_budget(budget=None, available=3 * GiB, dense_bytes=int(3.1 * GiB),
                    kv_bytes=384 * MiB, work_bytes=100 * MiB, slot_bytes=12 * MiB + 512 * KiB,
                    total_experts=6144, min_slots=8)
    msg = str(info.value)
    for needle in ("the default budget, 2.5 GiB (available memory 3.0 GiB less a safety "
                   "margin of 512 MiB)", "the minimum is 3.7 GiB",
                   "set EngineConfig.ram_budget explicitly"):
        assert needle in msg, msg


def test_min_slots_is_capped_at_the_experts() -> None:
    # 2 experts in the model but min_slots=8: the minimum counts 2.
    p = plan_budget(budget=10 * MiB + 2 * MiB, dense_bytes=10 * MiB, kv_bytes=0,
                    work_bytes=0, slot_bytes=MiB, total_experts=2, min_slots=8)
    assert p.cache_slots == 2
    with pytest.raises(ConfigError, match="room for 1 expert of 1.0 MiB"):
        plan_budget(budget=10 * MiB, dense_bytes=10 * MiB, kv_bytes=0, work_bytes=0,
                    slot_bytes=MiB, total_experts=1, min_slots=8)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"dense_bytes": -1}, ValueError),
        ({"slot_bytes": 0}, ValueError),  # experts but no slot size
        ({"total_experts": 1.5}, ValueError),
        ({"min_slots": True}, ValueError),
        ({"budget": 0}, ConfigError),
        ({"budget": "1GiB"}, ConfigError),  # normalized by EngineConfig, not here
    ],
)
def test_bad_arguments(kwargs: dict[str, object], error: type[Exception]) -> None:
    base: dict[str, object] = dict(budget=GiB, dense_bytes=MiB, kv_bytes=MiB, work_bytes=MiB,
                                   slot_bytes=MiB, total_experts=10, min_slots=1)
    base.update(kwargs)
    with pytest.raises(error):
        plan_budget(**base)  # type: ignore[arg-type]


def test_kv_bytes() -> None:
    # Qwen3-30B-A3B: 48 layers, 4 KV heads x 128, 4096 positions, float32 K and V:
    # 2 * 48 * 512 * 4096 * 4 = 805306368 bytes = 768 MiB.
    assert kv_bytes(48, 4, 128, 4096) == 805_306_368 == 768 * MiB
    # SmolLM2-135M: 30 layers, 3 x 64, 4096: 2 * 30 * 192 * 4096 * 4 = 188743680 (the
    # "188 MB" of csrc/model/kv_cache.hpp).
    assert kv_bytes(30, 3, 64, 4096) == 188_743_680
    # At the KV cache types: f16 and bf16 2 bytes a value, q8_0 34 bytes per 32 values.
    assert kv_bytes(30, 3, 64, 4096, "f16") == 188_743_680 // 2
    assert kv_bytes(30, 3, 64, 4096, "bf16") == 188_743_680 // 2
    assert kv_bytes(30, 3, 64, 4096, "q8_0") == 2 * 30 * (192 // 32 * 34) * 4096 == 50_135_040
    assert kv_row_bytes("q8_0", 64) == 68 and kv_row_bytes("f32", 3) == 12
    with pytest.raises(ValueError):
        kv_bytes(-1, 4, 128, 4096)
    with pytest.raises(ValueError, match="q8_0 blocks"):
        kv_bytes(30, 1, 80, 4096, "q8_0")
    with pytest.raises(ValueError, match="unknown KV type"):
        kv_row_bytes("q4_0", 64)


def test_estimate_work_bytes_qwen3_moe() -> None:
    # Qwen3-30B-A3B-like: vocab 151936, d 2048, 32 heads x 128 (q_dim 4096), 4 KV heads
    # (kv_dim 512), routed expert FFN 768, 128 experts, top-8, context 4096, 8 threads,
    # batch 512. F = 768.
    n, d, q, kv, f = 512, 2048, 4096, 512, 768
    floats = (6 * n * d          # 6291456
              + 2 * n * q        # 4194304
              + 2 * n * kv       # 524288
              + 2 * n * f        # 786432
              + n * 128          # 65536
              + n * 8 * d        # 8388608
              + 2 * 151936       # 303872
              + 500288)          # attention kernels, below
    # Attention: decode partials 33 x 32 heads x (128 + 2) = 137280; per thread two tiles
    # of 64 x 128, 64 query rows x 128, 64 x 64 scores, 5 x 64 states, 2 x 64 x 128
    # values: 8192 * 3 + 4096 + 320 + 16384 = 45376, times 8 threads = 363008.
    assert attention_work_floats(32, 128, 128, 8) == 137280 + 8 * 45376 == 500288
    assert floats == 21_054_784
    scratch = 2 * n * max(d, f, q) * 9 // 8  # 2 * 512 * 4096 * 9 / 8 = 4718592
    assert scratch == 4_718_592
    got = estimate_work_bytes(
        vocab_size=151936, hidden_size=2048, moe_intermediate_size=768, n_heads=32,
        n_kv_heads=4, head_dim=128, n_experts=128, n_experts_per_tok=8,
        context_length=4096, threads=8)
    assert got == floats * 4 + scratch == 88_937_728  # 84.8 MiB
    assert format_bytes(got) == "84.8 MiB"


def test_estimate_work_bytes_dense_decode() -> None:
    # A dense model decoding one token (batch 1): d 576, FFN 1536, vocab 49152, no heads
    # given (q and kv dims default to d, one head), 2 threads.
    # floats = 6*576 + 2*576 + 2*576 + 2*1536 + 0 + 0 + 2*49152 + attention
    #        = 3456 + 1152 + 1152 + 3072 + 98304 + 396560 = 503696
    # attention: 33 x 578 = 19074 -> 19088 (16-float rounding); per thread 36864 x 3 +
    #   4096 + 320 + 73728 = 188736, two threads: 19088 + 377472 = 396560
    # scratch = 2 * 1 * 1536 * 9 // 8 = 3456
    assert attention_work_floats(1, 576, 576, 2) == 396_560
    got = estimate_work_bytes(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                              context_length=2048, threads=2, batch=1)
    assert got == 503696 * 4 + 3456 == 2_018_240


def test_estimate_work_bytes_grows_with_each_input() -> None:
    # The three FFN widths are equal so that doubling any one of them widens F.
    base = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, n_heads=4,
                n_kv_heads=2, head_dim=16, n_experts=8, n_experts_per_tok=2,
                moe_intermediate_size=128, shared_expert_intermediate_size=128,
                context_length=256, threads=2, batch=16)
    ref = estimate_work_bytes(**base)  # type: ignore[arg-type]
    # The attention kernels stream the keys (online softmax): the context costs nothing.
    assert estimate_work_bytes(**dict(base, context_length=1 << 20)) == ref  # type: ignore[arg-type]
    for name in base:
        if name == "context_length":
            continue
        bigger = dict(base, **{name: base[name] * 2})
        assert estimate_work_bytes(**bigger) > ref, name  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threads"):
        estimate_work_bytes(**dict(base, threads=-1))  # type: ignore[arg-type]


def test_helpers_are_reexported() -> None:
    assert parse_bytes("1GiB") == GiB and format_bytes(GiB) == "1.0 GiB"
    assert set(budget_module.__all__) >= {"plan_budget", "BudgetPlan", "parse_bytes",
                                          "format_bytes", "kv_bytes", "estimate_work_bytes"}
