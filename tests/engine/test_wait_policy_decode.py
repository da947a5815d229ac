"""The wait policy is real on a real decode (issue 2 acceptance).

Two kinds of evidence. The pool's counters, on every run whatever the load: under passive
no wait ever spins (no starved spin), under spin a worker sleeps only where the policy's
contract allows (parked between computations, after a spin that lost its core, and in a
computation that the starvation guard turned passive), and a policy changed on a loaded
model shows in the very next decode. And process CPU time, where the machine lets it speak:
CPU seconds per wall second are higher under spin than passive, and an idle model uses
(near) zero CPU under every policy. A CPU ratio needs the cores to itself; on a machine
whose other processes hold them (measured from /proc/stat) or oversubscribe them, that one
test skips with its figures (an allowed skip, tests/conftest.py), and the counters stand."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.settings.config import EngineConfig, ThreadConfig
from support.realmodel import smollm2_gguf

DECODE_STEPS = 24


def _machine_busy_seconds() -> float:
    """CPU seconds all processes have used (from /proc/stat), to tell our use from others'."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _cpu_per_wall_during_decode(model: colibri.Model) -> tuple[float, float]:
    """(our CPU-s per wall-s, other processes' CPU-s per wall-s) over a decode."""
    s = model.session()
    logits = s.forward([1, 2, 3, 4])
    busy0, cpu0, wall0 = _machine_busy_seconds(), time.process_time(), time.perf_counter()
    for _ in range(DECODE_STEPS):
        logits = s.forward([int(np.argmax(logits))])
    wall = time.perf_counter() - wall0
    ours = time.process_time() - cpu0
    others = max(0.0, _machine_busy_seconds() - busy0 - ours)
    return ours / wall, others / wall


def _idle_cpu_seconds(seconds: float = 1.0) -> float:
    cpu0 = time.process_time()
    time.sleep(seconds)
    return time.process_time() - cpu0


@pytest.fixture(scope="module")
def model() -> colibri.Model:
    return colibri.Model.load(
        smollm2_gguf(),
        engine=EngineConfig(threads=ThreadConfig(n=2, wait_policy="spin"), context_length=128),
    )


def test_spin_uses_more_cpu_than_passive_and_changes_apply_at_once(
    model: colibri.Model,
) -> None:
    figures = {}
    others = 0.0
    starved = 0
    # spin -> passive -> spin on the same loaded model: each figure reflects the policy set
    # just before it, so a change takes effect at once.
    for label, policy in (("spin", "spin"), ("passive", "passive"), ("spin again", "spin")):
        model.set_threads(ThreadConfig(n=2, wait_policy=policy))
        _cpu_per_wall_during_decode(model)  # warm-up
        model.reset_thread_stats()
        figures[label], busy_elsewhere = _cpu_per_wall_during_decode(model)
        others = max(others, busy_elsewhere)
        starved += model.thread_stats().starved
    print("CPU seconds per wall second during decode (2 threads):", figures,
          f"other processes: {others:.2f}")  # fmt: skip
    if others > 0.25 and os.cpu_count() == 2:
        # Measured independently from /proc/stat: other processes held a good part of a
        # core, so our two threads could not both run and neither policy can show itself.
        pytest.skip(f"machine busy: other processes used {others:.2f} CPU-s/s: {figures}")
    if starved:
        # More runnable threads than cores (other processes): the pool's guard turns a
        # spinning wait that lost its core into a sleep (docs/tuning.md), so the two
        # policies cannot differ. The pool-level test covers this case.
        pytest.skip(f"machine oversubscribed ({starved} starved waits): {figures}")
    # Under spin the worker burns its core between the ~300 parallel regions of a token
    # (serial parts of a layer, the caller's sampling); passive sleeps there. On an idle
    # 2-core machine spin is close to 2 CPU-s/s. A ratio, not a difference, so that a
    # slower machine scales both figures alike; 1.15 is well above run-to-run noise (<3%).
    assert figures["spin"] > 1.15 * figures["passive"]
    assert figures["spin again"] > 1.15 * figures["passive"]


STRIKES = 3  # csrc/threadpool: kStarvedStrikes, starved waits before a computation turns passive


def test_policies_sleep_as_they_should(model: colibri.Model) -> None:
    """Counters, not timings: they hold on a loaded machine too."""
    figures = {}
    for label, policy in (("spin", "spin"), ("passive", "passive"), ("spin again", "spin")):
        model.set_threads(ThreadConfig(n=2, wait_policy=policy))  # applies at once
        s = model.session()
        logits = s.forward([1, 2, 3, 4])
        model.reset_thread_stats()
        for _ in range(DECODE_STEPS):
            logits = s.forward([int(np.argmax(logits))])
        figures[label] = model.thread_stats()
    text = {k: v.as_dict() for k, v in figures.items()}
    for label in ("spin", "spin again"):
        st = figures[label]
        assert st.scopes == DECODE_STEPS and st.regions > 100 * DECODE_STEPS, text
        # One team worker: it parks once per computation; beyond that it sleeps only after
        # a spin that lost its core, or for the rest of a computation with STRIKES of them.
        per_scope = st.regions // st.scopes + 1
        bound = st.scopes + st.starved + (st.starved // STRIKES) * per_scope
        assert st.sleeps <= bound, (label, text)
    passive = figures["passive"]
    assert passive.starved == 0, text  # a passive wait never spins, so it never starves
    assert passive.sleeps >= passive.scopes, text


@pytest.mark.parametrize("policy", ["spin", "passive", "hybrid"])
def test_idle_model_is_quiet(model: colibri.Model, policy: str) -> None:
    model.set_threads(ThreadConfig(n=2, wait_policy=policy))
    _cpu_per_wall_during_decode(model)
    idle = _idle_cpu_seconds(1.0)
    print(f"{policy}: {idle:.4f} CPU-s used while idle for 1 s")
    # A team left spinning would use ~1 CPU-s per worker here.
    assert idle < 0.05
