"""Faults of the expert store: a blob whose crc32 does not match, an I/O error, a file cut
short under a loaded model, a disk slower than the compute. Each error raises
colibri.errors.ModelIOError naming the expert (or the file), never leaves a session
half-advanced (its token count and ids are unchanged), and once the fault is gone the same
model serves again, bit-identical to a clean one (docs/streaming.md, "Failures";
ExpertStore::abort). A slow disk changes nothing but time: the compute really waits on
reads in flight, and the logits stay bit-identical.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import colibri as co
from colibri.convert import write_container
from colibri.errors import ModelIOError
from colibri.settings.config import Checksums
from support.modelfactory import TinyModel
from support.streaming_helpers import (
    Trace,
    assert_same_trace,
    budget_for_slots,
    engine,
    prompt,
    run_trace,
)


@pytest.fixture(scope="module")
def container(tiny_models: dict[str, TinyModel],
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A native container of the tiny Qwen3-MoE (8 experts x 3 layers, top-2)."""
    dst = tmp_path_factory.mktemp("faults") / "qwen3.colibri"
    write_container(tiny_models["qwen3_moe"].hf_dir, dst)
    return dst


@pytest.fixture(scope="module")
def clean(container: Path) -> Trace:
    """The reference: every expert resident, read before any fault."""
    m = co.Model.load(container, engine=engine(workers=0, prefetch=False, preload=True))
    return run_trace(m, prompt())


def _copy(container: Path, dst: Path) -> Path:
    shutil.copytree(container, dst)
    return dst


def _blob(path: Path, layer: int, expert: int) -> dict[str, Any]:
    """The manifest.json record of one expert's blob in experts.bin."""
    doc = json.loads((path / "manifest.json").read_text())
    (rec,) = [r for r in doc["experts"] if (r["layer"], r["expert"]) == (layer, expert)]
    assert isinstance(rec, dict)
    return rec


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))


def _first_routed(container: Path, ids: list[int], layer: int) -> int:
    """An expert that `layer` routes the first prompt token to (the forward reads it)."""
    m = co.Model.load(container, engine=engine(workers=0))
    s = m.session()
    s.forward(ids)
    return int(s.last_routing()[0, layer, 0])


def _assert_failed_forward(s: co.Session, ids: list[int], match: str) -> ModelIOError:
    n, toks = s.n_tokens, s.token_ids
    with pytest.raises(ModelIOError, match=match) as exc:
        s.forward(ids)
    assert s.n_tokens == n and s.token_ids == toks  # not half-advanced
    return exc.value


# --- checksums ------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 4])
def test_checksum_mismatch_names_the_expert(container: Path, clean: Trace, tmp_path: Path,
                                            workers: int) -> None:
    path = _copy(container, tmp_path / "c")
    ids = prompt()
    layer = 1
    expert = _first_routed(path, ids, layer)
    rec = _blob(path, layer, expert)
    at = rec["offset"] + rec["gate"]["offset"] + 100  # a byte of the gate matrix
    _flip(path / "experts.bin", at)

    m = co.Model.load(path, engine=engine(workers=workers, checksums="first"))
    s = m.session()
    err = _assert_failed_forward(s, ids, f"layer {layer} expert {expert}\\b")
    assert "checksum" in str(err).lower() or "crc" in str(err).lower(), str(err)
    assert s.n_tokens == 0
    ex = m.stats().experts
    assert ex.checksum_failures >= 1 and ex.read_errors >= 1

    # Repaired on disk: the same model and session serve again, bit-identical.
    _flip(path / "experts.bin", at)
    assert_same_trace(run_trace(m, ids, clean.decode_ids), clean)
    got = s.forward(ids, all_logits=True)
    assert np.array_equal(got, clean.prefill)
    assert s.n_tokens == len(ids)


def test_checksums_off_reads_the_damaged_blob(container: Path, tmp_path: Path) -> None:
    path = _copy(container, tmp_path / "c")
    ids = prompt()
    expert = _first_routed(path, ids, 0)
    rec = _blob(path, 0, expert)
    _flip(path / "experts.bin", rec["offset"] + rec["up"]["offset"] + 7)
    m = co.Model.load(path, engine=engine(checksums="off"))
    logits = m.session().forward(ids)
    assert np.all(np.isfinite(logits))
    ex = m.stats().experts
    assert ex.checksum_failures == 0 and ex.read_errors == 0 and ex.misses > 0


