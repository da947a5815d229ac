"""Progress of long steps.

:class:`Progress`: fetching a named model, building the demo MoE, converting; one rule for
every command. On a terminal a bar redrawn in place (``tqdm`` when it is installed);
anywhere else (a log file, a pipe, CI) plain lines at every 10 %, never ``\\r`` redraws.

:class:`DelayedBar`: a load or a prefill, which is usually quick. Its bar appears only once
the step has run :data:`PROGRESS_DELAY` seconds, so a fast one prints nothing; by default
("auto", :func:`interactive`) only in a Jupyter kernel (tqdm's notebook widget when
ipywidgets is installed, else its text bar) or when stderr is a terminal, never in a pipe,
a log, CI or a server.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

__all__ = ["PROGRESS_DELAY", "DelayedBar", "Progress", "delayed_bar", "in_notebook",
           "interactive"]

PROGRESS_DELAY = 1.0
"""Seconds a load or prefill runs before its bar appears (read when a bar is made)."""

_REDRAW_SECONDS = 0.5  # how often a shown bar is redrawn between updates (its clock ticks)


def _isatty(out: TextIO | None) -> bool:
    try:
        return bool(out is not None and out.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """Progress of one step on `out` (None: silent). ``update(done, total)`` with byte
    counts (``unit="B"``: shown in MiB, as every size colibri prints) or item counts
    (``unit=""``)."""

    def __init__(self, out: TextIO | None, label: str, unit: str = "B") -> None:
        self.out, self.label, self.unit = out, label, unit
        self.tty = _isatty(out)
        self.shown = -1  # last 10 % step written (lines mode)
        self._bar: Any = None
        self._closed = False

    def _amount(self, done: int, total: int) -> str:
        if self.unit == "B":
            return f"{done / 2**20:.1f}/{total / 2**20:.1f} MiB"
        return f"{done}/{total}"

    def update(self, done: int, total: int) -> None:
        if self.out is None or total <= 0 or self._closed:
            return
        done = min(done, total)
        if self.tty:
            self._draw(done, total)
        else:
            pct = done * 100 // total
            if pct // 10 > self.shown:
                self.shown = pct // 10
                self.out.write(f"{self.label}: {self._amount(done, total)} ({pct}%)\n")
                self.out.flush()
        if done >= total:
            self.close()

    def _draw(self, done: int, total: int) -> None:
        assert self.out is not None
        if self._bar is None:
            try:
                from tqdm import tqdm  # type: ignore[import-untyped]
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(
                    total=total, desc=self.label, file=self.out, leave=True,
                    # "iB" with divisor 1024 makes tqdm write KiB/MiB/GiB.
                    unit=("iB" if self.unit == "B" else self.unit) or "it",
                    unit_scale=bool(self.unit), unit_divisor=1024,
                    dynamic_ncols=True,
                )  # fmt: skip
            else:
                self._bar = False
        if self._bar:
            self._bar.update(done - self._bar.n)
            return
        pct = done * 100 // total
        self.out.write(f"\r{self.label}: {self._amount(done, total)} ({pct}%)")
        if done >= total:
            self.out.write("\n")
        self.out.flush()

    def close(self) -> None:
        if self._bar:
            self._bar.close()
        self._closed = True

    def note(self, text: str) -> None:
        """A line of its own (not a progress figure)."""
        if self.out is not None:
            self.out.write(text + "\n")
            self.out.flush()


def in_notebook() -> bool:
    """True in a Jupyter (IPython kernel) process: a notebook, JupyterLab, VS Code's or
    Colab's. The terminal IPython shell is not one (its stderr is a terminal)."""
    ipython = sys.modules.get("IPython")  # never imported here: only if the process has it
    get_ipython = getattr(ipython, "get_ipython", None)
    if get_ipython is None:
        return False
    try:
        shell = get_ipython()
        return shell is not None and ("IPKernelApp" in getattr(shell, "config", {})
                                      or type(shell).__name__ == "ZMQInteractiveShell")
    except Exception:  # a half-initialised or unusual shell: no notebook
        return False


def interactive(out: TextIO | None = None) -> bool:
    """Whether a bar is shown by default (``progress=None``, "auto"): when `out` is a
    terminal; for the default stream (`out` None: stderr) also in a Jupyter kernel."""
    if out is None:
        return in_notebook() or _isatty(sys.stderr)
    return _isatty(out)


