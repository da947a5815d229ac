"""The hostile-request gate (issue 35): a seeded campaign of mutated requests against a
real ``colibri serve`` on SmolLM2 (http_campaign.py says what each answer must be). The
default run sends 300 cases (about 1-2 minutes here); ``-m slow`` runs the long campaign
recorded in docs/reliability.md ("Hostile requests")."""

from __future__ import annotations

import pytest

from .http_campaign import Summary, run_with_server
from .http_requests import make_case

PEAK_RSS_MB = 1024
"""The server's peak RSS bound over a campaign: SmolLM2 (Q8, 139 MB) serving with a
512-token context peaks near 350-450 MB here; 8 MiB bodies parsed as JSON add their
Python objects, so 1 GiB leaves room without hiding a leak."""


FREEZE_S = 2.0
"""What the gate calls a frozen loop: a /health probe or a loop-monitor wake-up this
late. Issue 35's freezes were 6-41 s. The 100 ms budget is reported, not asserted: on
this shared 2-core host valid requests alone (no mutation) delay /health past 100 ms a
few times in a hundred requests (docs/reliability.md, "Hostile requests")."""


def _check(s: Summary) -> None:
    report = s.report()
    print(report)
    assert not s.failures, report
    assert s.probes > 0 and s.probe_failures == 0, report
    assert s.peak_rss_mb < PEAK_RSS_MB, report
    assert s.probe_max_ms < FREEZE_S * 1000 and s.loop_max_lag_ms < FREEZE_S * 1000, report
    # Both kinds of answer came up: the campaign reaches past the validation.
    assert {200, 400}.issubset(s.statuses), report


def test_cases_are_rebuilt_from_seed_and_index() -> None:
    a, b = make_case(5, 17), make_case(5, 17)
    assert (a.path, a.body, a.headers, a.what) == (b.path, b.body, b.headers, b.what)
    assert len({make_case(5, i).body for i in range(40)}) > 30


def test_short_campaign() -> None:
    _check(run_with_server(seed=1, start=0, n=300))


@pytest.mark.slow
def test_long_campaign() -> None:
    _check(run_with_server(seed=2, start=0, n=10_000))
