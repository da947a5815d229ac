"""The streaming tier's command-line flags (``--ram-budget``, ``--io-workers``,
``--direct/--no-direct``, ``--prefetch/--no-prefetch``, ``--cache-policy``, ``--wait-policy
auto``) and the run summary's expert, phase and memory lines, in process: flags ->
EngineConfig, one-line errors before any model is loaded, and the printing against stand-in
models whose stats do or do not carry the streaming figures."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import colibri
from colibri import cli
from colibri.cli.common import Loaded
from colibri.cli.parser import engine_from_args, flag_message, parse_args
from colibri.cli.run import run_record, summary_lines
from colibri.engine.stats import ExpertStats, MemoryStats, PhaseTimes
from colibri.errors import ConfigError
from colibri.generate.generation import GenerationStats
from colibri.models.hub import ResolvedModel
from colibri.settings.config import (
    CacheConfig,
    CachePolicy,
    EngineConfig,
    IOConfig,
    ThreadConfig,
    WaitPolicy,
)

GiB, MiB = 1 << 30, 1 << 20


def engine(*argv: str, command: str = "run") -> EngineConfig:
    args = parse_args([command, *argv, *(["hi"] if command == "run" else [])],
                      colibri.__version__)
    return engine_from_args(args)


# --- flags -> EngineConfig ------------------------------------------------------------------


def test_no_flags_give_the_defaults() -> None:
    assert engine() == EngineConfig()
    assert engine(command="chat") == EngineConfig()
    assert engine().threads.wait_policy is WaitPolicy.AUTO


def test_every_streaming_flag() -> None:
    e = engine("--ram-budget", "12GiB", "--io-workers", "8", "--no-direct", "--no-prefetch",
               "--cache-policy", "pinned", "--wait-policy", "auto", "-t", "3")
    assert e.ram_budget == 12 * GiB
    assert e.io == IOConfig(workers=8, direct=False, prefetch=False)
    assert e.cache == CacheConfig(policy=CachePolicy.PINNED)
    assert e.threads == ThreadConfig(n=3, wait_policy="auto")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--ram-budget", "1.5GB"], EngineConfig(ram_budget=1_500_000_000)),
        (["--ram-budget", "800M"], EngineConfig(ram_budget=800 * MiB)),
        (["--ram-budget", "4096"], EngineConfig(ram_budget=4096)),
        (["--ram-budget=6gib"], EngineConfig(ram_budget=6 * GiB)),
        (["--io-workers", "0"], EngineConfig(io={"workers": 0})),
        (["--direct"], EngineConfig(io={"direct": True})),
        (["--no-direct"], EngineConfig(io={"direct": False})),
        (["--prefetch"], EngineConfig(io={"prefetch": True})),
        (["--no-prefetch"], EngineConfig(io={"prefetch": False})),
        (["--no-prefetch", "--prefetch"], EngineConfig()),  # the last one wins
        (["--no-first-layer-guess"], EngineConfig(io={"first_layer_guess": False})),
        (["--first-layer-guess"], EngineConfig(io={"first_layer_guess": True})),
        (["--cache-policy", "lru"], EngineConfig(cache={"policy": "lru"})),
        (["--cache-policy", "lfru"], EngineConfig(cache={"policy": "lfru"})),
        (["--wait-policy", "spin"], EngineConfig(threads={"wait_policy": "spin"})),
        (["--wait-policy", "passive"], EngineConfig(threads={"wait_policy": "passive"})),
    ],
)
def test_one_flag(argv: list[str], expected: EngineConfig) -> None:
    assert engine(*argv) == expected
    assert engine(*[a for a in argv if a != "hi"], command="chat") == expected


def test_flags_that_are_left_out_keep_the_other_defaults() -> None:
    e = engine("--io-workers", "2")
    assert (e.io.direct, e.io.prefetch, e.io.checksums) == (True, True, "first")
    assert e.cache == CacheConfig() and e.ram_budget is None


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--ram-budget", "lots"], ["argument --ram-budget:", "'lots' is not a size", "6GiB"]),
        (["--ram-budget", "0"], ["argument --ram-budget:", "more than 0"]),
        (["--ram-budget", "-1G"], ["argument --ram-budget:"]),
        (["--ram-budget", "3PiB"], ["argument --ram-budget:", "largest allowed"]),
        (["--io-workers", "-1"], ["argument --io-workers:", "0..64"]),
        (["--io-workers", "65"], ["argument --io-workers:", "0..64"]),
        (["--io-workers", "four"], ["--io-workers", "'four'"]),
        (["--cache-policy", "lfu"], ["--cache-policy", "'lfu'", "'lru', 'lfru', 'pinned'"]),
        (["--wait-policy", "busy"], ["--wait-policy", "'busy'", "auto"]),
        (["--direct=no"], ["--direct"]),
    ],
)
def test_bad_flags_are_one_line_exit_2_before_loading(
    argv: list[str], needles: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The model path does not exist: a flag error must be reported first (status 2, not 1).
    code = cli.main(["run", "--model", str(tmp_path / "missing.gguf"), *argv, "hi"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("colibri: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_budget_errors_from_the_load_name_the_flag() -> None:
    # plan_budget raises "EngineConfig.ram_budget: ..." at load; the CLI names the flag.
    msg = flag_message(ConfigError("EngineConfig.ram_budget: 2.0 GiB cannot hold ..."))
    assert msg == "argument --ram-budget: 2.0 GiB cannot hold ..."
    assert flag_message(ConfigError("IOConfig.workers: 99 is out of range")).startswith(
        "argument --io-workers:")
    assert flag_message(ConfigError("CacheConfig.policy: 'x'")).startswith(
        "argument --cache-policy:")


def test_budget_advice_names_flags_not_fields() -> None:
    """The fix a budget error suggests is given in the CLI's words (issue 38, item 10): the
    real message of a budget too small for the resident part."""
    from colibri.engine.budget import plan_budget

    with pytest.raises(ConfigError) as info:
        plan_budget(budget=1000, available=None, dense_bytes=96 << 20, kv_bytes=90 << 20,
                    work_bytes=18 << 20, slot_bytes=0, total_experts=0, min_slots=0)
    assert "EngineConfig.context_length" in str(info.value)  # Python's words
    msg = flag_message(info.value)
    assert msg.startswith("argument --ram-budget: 1000 B cannot hold the resident part")
    assert msg.endswith("raise --ram-budget or lower --context-length"), msg
    assert "EngineConfig" not in msg and "_" not in msg.split("bytes)")[-1]


def test_help_lists_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--ram-budget SIZE", "--io-workers N", "--direct, --no-direct",
                 "--prefetch, --no-prefetch", "--cache-policy {lru,lfru,pinned}",
                 "{auto,spin,passive,hybrid}", "expert streaming"):
        assert flag in out, flag
    assert "10% or 512 MiB" in " ".join(out.split())


# --- the summary and the JSON record --------------------------------------------------------


EXPERTS = ExpertStats(hits=1200, misses=80, reads=100, bytes_read=GiB, read_seconds=1.25,
                      stall_seconds=0.4, prefetch_issued=300, prefetch_used=250,
                      prefetch_wasted=50, prefetch_cancelled=10, predicted_routed=250,
                      routed_after_prediction=300, evictions=12)
PHASES = PhaseTimes(attention=0.12, dense=0.01, router=0.02, expert_matmul=0.8,
                    expert_wait=0.4, lm_head=0.05)
MEMORY = MemoryStats(budget=12 * GiB, dense_bytes=3 * GiB, kv_bytes=768 * MiB,
                     work_bytes=83 * MiB, cache_bytes=8 * GiB, cache_slots=655,
                     slot_bytes=12 * MiB + 512 * 1024, cached_experts=600, pinned_experts=120,
                     total_experts=6144, expert_bytes=75 * GiB)


@dataclass
class FakeConfig:
    n_experts: int
    arch: str = "qwen3_moe"


@dataclass
class FakeManifest:
    source: str = "gguf"


@dataclass
class FakeModelStats:
    last: GenerationStats | None
    memory: MemoryStats | None = None
    experts: ExpertStats = field(default_factory=ExpertStats)
    phases: PhaseTimes = field(default_factory=PhaseTimes)
    wait_policy: str = ""


@dataclass
class OldModelStats:
    """ModelStats before the streaming fields."""

    last: GenerationStats | None


@dataclass(frozen=True)
class StreamingGenerationStats(GenerationStats):
    """GenerationStats with the streaming fields, as colibri.generate.generation will have them."""

    experts: ExpertStats | None = None
    phases: PhaseTimes | None = None
    wait_policy: str = ""


class FakeModel:
    def __init__(self, n_experts: int, model_stats: Any, engine: EngineConfig) -> None:
        self.config = FakeConfig(n_experts)
        self.manifest = FakeManifest()
        self.engine_config = engine
        self.threads = engine.threads
        self.context_length = 4096
        self._stats = model_stats

    def stats(self) -> Any:
        return self._stats


def loaded(model: FakeModel) -> Loaded:
    return Loaded(model, ResolvedModel(Path("/m/model.gguf"), None), 1.5)  # type: ignore[arg-type]


def gen_stats(**streaming: Any) -> GenerationStats:
    base = dict(prompt_tokens=5, generated_tokens=8, prefill_seconds=0.5, decode_seconds=1.4,
                sampling_seconds=0.01, decode_tokens=7)
    if streaming:
        return StreamingGenerationStats(**base, **streaming)
    return GenerationStats(**base)


def run_args(*argv: str) -> argparse.Namespace:
    return parse_args(["run", *argv, "hi"], colibri.__version__)


def test_summary_of_a_moe_run() -> None:
    stats = gen_stats(experts=EXPERTS, phases=PHASES, wait_policy="passive")
    model = FakeModel(128, FakeModelStats(stats, memory=MEMORY, wait_policy="passive"),
                      EngineConfig())
    lines = summary_lines(loaded(model), stats, "length")
    print("\n".join(lines))
    assert lines == [
        "colibri: load 1.50 s, 5 prompt tokens, 8 generated; prefill 10.0 tok/s, decode "
        "5.0 tok/s; finish: length",
        "colibri: experts: 1200 hits, 80 misses (93.8% hit rate); read 1.0 GiB in 100 reads, "
        "1.25 s (819 MiB/s), stalled 400 ms; prefetch 300 issued, 250 used, 50 wasted "
        "(recall 83.3%); 12 evictions",
        "colibri: time: attention 120 ms, dense 10 ms, router 20 ms, expert matmul 800 ms, "
        "expert wait 400 ms, lm_head 50 ms; wait policy passive (auto)",
        "colibri: memory: budget 12.0 GiB = dense 3.0 GiB + KV 768 MiB + work 83.0 MiB + "
        "expert cache 8.0 GiB (655 slots of 12.5 MiB; 600 in use, 120 pinned); experts 6144, "
        "75.0 GiB on disk",
    ]
    # An explicit policy is not repeated in parentheses; read errors are shown when any.
    bad = gen_stats(experts=ExpertStats(hits=1, read_errors=2, checksum_failures=1),
                    phases=PHASES, wait_policy="spin")
    model = FakeModel(8, FakeModelStats(bad), EngineConfig(threads={"wait_policy": "spin"}))
    lines = summary_lines(loaded(model), bad, "stop")
    assert len(lines) == 3  # no memory split reported
    assert "2 read errors, 1 checksum failures" in lines[1]
    assert "read 0 B in 0 reads, 0.00 s, stalled 0.00 s" in lines[1]  # no rate without time
    assert "prefetch" not in lines[1]
    assert lines[2].endswith("; wait policy spin")
    # The model may name the choice itself: then "(auto)" is not repeated.
    chose = gen_stats(experts=EXPERTS, phases=PHASES, wait_policy="auto (passive)")
    model = FakeModel(8, FakeModelStats(chose), EngineConfig())
    assert summary_lines(loaded(model), chose, "stop")[2].endswith(
        "; wait policy auto (passive)")


def test_summary_before_the_streaming_stats_exist() -> None:
    stats = gen_stats()  # GenerationStats without experts/phases/wait_policy
    for n_experts in (0, 8):
        model = FakeModel(n_experts, OldModelStats(stats), EngineConfig())
        assert summary_lines(loaded(model), stats, "length") == [
            "colibri: load 1.50 s, 5 prompt tokens, 8 generated; prefill 10.0 tok/s, decode "
            "5.0 tok/s; finish: length"]


def test_small_times_keep_three_digits() -> None:
    from colibri.cli.run import phases_line

    line = phases_line(PhaseTimes(attention=2.453e-06, dense=0.0048, expert_matmul=12.5))
    assert line == ("time: attention 0.00245 ms, dense 4.8 ms, router 0.00 s, expert matmul "
                    "12.50 s, expert wait 0.00 s, lm_head 0.00 s")


def test_dense_model_summary_is_one_line() -> None:
    stats = gen_stats(experts=ExpertStats(), phases=PHASES, wait_policy="hybrid")
    model = FakeModel(0, FakeModelStats(stats, memory=MEMORY), EngineConfig())
    assert len(summary_lines(loaded(model), stats, "length")) == 1


def test_json_record_of_a_moe_run() -> None:
    stats = gen_stats(experts=EXPERTS, phases=PHASES, wait_policy="passive")
    eng = EngineConfig(ram_budget="12GiB", io={"workers": 8, "prefetch": False},
                       cache={"policy": "pinned"})
    model = FakeModel(128, FakeModelStats(stats, memory=MEMORY), eng)
    args = run_args("--ram-budget", "12GiB", "--io-workers", "8", "--no-prefetch",
                    "--cache-policy", "pinned", "-n", "8")
    rec = run_record(loaded(model), args, "hi", [1, 2], "text", [3] * 8, "length", stats)
    s = rec["stats"]
    assert s["wait_policy"] == "passive"
    assert s["experts"] == EXPERTS.to_dict() and s["experts"]["hit_rate"] == 1200 / 1280
    assert s["phases"] == PHASES.to_dict() and s["phases"]["total"] == pytest.approx(1.4)
    assert s["memory"] == MEMORY.to_dict()
    settings = rec["settings"]
    assert settings["wait_policy"] == "auto"  # as configured; stats.wait_policy: as used
    assert settings["ram_budget"] == 12 * GiB
    assert settings["io"] == IOConfig(workers=8, prefetch=False).to_dict()
    assert settings["cache"]["policy"] == "pinned"


def test_json_record_before_the_streaming_stats_exist() -> None:
    stats = gen_stats()
    for n_experts in (0, 8):
        model = FakeModel(n_experts, OldModelStats(stats), EngineConfig())
        rec = run_record(loaded(model), run_args(), "hi", [1], "t", [2], "stop", stats)
        s = rec["stats"]
        assert (s["wait_policy"], s["experts"], s["phases"], s["memory"]) == (
            None, None, None, None)
        assert rec["settings"]["ram_budget"] is None
        assert rec["settings"]["io"] == IOConfig().to_dict()
        assert rec["settings"]["cache"] == CacheConfig().to_dict()
