"""The compute team (colibri._core.ThreadPool): coverage, exceptions, resizing, and that
the wait policy is real (CPU used per wall second) and bounded to a computation (an idle
pool uses no CPU under any policy).

CPU figures come from time.process_time(), which sums every thread of this process. No
wall-time performance is asserted; the CPU/wall figures are printed (run with -s).
"""

from __future__ import annotations

import time

import pytest
from colibri.errors import ModelIOError

core = pytest.importorskip("colibri._core")
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
    # users meet ConfigError earlier, from colibri.config.
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
REGIONS, WORK_NS, N_INDICES, SLEEP_NS = 1500, 20_000, 2, 200_000
RATIO = 1.5


def cpu_per_wall(p: object) -> float:
    t0, c0 = time.perf_counter(), time.process_time()
    done = p.run_regions(  # type: ignore[attr-defined]
        REGIONS, WORK_NS, N_INDICES, grain=1, sleep_ns=SLEEP_NS)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert done == REGIONS * N_INDICES
    return cpu / wall


def test_spin_uses_more_cpu_than_passive() -> None:
    p = core.ThreadPool(2, WP.SPIN)
    p.run_regions(100, WORK_NS, N_INDICES, grain=1, sleep_ns=SLEEP_NS)  # warm up
    spin = cpu_per_wall(p)
    p.configure(policy=WP.PASSIVE)
    p.reset_stats()
    passive = cpu_per_wall(p)
    passive_sleeps = p.stats().sleeps
    p.configure(policy=WP.SPIN)  # back: the figure follows at once
    p.reset_stats()
    spin_again = cpu_per_wall(p)
    spin_sleeps = p.stats().sleeps
    print(f"\nCPU-s per wall-s, 2 threads: spin {spin:.2f}, passive {passive:.2f}, "
          f"spin again {spin_again:.2f}; worker sleeps: passive {passive_sleeps}, "
          f"spin {spin_sleeps}")
    assert spin > RATIO * passive
    assert spin_again > RATIO * passive
    # Passive workers sleep once per region; spinning ones (almost) never inside the scope.
    assert passive_sleeps >= REGIONS * 0.9
    assert spin_sleeps <= REGIONS * 0.1


def test_caller_wait_follows_the_policy() -> None:
    # Regions where the worker's chunk is much longer than the caller's: the caller waits.
    p = core.ThreadPool(2, WP.PASSIVE)
    p.run_regions(200, 200_000, 2, grain=1)
    assert p.stats().caller_sleeps > 0
    p.configure(policy=WP.SPIN)
    p.reset_stats()
    p.run_regions(200, 200_000, 2, grain=1)
    assert p.stats().caller_sleeps == 0


def test_hybrid_spin_time_is_real() -> None:
    # spin_us above the caller's sleep: the worker still spins when the next region comes.
    p = core.ThreadPool(2, WP.HYBRID, 2000)
    p.run_regions(100, WORK_NS, N_INDICES, grain=1, sleep_ns=SLEEP_NS)
    long_spin = cpu_per_wall(p)
    p.configure(spin_us=0)  # stop spinning almost at once: like passive
    short_spin = cpu_per_wall(p)
    print(f"\nCPU-s per wall-s, hybrid: spin_us=2000 {long_spin:.2f}, spin_us=0 {short_spin:.2f}")
    assert long_spin > RATIO * short_spin


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
