"""The chat-template fuzzer (fuzz_chat_template.py) as tests: a short seeded campaign in the
default suite, the kept regression inputs, and the long campaign with ``-m slow`` (its
result is recorded in docs/reliability.md, "Chat templates")."""

from __future__ import annotations

import os

import pytest

from fuzz import fuzz_chat_template as fuzz


def _check(report: fuzz.Report) -> None:
    print("\n" + report.summary())
    print("rejections:", dict(report.reasons.most_common()))
    bad = [(f["outcome"], f["mutations"], f["error"]) for f in report.failures]
    assert report.failed == 0, bad[:5]
    assert report.peak_rejection_bytes < 1 << 30


def test_short_campaign() -> None:
    """200 mutants of the real templates: 0 crashes, hangs, foreign exceptions, escapes."""
    report = fuzz.run_campaign(200, seed=20250608)
    _check(report)
    assert report.mutants == 200
    assert report.outcomes["colibri_error"] > 50  # the mutators do reach the limits


def test_regression_inputs() -> None:
    """Inputs kept from the defect report and earlier campaigns: each is a clean rejection
    (or renders) in a child process."""
    sources = fuzz.regression_sources()
    assert len(sources) >= 5
    report = fuzz.run_sources(sources)
    _check(report)
    assert report.outcomes["colibri_error"] == len(sources)


@pytest.mark.slow
def test_long_campaign(request: pytest.FixtureRequest) -> None:
    if "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("the long campaign runs with -m slow")
    n = int(os.environ.get("COLIBRI_FUZZ_MUTANTS", "20000"))
    _check(fuzz.run_campaign(n, seed=1))
