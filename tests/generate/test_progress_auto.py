"""Progress of loads and prefills by default (issue 38, item 2): a bar only where someone
watches (stderr a terminal, or a Jupyter kernel), only once the step has run a second,
never in a pipe, a log or a server; ``progress=False`` turns it off, True forces it."""

from __future__ import annotations

import io
import sys
import time
import types
import warnings
from collections.abc import Iterator

import pytest

import colibri as co
from colibri import progress
from colibri.errors import InvalidRequestError
from support.bars import Terminal, drawn_at_once
from support.realmodel import smollm2_gguf


@pytest.fixture(scope="module")
def model() -> Iterator[co.Model]:
    with co.Model.load(smollm2_gguf(), progress=False, engine=co.EngineConfig(
            threads=co.ThreadConfig(n=2), context_length=256, prefill_chunk=8)) as m:
        yield m


def _notebook(monkeypatch: pytest.MonkeyPatch, shell: object) -> None:
    """A process whose IPython module's get_ipython() returns `shell`."""
    monkeypatch.setitem(sys.modules, "IPython",
                        types.SimpleNamespace(get_ipython=lambda: shell))


# --- the "auto" decision ------------------------------------------------------------------


def test_auto_is_a_terminal_or_a_jupyter_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert progress.interactive()
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a pipe, a log, CI
    assert not progress.interactive() and not progress.in_notebook()
    # A Jupyter kernel (its stderr is no terminal): the kernel app is in the shell's config.
    _notebook(monkeypatch, types.SimpleNamespace(config={"IPKernelApp": {}}))
    assert progress.in_notebook() and progress.interactive()
    # The terminal IPython shell is not a notebook (its stderr is a terminal anyway).
    _notebook(monkeypatch, types.SimpleNamespace(config={}))
    assert not progress.in_notebook() and not progress.interactive()
    _notebook(monkeypatch, None)  # IPython imported, no shell running
    assert not progress.in_notebook()
    # A stream given explicitly (the CLI's stderr) is judged by itself alone.
    _notebook(monkeypatch, types.SimpleNamespace(config={"IPKernelApp": {}}))
    assert not progress.interactive(io.StringIO()) and progress.interactive(Terminal())


def test_the_option_picks_the_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert progress.delayed_bar(None, "x") is None  # auto, in a pipe: none
    assert progress.delayed_bar(True, "x") is not None  # forced
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert progress.delayed_bar(None, "x") is not None
    assert progress.delayed_bar(False, "x") is None


