"""The compute team (colibri._core.ThreadPool): coverage, exceptions, resizing, and that
the wait policy is real (CPU used per wall second) and bounded to a computation (an idle
pool uses no CPU under any policy).

CPU figures come from time.process_time(), which sums every thread of this process. No
wall-time performance is asserted; the CPU/wall figures are printed (run with -s).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

from colibri import _core as core
from colibri.errors import ModelIOError

WP = core.WaitPolicy


# --- correctness ----------------------------------------------------------------------------


@pytest.mark.parametrize("team", [1, 2, 3, 5])
def test_every_index_exactly_once(team: int) -> None:
    p = core.ThreadPool(team, WP.SPIN)
    for n in [0, 1, 2, 3, 7, 64, 1000, 4097]:
        for grain in [0, 1, 3, 64, 10_000]:
            visits, per_member, max_chunk = p.coverage(n, grain)
            assert visits == [1] * n, (n, grain)
            assert len(per_member) == team
            assert sum(per_member) == n
            if grain > 0:
                assert max_chunk <= grain
            if n > 0:
                assert max_chunk >= 1


def test_coverage_inside_spinning_scope_many_times() -> None:
    # Many back-to-back regions exercise the hand-off (generation word, pending count).
    p = core.ThreadPool(3, WP.SPIN)
    for n in [5, 17, 333]:
        assert p.run_regions(2000, 0, n, 1) == 2000 * n
    assert p.stats().regions >= 6000 - 10


@pytest.mark.parametrize(("kind", "exc"), [("runtime", RuntimeError), ("value", ValueError),
                                           ("io", ModelIOError)])
@pytest.mark.parametrize("policy", [WP.SPIN, WP.PASSIVE, WP.HYBRID])
def test_exception_is_rethrown_in_caller(kind: str, exc: type[Exception], policy: object) -> None:
    p = core.ThreadPool(2, policy)
    for index in [0, 57, 99]:  # the caller's first chunk, a middle one, the last one
        with pytest.raises(exc, match=str(index)):
            p.raise_at(100, 3, index, kind)
        # The pool still works afterwards.
        visits, _, _ = p.coverage(100, 3)
        assert visits == [1] * 100


def test_exception_with_team_of_one() -> None:
    p = core.ThreadPool(1)
    with pytest.raises(RuntimeError, match="boom"):
        p.raise_at(10, 1, 4)


def test_nested_region_runs_inline() -> None:
    p = core.ThreadPool(2, WP.SPIN)
    assert p.nested(8, 5) == 40
    assert p.stats().inline_regions >= 8


def test_resize_and_policy_via_configure() -> None:
    p = core.ThreadPool(2, WP.SPIN, 50)
    assert p.size == 2
    assert p.settings == core.ThreadSettings(2, WP.SPIN, 50)
    for team in [4, 1, 3, 2]:
        p.configure(n_threads=team)
        assert p.size == team
        visits, per_member, _ = p.coverage(500, 1)
        assert visits == [1] * 500 and len(per_member) == team
    p.configure(policy=WP.PASSIVE)
    assert p.settings == core.ThreadSettings(2, WP.PASSIVE, 50)
    p.configure(core.ThreadSettings(n_threads=3, policy=WP.HYBRID, spin_us=7))
    assert (p.size, p.settings.policy, p.settings.spin_us) == (3, WP.HYBRID, 7)


@pytest.mark.parametrize("kwargs", [{"n_threads": 0}, {"n_threads": 100_000},
                                    {"spin_us": -1}, {"spin_us": 10**7}])
def test_bad_settings_raise_config_error(kwargs: dict[str, int]) -> None:
    p = core.ThreadPool(2)
    # The core reports bad arguments as ValueError (colibri.errors.InvalidRequestError);
    # users meet ConfigError earlier, from colibri.settings.config.
    with pytest.raises(ValueError, match="threads:"):
        p.configure(**kwargs)
    assert p.size == 2  # unchanged and usable
    assert p.coverage(10, 1)[0] == [1] * 10
    with pytest.raises(ValueError):
        core.ThreadPool(core.ThreadSettings(**kwargs))


# --- the wait policy is real ----------------------------------------------------------------

# The workload, the seed reports' situation in miniature: regions of 2 indices x 20 µs of
# busy work on a team of 2, and between them the caller sleeps 200 µs, as an engine does
# while it waits for an expert read or the GPU. A spinning worker burns its core through
# every wait; a passive one sleeps. Expected on an idle machine: spin ~1.1 CPU-s per wall-s
# (one spinning worker plus the work), passive ~0.2 (the work, two wake-ups per region).
# The assertions ask for spin > 1.5 x passive, far below the ~5x expected, because a loaded
# machine (the CI box runs other suites) shrinks the spinner's share of a core; a ratio is
# used, not a difference, since both figures shrink with that share.
#
# Oversubscription: a spin wait that loses its core for over 1 ms sleeps, and after three
# such waits the rest of its computation waits passively (the scheduler favours sleepers;
# spinning there is many times slower). The measurement is therefore split into SCOPES
# computations, so that a few such computations move the figure little. If most of them
# turned passive, the machine is too busy for CPU figures to say anything about the
# policy: if the figures then miss the ratio, the test is skipped with them in the message.
SCOPES, REGIONS_PER_SCOPE, WORK_NS, N_INDICES, SLEEP_NS = 30, 50, 20_000, 2, 200_000
RATIO = 1.5
STRIKES = 3  # csrc/threadpool: kStarvedStrikes


@dataclass
class Figure:
    cpu_per_wall: float  # CPU-s of the whole process per wall-s
    sleeps: int  # worker sleeps
    starved: int  # spin waits that lost their core
    turned_passive: int  # computations that reached STRIKES starved waits


def measure(p: object) -> Figure:
    """CPU-s per wall-s over SCOPES computations of REGIONS_PER_SCOPE regions."""
    p.reset_stats()  # type: ignore[attr-defined]
    turned = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(SCOPES):
        before = p.stats().starved  # type: ignore[attr-defined]
        done = p.run_regions(  # type: ignore[attr-defined]
            REGIONS_PER_SCOPE, WORK_NS, N_INDICES, grain=1, sleep_ns=SLEEP_NS)
        assert done == REGIONS_PER_SCOPE * N_INDICES
        turned += p.stats().starved - before >= STRIKES  # type: ignore[attr-defined]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = p.stats()  # type: ignore[attr-defined]
    return Figure(cpu / wall, st.sleeps, st.starved, turned)


def assert_more_cpu(high: Figure, low: Figure, figures: str) -> None:
    """high used > RATIO x the CPU per wall second of low; if not, and most of high's
    computations turned passive because the machine is oversubscribed, skip (the figures
    then measure the scheduler; a policy that did not spin would never starve)."""
    if high.cpu_per_wall > RATIO * low.cpu_per_wall:
        return
    if high.turned_passive > SCOPES // 2:
        pytest.skip(f"machine oversubscribed: {high.turned_passive} of {SCOPES} spinning "
                    f"computations lost their cores and turned passive ({figures})")
    raise AssertionError(f"expected > {RATIO}x the CPU per wall second: {figures}")


def test_spin_uses_more_cpu_than_passive() -> None:
    p = core.ThreadPool(2, WP.SPIN)
    p.run_regions(100, WORK_NS, N_INDICES, grain=1, sleep_ns=SLEEP_NS)  # warm up
    spin = measure(p)
    p.configure(policy=WP.PASSIVE)
    passive = measure(p)
    p.configure(policy=WP.SPIN)  # back: the figure follows at once
    again = measure(p)
    figures = (f"CPU-s per wall-s, 2 threads: spin {spin.cpu_per_wall:.2f}, passive "
               f"{passive.cpu_per_wall:.2f}, spin again {again.cpu_per_wall:.2f}; worker "
               f"sleeps: spin {spin.sleeps}, passive {passive.sleeps}; computations turned "
               f"passive by oversubscription: {spin.turned_passive}, {again.turned_passive}")
    print("\n" + figures)
    assert_more_cpu(spin, passive, figures)
    assert_more_cpu(again, passive, figures)
    # Passive workers sleep once per region. Spinning ones sleep once per computation
    # (parked between calls), plus after each starved wait and in computations that
    # turned passive.
    assert passive.sleeps >= SCOPES * REGIONS_PER_SCOPE * 0.9
    assert spin.sleeps <= SCOPES + spin.starved + REGIONS_PER_SCOPE * spin.turned_passive
    assert passive.starved == 0  # a passive pool never spins, so never starves


def test_caller_wait_follows_the_policy() -> None:
    # Regions where the worker's chunk is much longer than the caller's: the caller waits.
    p = core.ThreadPool(2, WP.PASSIVE)
    p.run_regions(200, 200_000, 2, grain=1)
    assert p.stats().caller_sleeps > 0
    p.configure(policy=WP.SPIN)
    p.reset_stats()
    p.run_regions(200, 200_000, 2, grain=1)
    if p.stats().starved == 0:  # else the machine is oversubscribed: the caller slept
        assert p.stats().caller_sleeps == 0


def test_hybrid_spin_time_is_real() -> None:
    # spin_us above the caller's sleep: the worker still spins when the next region comes.
    p = core.ThreadPool(2, WP.HYBRID, 2000)
    p.run_regions(100, WORK_NS, N_INDICES, grain=1, sleep_ns=SLEEP_NS)
    long_spin = measure(p)
    p.configure(spin_us=0)  # stop spinning almost at once: like passive
    short_spin = measure(p)
    figures = (f"CPU-s per wall-s, hybrid: spin_us=2000 {long_spin.cpu_per_wall:.2f}, "
               f"spin_us=0 {short_spin.cpu_per_wall:.2f}; computations turned passive by "
               f"oversubscription: {long_spin.turned_passive}")
    print("\n" + figures)
    assert_more_cpu(long_spin, short_spin, figures)


@pytest.mark.parametrize("policy", [WP.SPIN, WP.PASSIVE, WP.HYBRID])
def test_idle_pool_uses_no_cpu(policy: object) -> None:
    # After a computation returns, the team parks under every policy: 1 s idle must cost
    # well under 0.05 CPU-s (a spinning worker would cost ~1.0).
    p = core.ThreadPool(2, policy, 1_000_000)  # hybrid would spin up to 1 s if unbounded
    p.run_regions(1000, 1000, 2, 1, 0)
    time.sleep(0.01)  # spinners notice the closed scope within microseconds
    c0 = time.process_time()
    time.sleep(1.0)
    idle = time.process_time() - c0
    print(f"\nidle CPU-s over 1 s after a {policy.name} computation: {idle:.4f}")
    assert idle < 0.05


def test_stats_count_regions_and_scopes() -> None:
    p = core.ThreadPool(2, WP.PASSIVE)
    p.run_regions(10, 0, 4, 1)
    s = p.stats()
    assert (s.regions, s.scopes) == (10, 1)
    assert s.as_dict()["regions"] == 10
    p.run_regions(3, 0, 1, 1)  # one index: the caller runs it alone
    assert p.stats().inline_regions == 3
    p.reset_stats()
    assert p.stats().regions == 0


def test_oversubscribed_team_completes() -> None:
    # Four spinning threads per CPU, each region longer than a time slice: members lose
    # their cores mid-wait. Every region must still complete exactly; the starved waits
    # (which then sleep) are printed, not asserted: they depend on the scheduler.
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    team = min(4 * (ncpu or 1) + 1, 257)
    p = core.ThreadPool(team, WP.SPIN)
    assert p.run_regions(10, 2_000_000, team, grain=1) == 10 * team
    print(f"\nteam of {team} on {ncpu} CPUs: {p.stats()}")
    visits, _, _ = p.coverage(10_000, 7)
    assert visits == [1] * 10_000
