"""Shared fixtures (the tiny per-family test models, see modelfactory.py) and the skip policy.

``tiny_models`` builds (or reuses from build/test-models/) one checkpoint and four GGUF
files per family, once per test session; ``tiny_model`` is the same, parametrized over the
families. Reference outputs from transformers come from ``modelfactory.transformers_model``
(cached per process). ``deepseek_models`` / ``deepseek_model`` are the DeepSeek/GLM-family
variants of deepseek_factory.py.

Skips: a test that skips is a test that did not run, and a suite that exits 0 with oracles
silently skipped proves nothing. Every skip must match an entry of ``ALLOWED_SKIPS`` (the
test's name and the start of its reason), each with why it is allowed; any other skip,
including one at collection (a module-level ``importorskip``), is turned into a failure
that names the reason. External data is fetched by scripts/fetch_test_data.py before the
run (scripts/test.sh), so nothing here depends on the network; a targeted run without it
stops at the first test that needs it, naming the command (support/fetched_data.py).
llama-cpp-python (the version pyproject's bench extra pins) is installed by scripts/test.sh
too: a test that needs it and does not find it fails, as no llama.cpp reason is on the list.

The terminal summary ends with the kernel ISAs the run exercised (support/isa_report.py).
"""

from __future__ import annotations

import fnmatch
import signal
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import pytest

from support.deepseek_factory import VARIANTS as DEEPSEEK_VARIANTS
from support.deepseek_factory import TinyDeepseek, build_tiny
from support.fetched_data import MissingTestData
from support.isa_report import IsaTally
from support.modelfactory import FAMILIES, TinyModel, build_tiny_model
from support.smollm2_reference import reference  # noqa: F401 (a fixture: transformers on SmolLM2)

# A shell starts a background job with SIGINT ignored, and Python then installs no
# KeyboardInterrupt handler (children inherit the ignore too): the Ctrl-C tests would fail
# for how the suite was launched. Give the run Python's usual handler back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@dataclass(frozen=True)
class AllowedSkip:
    test: str  # fnmatch pattern over the test's node id
    reason: str  # the skip reason starts with this
    why: str  # why skipping there is right


ALLOWED_SKIPS = (
    AllowedSkip(
        "tests/oracle/test_iquants_real.py::*", "for the ",
        "The fixture is parametrized over a llama.cpp-written and a colibri-written file; "
        "a check that applies to one writer skips the other parameter."),
    AllowedSkip(
        "tests/engine/test_wait_policy_decode.py::test_spin_uses_more_cpu_*", "machine busy:",
        "A CPU-time ratio between wait policies needs the cores to itself: with other "
        "processes on them (measured from /proc/stat) spin cannot burn more than its share. "
        "The policy itself is checked on every run by counters that load cannot change "
        "(test_wait_policy_decode.py::test_policies_sleep_as_they_should, test_threadpool.py)."),
    AllowedSkip(
        "tests/engine/test_wait_policy_decode.py::test_spin_uses_more_cpu_*",
        "machine oversubscribed",
        "More runnable threads than cores: the pool's starvation guard turns spinning waits "
        "into sleeps (docs/tuning.md), so the policies cannot differ in CPU time; the counter "
        "test above checks that guard's contract."),
    AllowedSkip(
        "tests/kernels/test_threadpool.py::test_*", "machine oversubscribed:",
        "Same as above for the pool-level CPU ratios: when most spinning computations lost "
        "their cores (counted by the pool), the figures measure the scheduler. The sleep "
        "counters in the same tests are asserted before the ratio."),
    AllowedSkip(
        "tests/server/test_serve_ray.py::*", "Ray Serve is not installed",
        "Ray is the optional ray extra (colibri[ray], a large install), not a test "
        "dependency; these slow tests run where it is installed (docs/testing.md). The "
        "server the replicas run is tested on every run by tests/server/test_server_*.py."),
    AllowedSkip(
        "tests/engine/test_expert_cluster_ray.py::*", "Ray is not installed",
        "Ray is the optional ray extra (colibri[ray]), not a test dependency; these slow tests "
        "run where it is installed (docs/testing.md). The seam and the coordinator they use "
        "are tested on every run without Ray by tests/engine/test_expert_cluster.py."),
    AllowedSkip(
        "tests/bench_tools/test_bench_helpers.py::test_disk_bandwidth_small_file",
        "O_DIRECT not supported",
        "The temporary directory is on a file system that refuses O_DIRECT (tmpfs); the "
        "core's own O_DIRECT fallback is tested in test_io.py."),
)


