"""``colibri run``'s prefill progress line (issue 9, item 4): shown on a terminal for long
prompts, never in a pipe or a log, and erased before the answer."""

from __future__ import annotations

import io

import pytest

from colibri.cli import run as run_cli
from colibri.cli.parser import parse_args
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
