"""Replays one saved crasher (a regressions/ directory holding MUTANT.json) and prints its
outcome as one JSON line: ``python -m fuzz.replay CASE WORK`` (run from tests/).

The harness forks a child per input. A fork copies only the calling thread, so it must be
made from a process that has started no threads: a pytest process that has run other tests
holds thread pools (the core's, asyncio's) whose workers the child would wait for forever.
This entry point imports colibri and forks before anything starts a thread, as the
campaign's workers do.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

from . import harness
from .formats import FORMATS


def replay(case: Path, work: Path) -> harness.Outcome:
    meta = json.loads((case / "MUTANT.json").read_text())
    model_dir = work / "m"
    shutil.copytree(case, model_dir, symlinks=True, ignore=shutil.ignore_patterns("MUTANT.json"))
    entry = model_dir if meta["entry"] == "." else model_dir / meta["entry"]
    return harness.run_in_child(FORMATS[meta["format"]].action, (entry, meta["i"]),
                                timeout=60.0, mem_cap=harness.vm_size_bytes() + 2**31)  # fmt: skip


if __name__ == "__main__":
    import colibri  # noqa: F401 - imported once, before the fork

    out = replay(Path(sys.argv[1]), Path(sys.argv[2]))
    print(json.dumps(dataclasses.asdict(out)))
