"""The settings classes are declared once, field by field (colibri/settings/table.py), and
everything else follows the declarations: the signatures, the command-line flags, the
copy the core gets, and the rows of docs/tuning.md's settings table (checked here, with a
self-check that the checker catches a missing, stale or wrong row)."""

from __future__ import annotations

import copy
import inspect
import pickle
import platform
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri import _core
from colibri.cli.parser import FLAG_OF_FIELD, engine_from_args, parse_args
from colibri.engine.core_spec import thread_settings
from colibri.engine.streaming import store_settings
from colibri.errors import ConfigError
from colibri.settings.config import (
    CacheConfig,
    EngineConfig,
    IOConfig,
    SpecConfig,
    ThreadConfig,
    WaitPolicy,
)
from colibri.settings.fields import BOOL
from colibri.settings.table import Settings, flag_settings, settings_of
from support.modelfactory import build_tiny_model, prompt_ids
from support.realmodel import smollm2_gguf

TUNING = Path(__file__).resolve().parents[2] / "docs" / "tuning.md"
DOCUMENTED = (EngineConfig, ThreadConfig, IOConfig, CacheConfig)  # docs/tuning.md's table
CLASSES = (*DOCUMENTED, SpecConfig)


# --- docs/tuning.md's settings table -------------------------------------------------------

_ROW = re.compile(r"^\|\s*`(\w+)\.(\w+)`\s*\|")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _flag_texts(s: object) -> list[str]:
    flag = s.flag  # type: ignore[attr-defined]
    if flag is None:
        return []
    if s.check is BOOL:  # type: ignore[attr-defined]
        return [f"`{flag.long}`", f"`--no-{flag.long[2:]}`"]
    return [f"`{name}`" for name in flag.names]