def test_checksums_catch_a_file_changed_after_the_first_read(container: Path, clean: Trace,
                                                             tmp_path: Path) -> None:
    """A blob damaged after its first verified read: "always" re-verifies every read;
    "first" sees that the file changed (its size/inode/mtime/ctime stamp) and verifies
    every blob again (issue 8, defect 6: it used to serve the damaged blob); "off" never
    checks."""
    path = _copy(container, tmp_path / "c")
    ids = prompt()
    expert = _first_routed(path, ids, 2)
    rec = _blob(path, 2, expert)
    at = rec["offset"] + rec["down"]["offset"] + 3
    top_k = 2
    budget = budget_for_slots(path, top_k)  # every expert is read again by the next prompt
    modes: tuple[tuple[Checksums, bool], ...] = (("always", True), ("first", True),
                                                 ("off", False))
    for mode, fails in modes:
        m = co.Model.load(path, engine=engine(budget=budget, checksums=mode))
        got = m.session().forward(ids, all_logits=True)  # clean: verified once
        assert np.array_equal(got, clean.prefill)
        _flip(path / "experts.bin", at)
        try:
            s = m.session()
            if fails:
                _assert_failed_forward(s, ids, f"layer 2 expert {expert}\\b")
                assert m.stats().experts.checksum_failures >= 1
            else:  # "off": the damaged blob is served
                s.forward(ids)
                assert m.stats().experts.checksum_failures == 0
        finally:
            _flip(path / "experts.bin", at)


# --- I/O errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(("workers", "prefetch"), [(0, False), (1, True), (4, True)])
def test_eio_then_recovery_mid_session(container: Path, clean: Trace, workers: int,
                                       prefetch: bool) -> None:
    budget = budget_for_slots(container, 2)  # top-k: every decode step reads experts
    m = co.Model.load(container, engine=engine(budget=budget, workers=workers,
                                               prefetch=prefetch))
    ids = prompt()
    s = m.session()
    assert np.array_equal(s.forward(ids, all_logits=True), clean.prefill)
    steps = clean.decode_ids
    assert np.array_equal(s.forward([steps[0]]), clean.decode[0])

    m.set_io_fault("eio")
    err = _assert_failed_forward(s, [steps[1]], r"layer \d+ expert \d+")
    assert "experts.bin" in str(err), str(err)
    assert m.stats().experts.read_errors >= 1
    err = _assert_failed_forward(m.session(), ids, r"layer \d+ expert \d+")  # a new session too

    m.set_io_fault("none")
    for i in range(1, len(steps)):  # the session goes on where it was
        assert np.array_equal(s.forward([steps[i]]), clean.decode[i]), i
    assert s.n_tokens == len(ids) + len(steps)
    assert_same_trace(run_trace(m, ids, steps), clean)


def test_failing_direct_reads_fall_back(container: Path, clean: Trace) -> None:
    budget = budget_for_slots(container, 3)
    m = co.Model.load(container, engine=engine(budget=budget, direct=True))
    m.set_io_fault("einval_direct_read")
    try:
        assert_same_trace(run_trace(m, prompt(), clean.decode_ids), clean)
    finally:
        m.set_io_fault("none")
    ex = m.stats().experts
    assert ex.read_errors == 0 and ex.misses > 0


# --- a disk slower than the compute -----------------------------------------------------------


@pytest.mark.parametrize(("workers", "threads"), [(1, 1), (4, 2)])
def test_slow_reads_are_waited_for_and_change_nothing(container: Path, clean: Trace,
                                                      workers: int, threads: int) -> None:
    """Every read sleeps 3 ms first (IoFault::SlowRead), so the lookahead's prefetches are
    still reading when the compute reaches their layer: the compute must wait on those
    in-flight reads (hits that were not ready: hits > ready_hits), never use a slot before
    its bytes are in, and give the resident run's logits bit for bit. With microsecond
    reads (the other tests) a prefetch is nearly always done before it is wanted, so a
    missing wait would go unseen there."""
    slots = 6  # top-2 plus room for the lookahead's reads
    m = co.Model.load(container, engine=engine(budget=budget_for_slots(container, slots,
                                                                       threads=threads),
                                               workers=workers, prefetch=True, threads=threads))
    m.set_io_fault("slow_read")
    try:
        got = run_trace(m, prompt(), clean.decode_ids)
    finally:
        m.set_io_fault("none")
    assert_same_trace(got, clean)
    ex = m.stats().experts
    assert ex.prefetch_issued > 0 and ex.misses > 0 and ex.read_errors == 0
    in_flight = ex.hits - ex.ready_hits
    assert in_flight > 0, f"no hit waited on a read in flight: {ex}"
    assert in_flight <= ex.prefetch_used  # only a prefetch can be in flight when wanted
    assert ex.stall_seconds > 0