def test_a_notebook_without_ipywidgets_gets_the_text_bar_and_no_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """tqdm.auto would warn ("IProgress not found") and fall back; colibri picks the text
    bar itself, silently, and it draws on stderr as in a terminal."""
    _notebook(monkeypatch, types.SimpleNamespace(config={"IPKernelApp": {}}))
    real_find_spec = progress.importlib.util.find_spec
    monkeypatch.setattr(progress.importlib.util, "find_spec",
                        lambda name, *a: None if name == "ipywidgets" else real_find_spec(name, *a))
    err = io.StringIO()  # a kernel's stderr is no terminal
    monkeypatch.setattr(sys, "stderr", err)
    drawn_at_once(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert progress._bar_class(None).__module__ == "tqdm.std"
        bar = progress.delayed_bar(None, "colibri: loading x")
        assert bar is not None
        with bar:
            assert bar.shown
    assert "colibri: loading x" in err.getvalue()
    # With ipywidgets, tqdm's notebook widget (for the default stream only).
    monkeypatch.setattr(progress.importlib.util, "find_spec", lambda name, *a: object())
    assert progress._bar_class(None).__module__ == "tqdm.notebook"
    assert progress._bar_class(Terminal()).__module__ == "tqdm.std"


# --- the delay ------------------------------------------------------------------------------


def test_a_fast_step_prints_nothing_and_a_slow_one_shows_its_bar() -> None:
    out = Terminal()
    with progress.DelayedBar("prefill", 100, unit="tok", out=out, delay=0.5) as bar:
        bar(50, 100)
        bar(100, 100)  # done before the delay
    assert out.getvalue() == "" and not bar.shown

    out = Terminal()
    bar = progress.DelayedBar("prefill", 100, unit="tok", out=out, delay=0.05).start()
    deadline = time.monotonic() + 30
    while not bar.shown and time.monotonic() < deadline:  # the timer draws it, no update needed
        time.sleep(0.01)
    try:
        assert bar.shown and "prefill" in out.getvalue() and "0/100" in out.getvalue()
        time.sleep(0.15)  # tqdm redraws an update at most every 0.1 s
        bar(40, 100)
        assert "40/100" in out.getvalue()
    finally:
        bar(100, 100)  # done: closed and erased
    assert not bar.shown
    assert out.getvalue().endswith("\r")


def test_a_bar_with_no_total_shows_the_time_and_never_breaks_the_step() -> None:
    out = Terminal()
    with progress.DelayedBar("colibri: loading m", out=out, delay=0.0) as bar:
        deadline = time.monotonic() + 30
        while not bar.shown and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "colibri: loading m: 00:0" in out.getvalue()
    closed = Terminal()
    closed.close()  # a stream that fails: the bar turns itself off
    with progress.DelayedBar("x", 10, out=closed, delay=0.0) as bar:
        time.sleep(0.05)
        bar(5, 10)
    assert not bar.shown


# --- the calls ------------------------------------------------------------------------------


PROMPT = "The quick brown fox jumps over the lazy dog. " * 8


def test_generate_shows_a_prefill_bar_on_a_terminal(model: co.Model,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    bars = drawn_at_once(monkeypatch)
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    g = model.generate(PROMPT, max_tokens=2)
    assert len(bars) == 1 and bars[0].done == len(g.prompt_ids) and not bars[0].shown
    assert "prefill" in err.getvalue() and "tok" in err.getvalue()
    assert err.getvalue().endswith("\r")  # erased once the prefill is over
    text = "".join(c.text for c in model.stream(PROMPT, max_tokens=2))
    assert len(bars) == 2 and not bars[1].shown and text == g.text
    s = model.session()
    s.generate(model.encode_prompt(PROMPT), max_tokens=2)  # a session's too
    assert len(bars) == 3
    s.forward([1, 2, 3])  # the low-level call shows nothing unless asked
    assert len(bars) == 3
    s.forward([4, 5, 6], progress=True)
    assert len(bars) == 4
    for off in (False, print):  # off, or the caller's own callback instead
        model.generate(PROMPT, max_tokens=1, progress=off)
    assert len(bars) == 4


def test_nothing_is_shown_in_a_pipe_unless_forced(model: co.Model,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    bars = drawn_at_once(monkeypatch)
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    model.generate(PROMPT, max_tokens=1)
    list(model.stream(PROMPT, max_tokens=1))
    model.session().generate(model.encode_prompt(PROMPT), max_tokens=1)
    assert bars == [] and err.getvalue() == ""
    model.generate(PROMPT, max_tokens=1, progress=True)
    assert len(bars) == 1 and "prefill" in err.getvalue()
    with pytest.raises(InvalidRequestError, match="progress must be a callable"):
        model.generate(PROMPT, max_tokens=1, progress=3)  # type: ignore[arg-type]


def test_a_stream_closed_early_or_interrupted_closes_its_bar(
        model: co.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    bars = drawn_at_once(monkeypatch)
    monkeypatch.setattr(sys, "stderr", Terminal())
    stream = model.stream(PROMPT, max_tokens=8)
    assert bars == []  # the clock starts with the prefill, not when the stream is made
    next(stream)
    stream.close()
    assert len(bars) == 1 and bars[0]._stop.is_set()


def test_load_shows_a_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    bars = drawn_at_once(monkeypatch)
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    engine = co.EngineConfig(context_length=64)
    co.Model.load(smollm2_gguf(), engine=engine).close()
    assert len(bars) == 1 and f"colibri: loading {smollm2_gguf().name}" in err.getvalue()
    co.Model.load(smollm2_gguf(), engine=engine, progress=False).close()
    assert len(bars) == 1
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    co.Model.load(smollm2_gguf(), engine=engine).close()
    assert len(bars) == 1


def test_a_server_prints_no_bar(model: co.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even in a Jupyter kernel with a terminal: requests go through the runner, which
    never makes a bar."""
    from fastapi.testclient import TestClient

    from colibri.server import create_app

    _notebook(monkeypatch, types.SimpleNamespace(config={"IPKernelApp": {}}))
    err = Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    bars = drawn_at_once(monkeypatch)
    app = create_app(model, model_name="m", max_running=2)
    with TestClient(app) as client:
        for path, body in (("/v1/completions", {"prompt": PROMPT}),
                           ("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": PROMPT}]})):
            r = client.post(path, json={"model": "m", "max_tokens": 2, **body})
            assert r.status_code == 200, r.text
    assert bars == [] and "prefill" not in err.getvalue()


def test_a_terminal_that_reports_no_width_still_gets_a_bar() -> None:
    """A pseudo-terminal nobody sized (0 x 0, as under `script` or some CI runners): tqdm
    alone would draw an empty string there."""
    import os
    import select

    master, slave = os.openpty()
    with os.fdopen(slave, "w") as out, os.fdopen(master, "rb", buffering=0) as screen:
        assert os.get_terminal_size(slave).columns == 0
        with progress.DelayedBar("prefill", 10, unit="tok", out=out, delay=0.0) as bar:
            deadline = time.monotonic() + 30
            while not bar.shown and time.monotonic() < deadline:
                time.sleep(0.01)
            out.flush()
            ready, _, _ = select.select([screen], [], [], 5.0)  # never blocks on no output
            assert ready and b"prefill:   0%" in screen.read(4096)