def docs_table_problems(text: str, classes: tuple[type[Settings], ...] = DOCUMENTED) -> list[str]:
    """What is wrong with the settings table in `text` (docs/tuning.md) against the
    declared fields of `classes`: a field without a row, a row for no field, a row whose
    default column does not show the declared default, a row that does not name the
    field's flag. Empty when they agree."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            rows[f"{m.group(1)}.{m.group(2)}"] = _cells(line)
    problems = []
    declared = {s.qualname: s for cls in classes for s in settings_of(cls)}
    for name, s in declared.items():
        row = rows.get(name)
        if row is None:
            flags = "".join(f" {f}" for f in _flag_texts(s))
            problems.append(f"no row for {name}; add one, e.g. | `{name}` | ... | "
                            f"`{s.shown_default()}` | {s.doc}.{flags} |")
            continue
        if f"`{s.shown_default()}`" not in row[2]:
            problems.append(f"{name}: the default column says {row[2]!r}, the declared "
                            f"default is `{s.shown_default()}`")
        missing = [f for f in _flag_texts(s) if f not in row[-1]]
        if missing:
            problems.append(f"{name}: the row does not name its flag {' / '.join(missing)}")
    problems += [f"a row for {name}, which is not a setting" for name in rows
                 if name not in declared]
    return problems


def test_the_docs_table_has_a_row_for_every_setting_and_no_other() -> None:
    assert docs_table_problems(TUNING.read_text()) == []


def test_the_docs_check_catches_a_removed_a_stale_and_a_wrong_row() -> None:
    text = TUNING.read_text()
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("| `IOConfig.max_in_flight`"))
    removed = "\n".join(lines[:row] + lines[row + 1:])
    assert docs_table_problems(removed) == [
        "no row for IOConfig.max_in_flight; add one, e.g. | `IOConfig.max_in_flight` | ... | "
        f"`0` | {IOConfig.max_in_flight.doc}. `--io-max-in-flight` |"]
    stale = text.replace("| `IOConfig.max_in_flight`", "| `IOConfig.max_reads`", 1)
    assert "a row for IOConfig.max_reads, which is not a setting" in docs_table_problems(stale)
    wrong = text.replace("| `IOConfig.workers` | `int` in 0..64, or `\"auto\"` | `2` |",
                         "| `IOConfig.workers` | `int` in 0..64, or `\"auto\"` | `4` |", 1)
    assert wrong != text
    assert docs_table_problems(wrong) == [
        "IOConfig.workers: the default column says '`4`', the declared default is `2`"]
    no_flag = text.replace("`--cache-policy`", "the cache policy flag", 1)
    assert docs_table_problems(no_flag) == [
        "CacheConfig.policy: the row does not name its flag `--cache-policy`"]


# --- what the declarations give ------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES)
def test_signature_follows_the_declarations(cls: type[Settings]) -> None:
    table = settings_of(cls)
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == [s.name for s in table]
    assert [p.default for p in params] == [s.default for s in table]
    assert [p.kind == p.KEYWORD_ONLY for p in params] == [s.kw_only for s in table]
    assert cls().to_dict() == {s.name: cls().to_dict()[s.name] for s in table}
    assert all(s.doc and "\n" not in s.doc for s in table), "every setting has a one-line doc"
    obj = cls()
    assert pickle.loads(pickle.dumps(obj)) == obj
    assert copy.deepcopy(obj) == obj and hash(copy.copy(obj)) == hash(obj)


def test_a_setting_validates_on_every_path() -> None:
    with pytest.raises(ConfigError, match=r"^IOConfig\.workers: 99 is out of range"):
        IOConfig(workers=99)
    with pytest.raises(ConfigError, match=r"^IOConfig\.workers: 99 is out of range"):
        IOConfig().replace(workers=99)
    with pytest.raises(ConfigError, match=r"^IOConfig\.workers: 99 is out of range"):
        IOConfig.from_dict({"workers": 99})
    with pytest.raises(ConfigError, match=r"^IOConfig\.workers: 99 is out of range"):
        EngineConfig(io={"workers": 99})
    # The declaration is reachable from the class, the value from the instance.
    assert IOConfig.workers.qualname == "IOConfig.workers" and IOConfig().workers == 2


def test_every_flag_is_on_the_command_line_and_names_its_field() -> None:
    parser_args = parse_args(["run", "hi"], colibri.__version__)
    flagged = list(flag_settings(EngineConfig))
    assert {s.qualname for _, s, _ in flagged} >= {  # the flags of colibri 0.x stay
        "ThreadConfig.n", "ThreadConfig.wait_policy", "EngineConfig.context_length",
        "EngineConfig.activation_precision", "EngineConfig.ram_budget",
        "EngineConfig.prefill_chunk", "IOConfig.workers", "IOConfig.direct",
        "IOConfig.prefetch", "IOConfig.first_layer_guess", "IOConfig.max_in_flight",
        "CacheConfig.policy"}
    for _, s, _ in flagged:
        assert s.flag is not None and s.qualname in FLAG_OF_FIELD
        assert FLAG_OF_FIELD[s.qualname].startswith(s.flag.long)
        assert getattr(parser_args, s.flag.long[2:].replace("-", "_")) is None  # not given


def test_flags_map_to_the_nested_settings() -> None:
    args = parse_args(["run", "--io-workers", "auto", "--io-max-in-flight", "1", "-t", "3",
                       "--no-first-layer-guess", "--ram-budget", "2GiB", "hi"],
                      colibri.__version__)
    assert engine_from_args(args) == EngineConfig(
        threads={"n": 3}, ram_budget="2GiB",
        io={"workers": "auto", "max_in_flight": 1, "first_layer_guess": False})


# --- the core's copies ---------------------------------------------------------------------


def _core_fields(obj: object) -> set[str]:
    return {n for n in dir(obj) if not n.startswith("_") and not callable(getattr(obj, n))}


def test_every_store_setting_of_the_core_comes_from_a_declaration() -> None:
    """A knob added to _core.StoreSettings without a declaration (or the reverse) fails
    here: the core's copy is the declared fields of IOConfig and CacheConfig plus the
    cache size from the budget."""
    declared = {s.core for cls in (IOConfig, CacheConfig) for s in settings_of(cls) if s.core}
    assert _core_fields(_core.StoreSettings()) == declared | {"cache_bytes"}
    assert _core_fields(_core.ThreadSettings()) == {
        s.core for s in settings_of(ThreadConfig) if s.core}


def test_store_settings_copy_every_declared_value() -> None:
    engine = EngineConfig(io={"workers": "auto", "max_in_flight": 3, "direct": False,
                              "prefetch": False, "first_layer_guess": False,
                              "checksums": "always"},
                          cache={"policy": "pinned", "pin_fraction": 0.25})
    s = store_settings(engine, 1 << 20)
    assert (s.cache_bytes, s.workers, s.max_in_flight) == (1 << 20, -1, 3)  # -1: auto
    assert (s.direct, s.prefetch, s.first_layer_guess) == (False, False, False)
    assert s.checksums == _core.ChecksumMode.always and s.policy == _core.CachePolicy.pinned
    assert s.pin_fraction == 0.25
    d = store_settings(EngineConfig(), 0)
    assert (d.workers, d.max_in_flight, d.checksums, d.policy) == (
        2, 0, _core.ChecksumMode.first, _core.CachePolicy.lfru)


@pytest.mark.parametrize("policy", list(WaitPolicy))
def test_thread_settings_pass_the_policy_through(policy: WaitPolicy) -> None:
    """"auto" goes to the core as AUTO on every host: the core alone resolves it."""
    t = thread_settings(ThreadConfig(n=3, wait_policy=policy, spin_us=7))
    assert (t.n_threads, t.spin_us) == (3, 7)
    assert t.policy == getattr(_core.WaitPolicy, policy.name)
    assert thread_settings(ThreadConfig()).n_threads == ThreadConfig().team_size()


def test_auto_is_decided_by_the_core_and_reported() -> None:
    """The core resolves "auto" (csrc/model/engine.cpp, decide_wait): a dense model never
    waits for a read, so it stays on the compute-bound policy, hybrid (passive on Apple
    Silicon), and the stats say auto chose it."""
    apple = sys.platform == "darwin" and platform.machine() == "arm64"
    engine = EngineConfig(threads=ThreadConfig(n=2), context_length=64)
    with colibri.Model.load(smollm2_gguf(), engine=engine) as m:
        m.session().forward([1, 2, 3, 4])
        assert m.stats().wait_policy == f"auto ({'passive' if apple else 'hybrid'})"
        m.set_threads(ThreadConfig(n=2, wait_policy="spin"))
        assert m.stats().wait_policy == "spin"
        m.set_threads(ThreadConfig(n=2))
        assert m.stats().wait_policy.startswith("auto (")


# --- IOConfig.prefetch_min_accuracy: a field added as one declaration plus its use ----------


def _governed_decode(src: Path, budget: int, min_accuracy: float) -> tuple[np.ndarray, object]:
    engine = EngineConfig(ram_budget=budget, cache={"history": False},
                          io={"workers": 1, "prefetch_min_accuracy": min_accuracy})
    with colibri.Model.load(src, engine=engine) as m:
        s = m.session()
        rows = [s.forward(prompt_ids(12)).copy()]
        rows += [s.forward([t]).copy() for t in prompt_ids(40, seed=5)]
        return np.stack(rows), m.stats()


def test_prefetch_min_accuracy_sets_when_the_governor_pauses() -> None:
    """0 never pauses the lookahead; 1 pauses it as soon as one guess in its window was
    wrong (after the 32 outcomes it needs). The governors only choose which reads start
    early: the logits are the same bits."""
    src = build_tiny_model("qwen3_moe").hf_dir
    probe = colibri.Model.load(src, engine=EngineConfig(cache={"history": False}))
    mem = probe.stats().memory
    probe.close()
    assert mem is not None
    budget = mem.dense_bytes + mem.kv_bytes + mem.work_bytes + 10 * mem.slot_bytes
    never, s_never = _governed_decode(src, budget, 0.0)
    always, s_always = _governed_decode(src, budget, 1.0)
    assert np.array_equal(never, always)
    e_never, e_always = s_never.experts, s_always.experts  # type: ignore[attr-defined]
    assert e_never.prefetch_candidates >= 64 and e_never.prefetch_candidates_used < (
        e_never.prefetch_candidates)  # enough outcomes, some of them wrong
    assert e_never.prefetch_switched_off == 0 and e_never.prefetch_suppressed == 0
    assert s_never.prefetch.startswith("on")  # type: ignore[attr-defined]
    assert e_always.prefetch_switched_off >= 1 and e_always.prefetch_suppressed > 0
    assert e_always.prefetch_issued < e_never.prefetch_issued