# --- files cut short under a loaded model ---------------------------------------------------


def _truncate_and_restore(file: Path, m: co.Model, clean: Trace, cut: int) -> None:
    data = file.read_bytes()
    ids = prompt()
    s = m.session()
    assert np.array_equal(s.forward(ids, all_logits=True), clean.prefill)
    os.truncate(file, cut)
    try:
        err = _assert_failed_forward(s, [clean.decode_ids[0]], "short read")
        assert str(file) in str(err) or file.name in str(err), str(err)
        assert m.stats().experts.read_errors >= 1
    finally:
        with open(file, "r+b") as f:  # the same inode: the model's open files see it again
            f.write(data)
    for i, tok in enumerate(clean.decode_ids):
        assert np.array_equal(s.forward([tok]), clean.decode[i]), i


@pytest.mark.parametrize("direct", [True, False])
def test_truncated_container(container: Path, clean: Trace, tmp_path: Path,
                             direct: bool) -> None:
    path = _copy(container, tmp_path / "c")
    budget = budget_for_slots(path, 2)
    m = co.Model.load(path, engine=engine(budget=budget, direct=direct))
    _truncate_and_restore(path / "experts.bin", m, clean, 0)


def test_truncated_gguf(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    src = tiny_models["mixtral"].gguf["Q8_0"]
    path = tmp_path / src.name
    shutil.copyfile(src, path)
    resident = co.Model.load(path, engine=engine(workers=0, prefetch=False, preload=True))
    clean = run_trace(resident, prompt())
    m = co.Model.load(path, engine=engine(budget=budget_for_slots(path, 2)))
    first = min(t.extents[0].offset for t in m.manifest.tensors.values()
                if "_exps" in t.name)
    # Cut inside the expert data: dense weights are in RAM already, expert reads come short.
    _truncate_and_restore(path, m, clean, first + 1)


@pytest.mark.parametrize("prefetch", [True, False])
def test_checksum_failure_in_decode_then_repair(container: Path, clean: Trace, tmp_path: Path,
                                                prefetch: bool) -> None:
    """A blob damaged between two decode steps (checksums="always"): the step that routes
    to it fails, whether a lookahead read it first (that read's failure is dropped) or the
    compute needs it; the session then goes on once the file is repaired."""
    path = _copy(container, tmp_path / "c")
    ids, steps = prompt(), clean.decode_ids
    probe = co.Model.load(path, engine=engine(workers=0))
    ps = probe.session()
    ps.forward(ids)
    assert len(set(ps.last_routing()[:, 2, :].reshape(-1).tolist())) >= 4
    ps.forward([steps[0]])
    expert = int(ps.last_routing()[0, 1, 0])  # layer 1's first choice at decode step 0
    rec = _blob(path, 1, expert)
    at = rec["offset"] + rec["gate"]["offset"] + 11

    # 4 slots, LRU: after the prefill the cache holds only layer 2's experts.
    m = co.Model.load(path, engine=engine(budget=budget_for_slots(path, 4), workers=4,
                                          prefetch=prefetch, policy="lru", checksums="always"))
    s = m.session()
    assert np.array_equal(s.forward(ids, all_logits=True), clean.prefill)
    _flip(path / "experts.bin", at)
    try:
        _assert_failed_forward(s, [steps[0]], f"layer 1 expert {expert}: checksum mismatch")
        assert m.stats().experts.checksum_failures >= 1
    finally:
        _flip(path / "experts.bin", at)
    for i, tok in enumerate(steps):
        assert np.array_equal(s.forward([tok]), clean.decode[i]), i
