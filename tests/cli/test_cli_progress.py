"""``colibri run``'s prefill progress line (issue 9, item 4): shown on a terminal for long
prompts (and, issue 38 item 2, for any prefill past a second), never in a pipe or a log,
and erased before the answer; the loading line of ``run`` and ``chat`` and ``chat``'s
prefill bar, on a terminal only."""

from __future__ import annotations

import io
import sys

import pytest

from colibri.cli import run as run_cli
from colibri.cli.chat import cmd_chat
from colibri.cli.parser import parse_args
from colibri.progress import DelayedBar
from support.bars import drawn_at_once
from support.realmodel import smollm2_gguf


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_only_on_a_terminal_for_long_prompts() -> None:
    tty = _Terminal()
    p = run_cli.PrefillProgress(tty, 4096)
    p(512, 4096)
    p(1024, 4096)
    assert "\rcolibri: prompt 512/4096 tokens (12%)" in tty.getvalue().replace("\x1b[K", "")
    assert "1024/4096 tokens (25%)" in tty.getvalue() and "s left" in tty.getvalue()
    p(4096, 4096)  # done: the line is erased
    assert tty.getvalue().endswith("\r\x1b[K")
    for stream, total in ((io.StringIO(), 4096), (_Terminal(), 100)):
        quiet = run_cli.PrefillProgress(stream, total)
        quiet(50, total)
        quiet(total, total)
        assert stream.getvalue() == ""


@pytest.mark.parametrize("terminal", [True, False])
def test_run_shows_prefill_progress(monkeypatch: pytest.MonkeyPatch, terminal: bool) -> None:
    monkeypatch.setattr(run_cli, "PROGRESS_MIN_TOKENS", 8)
    args = parse_args(["run", "--model", str(smollm2_gguf()), "--raw", "-n", "2", "-t", "2",
                       "--prefill-chunk", "4", "The quick brown fox jumps over the lazy dog "
                       "and keeps running"], "test")
    out, err = io.StringIO(), _Terminal() if terminal else io.StringIO()
    assert run_cli.cmd_run(args, io.StringIO(), out, err) == 0
    text = err.getvalue()
    if terminal:
        assert "\x1b[Kcolibri: prompt 4/" in text and "tokens (" in text
        assert text.split("\r\x1b[K")[-1].startswith("colibri: load")  # erased, then summary
    else:
        assert "colibri: prompt" not in text and "\r" not in text
    assert out.getvalue().strip()


# --- issue 38, item 2: loads and prefills longer than a second show progress on a terminal


def test_a_short_prompt_shows_the_line_once_its_prefill_runs_a_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tty = _Terminal()
    p = run_cli.PrefillProgress(tty, 100)
    p(50, 100)  # at once: nothing
    assert tty.getvalue() == ""
    monkeypatch.setattr(run_cli, "PROGRESS_DELAY", 0.0)  # as if a second had passed
    p = run_cli.PrefillProgress(tty, 100)
    p(60, 100)
    assert "colibri: prompt 60/100 tokens (60%)" in tty.getvalue()
    p(100, 100)
    assert tty.getvalue().endswith("\r\x1b[K")


def _run(monkeypatch: pytest.MonkeyPatch, *flags: str) -> tuple[str, list[DelayedBar]]:
    bars = drawn_at_once(monkeypatch)
    args = parse_args(["run", "--model", str(smollm2_gguf()), "-n", "2", "-t", "2", *flags,
                       "Hello there"], "test")
    out, err = io.StringIO(), _Terminal()
    assert run_cli.cmd_run(args, io.StringIO(), out, err) == 0
    assert out.getvalue().strip()
    return err.getvalue(), bars


def test_run_shows_a_loading_line_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", _Terminal())  # the library's own default stays off
    text, bars = _run(monkeypatch)
    assert len(bars) == 1 and f"colibri: loading {smollm2_gguf().name}" in text
    # Erased before the summary.
    assert text.split("\r")[-1].startswith("colibri: load")
    text, bars = _run(monkeypatch, "-q")  # --quiet: nothing on stderr, no bar at all
    assert text == "" and bars == []
    assert sys.stderr.getvalue() == ""  # type: ignore[attr-defined]


def test_chat_shows_a_prefill_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    bars = drawn_at_once(monkeypatch)
    args = parse_args(["chat", "--model", str(smollm2_gguf()), "-n", "2", "-t", "2"], "test")
    out, err = io.StringIO(), _Terminal()
    assert cmd_chat(args, io.StringIO("Hello there\n"), out, err) == 0
    assert [b.desc for b in bars] == [f"colibri: loading {smollm2_gguf().name}",
                                      "colibri: prompt"]
    assert "colibri: prompt" in err.getvalue() and all(not b.shown for b in bars)
    out, err = io.StringIO(), io.StringIO()  # stderr in a pipe: no bar
    assert cmd_chat(args, io.StringIO("Hello there\n"), out, err) == 0
    assert len(bars) == 2 and "colibri:" not in err.getvalue()