def _bar_class(out: TextIO | None) -> Any:
    """tqdm's notebook widget in a Jupyter kernel with ipywidgets (for the default stream),
    else its text bar. Chosen here rather than by ``tqdm.auto``, which warns when
    ipywidgets is missing: the text bar works in a notebook too."""
    if out is None and in_notebook() and importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.notebook import tqdm as notebook_bar  # type: ignore[import-untyped]

        return notebook_bar
    from tqdm.std import tqdm as text_bar  # type: ignore[import-untyped]

    return text_bar


class DelayedBar:
    """The bar of one load or prefill, shown only once it has run `delay` seconds
    (default :data:`PROGRESS_DELAY`): :meth:`start` when the step begins, ``update(done,
    total)`` as it goes (the bar is a ``progress(done, total)`` callback too), :meth:`close`
    when it ends, however it ends (also a context manager). `total` None: no end known, the
    bar shows the time spent. `out`: where the text bar goes (None: stderr, or the notebook
    widget in Jupyter). The bar is erased when closed. A drawing failure (a closed stream)
    turns the bar off; it never stops the step. Thread-safe."""

    def __init__(self, desc: str, total: int | None = None, *, unit: str = "it",
                 out: TextIO | None = None, delay: float | None = None) -> None:
        self.desc, self.total, self.unit, self.out = desc, total, unit, out
        self.delay = PROGRESS_DELAY if delay is None else delay
        self.done = 0
        self._t0 = 0.0  # when the step started (time.time(), tqdm's clock)
        self._bar: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def shown(self) -> bool:
        """Whether the bar is on display now."""
        return self._bar is not None

    def start(self) -> DelayedBar:
        """Starts the clock; the bar appears after the delay unless closed first. A timer
        thread draws it, so it appears (and its clock ticks) while the step runs in native
        code, before the first update."""
        if self._thread is None and not self._stop.is_set():
            self._t0 = time.time()
            self._thread = threading.Thread(target=self._tick, name="colibri-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def _tick(self) -> None:
        if self._stop.wait(self.delay):
            return  # done before the delay: nothing is shown
        while True:
            with self._lock:
                if self._stop.is_set():
                    return
                self._guard(self._draw)
            if self._stop.wait(_REDRAW_SECONDS):
                return

    def _draw(self) -> None:
        if self._bar is None:
            kind = _bar_class(self.out)
            options: dict[str, Any] = {
                "desc": self.desc, "total": self.total, "initial": self.done, "unit": self.unit,
                "leave": False, "dynamic_ncols": True,
            }  # fmt: skip
            if self.total is None:
                options["bar_format"] = "{desc}: {elapsed}"
            if self.out is not None or kind.__module__ == "tqdm.std":
                options["file"] = out = self.out if self.out is not None else sys.stderr
                if _columns(out) == 0:  # a terminal that reports no width: tqdm would draw ""
                    options.update(ncols=80, nrows=24, dynamic_ncols=False)
            self._bar = kind(**options)
            self._bar.start_t = self._t0  # its clock counts from the step's start
        self._bar.refresh()

    def _guard(self, draw: Any) -> None:
        try:
            draw()
        except Exception:  # a closed or broken stream: no bar, the step goes on
            self._stop.set()
            self._bar = None

    def update(self, done: int, total: int | None = None) -> None:
        """`done` of `total` (None: as before) are finished; the bar closes at the end."""
        with self._lock:
            if total is not None:
                self.total = total
            self.done = done
            bar = self._bar
            if bar is not None:
                def draw() -> None:
                    if bar.total != self.total:
                        bar.total = self.total
                    bar.update(done - bar.n)

                self._guard(draw)
        if self.total is not None and done >= self.total:
            self.close()

    __call__ = update

    def close(self) -> None:
        """Ends the bar (erasing it if shown); idempotent."""
        self._stop.set()
        with self._lock:
            bar, self._bar = self._bar, None
            if bar is not None:
                try:
                    bar.close()
                except Exception:  # a closed stream: nothing to erase
                    pass

    def __enter__(self) -> DelayedBar:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _columns(out: TextIO) -> int | None:
    """The width of the terminal `out` writes to (None: not known)."""
    try:
        return os.get_terminal_size(out.fileno()).columns
    except (AttributeError, ValueError, OSError):  # no fileno, not a terminal, closed
        return None


def delayed_bar(progress: bool | None, desc: str, total: int | None = None, *,
                unit: str = "it", out: TextIO | None = None) -> DelayedBar | None:
    """The bar a ``progress`` option asks for: True always, False never, None ("auto")
    where :func:`interactive` (`out`) says so. Not started."""
    if progress is False or (progress is None and not interactive(out)):
        return None
    return DelayedBar(desc, total, unit=unit, out=out)
