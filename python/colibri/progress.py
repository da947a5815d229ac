"""Progress of long steps (fetching a named model, building the demo MoE, converting):
one rule for every command. On a terminal a bar redrawn in place (``tqdm`` when it is
installed); anywhere else (a log file, a pipe, CI) plain lines at every 10 %, never ``\\r``
redraws."""

from __future__ import annotations

from typing import Any, TextIO

__all__ = ["Progress"]


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
