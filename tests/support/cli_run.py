"""The colibri command run as a user runs it (``python -m colibri`` in a subprocess, with
the package under test on its path), and the one-line error every failure must be."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import colibri

PYTHONPATH = os.pathsep.join(str(Path(p).parent) for p in colibri.__path__)
TIMEOUT = 240


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHONPATH
    env.update(extra)
    return env


def colibri_cli(
    *args: str, input: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "colibri", *args],
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        env=env or _env(),
        timeout=TIMEOUT,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("colibri: error: "), lines[0]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
