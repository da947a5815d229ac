"""Helpers for the tests of hostile model files (test_untrusted_*.py): edited copies of the
tiny models, and a bounded run (child process, memory cap, timeout) for inputs that used
to hang or allocate without bound."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fuzz import gguf_codec as G
from fuzz import harness


def edit_gguf(src: Path, dst: Path, edit: Callable[[G.GGUFDoc], None]) -> Path:
    doc = G.parse(src.read_bytes())
    edit(doc)
    dst.write_bytes(G.serialize(doc)[0])
    return dst


def kv(doc: G.GGUFDoc, key: str) -> G.KV:
    found = next((k for k in doc.kvs if k.key == key), None)
    if found is None:
        found = G.KV(key, G.U32, 0)
        doc.kvs.append(found)
    return found


def set_kv(doc: G.GGUFDoc, key: str, value: Any, vtype: int | None = None) -> None:
    k = kv(doc, key)
    if vtype is None:
        vtype = (G.STRING if isinstance(value, str) else G.F32 if isinstance(value, float)
                 else G.BOOL if isinstance(value, bool) else G.ARRAY if isinstance(value, list)
                 else G.U32 if 0 <= value < 2**32 else G.U64)  # fmt: skip
    k.vtype, k.value, k.raw = vtype, value, None
    if vtype == G.ARRAY:
        k.etype = G.U32


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_json(path: Path, edit: Callable[[Any], Any]) -> None:
    """Edits the parsed document in place (what ``edit`` returns is ignored)."""
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, allow_nan=True))


def bounded(fn: Callable[[], Any], timeout: float = 60.0) -> harness.Outcome:
    """fn() in a forked child with 2 GiB more address space than now and a timeout: an
    unbounded loop or allocation shows up as a timeout or a MemoryError, not a stuck run."""

    def action() -> None:
        fn()

    return harness.run_in_child(action, (), timeout=timeout,
                                mem_cap=harness.vm_size_bytes() + 2 * 2**30)  # fmt: skip
