"""The fuzzing gate (docs/reliability.md): hostile GGUF, safetensors and container inputs
never crash, hang, raise outside colibri.errors or read outside the model directory.

The short seeded campaign runs in the default suite; the long one (>= 20,000 mutants per
format) only with ``-m slow``. Saved crashers in regressions/ are replayed every time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import colibri

from . import harness
from .campaign import Audit, print_table, run_format, strace_works
from .seeds import build_seeds

SHORT = 300  # mutants per format in the default suite (about 10 s each here)
LONG = 20_000
FILE_FORMATS = ("gguf", "safetensors", "native")
REGRESSIONS = Path(__file__).parent / "regressions"
TESTS_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def seeds(tmp_path_factory: pytest.TempPathFactory, tiny_models: object) -> Path:
    return build_seeds(tmp_path_factory.mktemp("fuzz") / "seeds")


def _check(result: object) -> None:
    r = result
    assert r.mutants > 0  # type: ignore[attr-defined]
    for kind in ("other_exception", "signal", "timeout"):
        assert r.counts[kind] == 0, [  # type: ignore[attr-defined]
            (b["i"], b["desc"], b["error"], b["detail"][-400:]) for b in r.bad  # type: ignore[attr-defined]
        ]
    assert r.outside_reads == []  # type: ignore[attr-defined]


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_short_campaign(fmt: str, seeds: Path, tmp_path: Path) -> None:
    result = run_format(fmt, seeds, tmp_path, SHORT, seed=1, timeout=20.0,
                        jobs=min(2, os.cpu_count() or 1))  # fmt: skip
    print_table([result])
    assert result.mutants == SHORT
    assert result.counts["colibri_error"] > SHORT // 2  # the mutators do reach the checks
    _check(result)


def _slow_selected(config: pytest.Config) -> bool:
    return "slow" in (config.getoption("markexpr") or "")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_long_campaign(fmt: str, seeds: Path, tmp_path: Path,
                       request: pytest.FixtureRequest) -> None:  # fmt: skip
    if not _slow_selected(request.config):
        pytest.skip("the long campaign runs with -m slow")
    result = run_format(fmt, seeds, tmp_path, LONG, seed=2, timeout=20.0,
                        jobs=max(1, min(4, os.cpu_count() or 1)))  # fmt: skip
    print_table([result])
    _check(result)
    # CPU time: on a shared machine wall time also counts the time the child waited for
    # a core (both are recorded in docs/reliability.md).
    assert result.slowest_rejection_cpu_s < 1.0, result.slowest_rejection_cpu
    assert result.peak_rss_rejected_mb < 1024


def _replay(case: Path, work: Path) -> harness.Outcome:
    """The case replayed in a fresh interpreter (fuzz/replay.py says why not from here)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(TESTS_DIR), *(str(Path(p).parent) for p in colibri.__path__)]))
    proc = subprocess.run([sys.executable, "-m", "fuzz.replay", str(case), str(work)],
                          cwd=TESTS_DIR, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return harness.Outcome(**json.loads(proc.stdout.splitlines()[-1]))


# File-format crashers are directories holding MUTANT.json; other fuzzers keep their own
# regression files beside them (regressions/chat_template/ is replayed by its own test).
@pytest.mark.parametrize("case", sorted(p.name for p in REGRESSIONS.iterdir()
                                        if (p / "MUTANT.json").is_file()))
def test_regression_inputs(case: str, tmp_path: Path) -> None:
    """Every input a campaign ever crashed on is rejected (or loads) cleanly now."""
    out = _replay(REGRESSIONS / case, tmp_path)
    assert out.kind in ("colibri_error", "silent_load"), (out.error, out.detail)


# --------------------------------------------------------------------------- the gate's own checks


def _dies(entry: Path, index: int) -> None:
    os.kill(os.getpid(), 11)


def _hangs(entry: Path, index: int) -> None:
    while True:
        pass


def _allocates(entry: Path, index: int) -> None:
    bytearray(8 << 30)


@pytest.mark.parametrize("use_strace", [False, True])
def test_audit_sees_a_read_outside(seeds: Path, tmp_path: Path, use_strace: bool) -> None:
    """A child that reads the decoy next to its model directory is reported, by strace
    and by the audit hook alike (so a clean campaign means something)."""
    if use_strace and not strace_works():
        pytest.skip("strace is not usable here")
    result = run_format("probe-read", seeds, tmp_path, 2, seed=1, use_strace=use_strace,
                        plugins=("fuzz.probes",))  # fmt: skip
    assert len(result.outside_reads) == 2
    assert all("outside/secret.json" in r["paths"][0] for r in result.outside_reads)


def test_audit_policy(tmp_path: Path) -> None:
    audit = Audit(tmp_path)
    (tmp_path / "m").mkdir()
    os.symlink("/etc/passwd", tmp_path / "m" / "link")
    assert not audit.outside(str(tmp_path / "m" / "model.gguf"))
    assert audit.outside(str(tmp_path / "m" / "link"))  # where the symlink leads counts
    assert audit.outside(str(tmp_path / "outside" / "secret.json"))
    assert audit.outside(str(tmp_path / "m" / ".." / "outside" / "x"))
    assert audit.outside("/etc/passwd") and audit.outside("/proc/self/environ")
    assert not audit.outside("/proc/self/cgroup")


@pytest.mark.parametrize(("action", "kind"), [(_dies, "signal"), (_hangs, "timeout"),
                                              (_allocates, "other_exception")])  # fmt: skip
def test_harness_classifies(tmp_path: Path, action: harness.Action, kind: str) -> None:
    out = harness.run_in_child(action, (tmp_path / "x", 0), timeout=2.0,
                               mem_cap=harness.vm_size_bytes() + 2**30)  # fmt: skip
    assert out.kind == kind, out