_ISA_TALLY = IsaTally()


def allowed(nodeid: str, reason: str) -> AllowedSkip | None:
    for a in ALLOWED_SKIPS:
        if fnmatch.fnmatch(nodeid, a.test) and reason.startswith(a.reason):
            return a
    return None


def _reason(longrepr: object) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    rep: pytest.TestReport = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(MissingTestData):
        # One clear stop instead of every test of the module failing alike.
        item.session.shouldstop = f"test data missing: {call.excinfo.value}"
        rep.longrepr = str(call.excinfo.value)
    if rep.skipped and not hasattr(rep, "wasxfail"):
        reason = _reason(rep.longrepr)
        if allowed(rep.nodeid, reason) is None:
            rep.outcome = "failed"
            rep.longrepr = (f"unexpected skip ({reason}); skips must be on the allow-list in "
                            "tests/conftest.py (ALLOWED_SKIPS)")
    _ISA_TALLY.record(item, rep)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which kernel ISAs this run's kernel tests ran on (a host without AVX-512 VNNI runs
    fewer: docs/testing.md)."""
    terminalreporter.section("kernel ISAs exercised")
    try:
        from colibri import _core
    except ImportError as e:  # the run's own errors say more
        terminalreporter.write_line(f"  colibri._core did not import: {e}")
        return
    for line in _ISA_TALLY.lines(_core.quant.available_isas(), _core.quant.isa_names()):
        terminalreporter.write_line(line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run only when ``-m`` names them (``-m slow``); otherwise they
    are deselected, which is counted and shown, not a skip."""
    if "slow" in (config.getoption("-m") or ""):
        return
    slow = [i for i in items if i.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i.get_closest_marker("slow") is None]


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, object, None]:
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.skipped:
        rep.outcome = "failed"
        rep.longrepr = (f"unexpected skip of {rep.nodeid} at collection "
                        f"({_reason(rep.longrepr)}); see ALLOWED_SKIPS in tests/conftest.py")


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Points $XDG_CACHE_HOME at a temporary directory for the whole run (subprocesses
    inherit it), so no test writes routing histories or named models into the user's
    ~/.cache/colibri. Session-scoped and autouse: it is in place before any module-scoped
    fixture loads a model (a model's history path is fixed when it loads)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, TinyModel]:
    """family -> TinyModel (hf_dir, gguf["F32" | "Q8_0" | "Q4_0" | "Q4_1"]), built once."""
    return {family: build_tiny_model(family) for family in FAMILIES}


@pytest.fixture(scope="session", params=FAMILIES)
def tiny_model(request: pytest.FixtureRequest, tiny_models: dict[str, TinyModel]) -> TinyModel:
    """One family's TinyModel; tests using it run once per family."""
    return tiny_models[request.param]


@pytest.fixture(scope="session")
def deepseek_models() -> dict[str, TinyDeepseek]:
    """variant -> TinyDeepseek (the checkpoint; GGUF tests convert it themselves)."""
    return {v: build_tiny(v, with_gguf=False) for v in DEEPSEEK_VARIANTS}


@pytest.fixture(scope="session", params=DEEPSEEK_VARIANTS)
def deepseek_model(request: pytest.FixtureRequest,
                   deepseek_models: dict[str, TinyDeepseek]) -> TinyDeepseek:
    """One DeepSeek/GLM-family variant (deepseek_factory.VARIANTS)."""
    return deepseek_models[request.param]


@pytest.fixture(scope="session")
def smollm2_server() -> Iterator[object]:
    """``colibri serve`` on the SmolLM2 GGUF in a subprocess (server_helpers.ServerProcess),
    shared by the tests/server/test_server_*.py modules: served as "smollm2", API key
    SERVER_KEY, a 512-token context, three queue places."""
    from support.realmodel import smollm2_gguf
    from support.server_helpers import SERVER_CTX, SERVER_KEY, ServerProcess

    s = ServerProcess(smollm2_gguf(), "-c", str(SERVER_CTX), "--api-key", SERVER_KEY,
                      "--max-queue", "3", "--served-model-name", "smollm2", "-q")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="session")
def smollm2_oracle() -> Iterator[object]:
    """The same GGUF loaded in this process with the server's context: the oracle."""
    import colibri as co
    from support.realmodel import smollm2_gguf
    from support.server_helpers import SERVER_CTX

    with co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=SERVER_CTX)) as m:
        yield m
