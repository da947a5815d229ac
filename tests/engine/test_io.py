"""The expert read path (colibri._core.io): O_DIRECT reads into aligned slabs with a
buffered fallback, and the I/O worker pool (submit / wait / cancel).

Every read is checked byte for byte against a plain Python file read. Faults are real
where the OS lets a test make them (a file truncated after the pool opened it) and use the
pool's fault hook otherwise (EINVAL from O_DIRECT, EIO).
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from colibri import _core as core
from colibri.errors import InvalidRequestError, ModelIOError

cio: Any = core.io

ALIGN = 4096


def _write(path: Path, size: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return data


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[bytes]]:
    d = tmp_path_factory.mktemp("io")
    # Odd sizes so the last block of each file is partial (an O_DIRECT read there is short).
    sizes = [3 * 1024 * 1024 + 1234, 200_001]
    paths, datas = [], []
    for i, size in enumerate(sizes):
        p = d / f"f{i}.bin"
        datas.append(_write(p, size, seed=i))
        paths.append(str(p))
    return paths, datas


def _extents(datas: list[bytes], n: int, seed: int) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    out: list[tuple[int, int, int]] = []
    for f, data in enumerate(datas):
        size = len(data)
        # Edge cases: empty, one byte, aligned, a full block, up to the very end of the file.
        out += [(f, 0, 0), (f, 0, 1), (f, ALIGN, ALIGN), (f, ALIGN - 1, 2), (f, size - 1, 1)]
        out += [(f, size - 5000, 5000), (f, 0, size)]
    while len(out) < n:
        f = rng.randrange(len(datas))
        size = len(datas[f])
        off = rng.randrange(size)
        length = rng.randrange(min(size - off, 300_000) + 1)
        out.append((f, off, length))
    return out


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("workers", [0, 1, 4])
def test_random_extents_match_python_reads(
    files: tuple[list[str], list[bytes]], workers: int, direct: bool
) -> None:
    paths, datas = files
    extents = _extents(datas, 150, seed=workers * 2 + direct)
    with cio.ReadPool(paths, workers=workers, direct=direct) as pool:
        assert pool.workers == workers
        assert pool.direct == direct
        # Many tickets outstanding at once, waited for in an order unrelated to submission.
        tickets = [(pool.submit(f, o, n), f, o, n) for f, o, n in extents]
        assert pool.pending() == len(tickets)
        random.Random(7).shuffle(tickets)
        for t, f, o, n in tickets:
            got = pool.wait(t)
            assert got.dtype.name == "uint8" and got.shape == (n,)
            assert got.tobytes() == datas[f][o : o + n], (f, o, n)
        assert pool.pending() == 0
        s = pool.stats()
    assert s["submitted"] == s["reads"] == s["waits"] == len(extents)
    assert s["errors"] == s["cancelled"] == s["fallbacks"] == 0
    assert s["bytes"] == sum(n for _, _, n in extents)
    if direct:
        assert s["direct_reads"] == len(extents) and s["buffered_reads"] == 0
    else:
        assert s["buffered_reads"] == len(extents) and s["direct_reads"] == 0
    if workers == 0:
        assert s["inline_reads"] == len(extents)


def test_workers_do_the_reads_and_waiters_in_threads(files: tuple[list[str], list[bytes]]) -> None:
    paths, datas = files
    extents = _extents(datas, 200, seed=11)
    with cio.ReadPool(paths, workers=4, direct=True) as pool:
        tickets = [pool.submit(f, o, n) for f, o, n in extents]
        # Let the workers drain the queue before anyone waits (polled, not a fixed sleep:
        # under ThreadSanitizer on a loaded machine 200 reads took over 0.3 s).
        give_up = time.monotonic() + 120
        while not all(pool.done(t) for t in tickets) and time.monotonic() < give_up:
            time.sleep(0.01)
        assert all(pool.done(t) for t in tickets)
        errors: list[str] = []

        def waiter(part: int) -> None:
            for i in range(part, len(tickets), 4):
                f, o, n = extents[i]
                if pool.wait(tickets[i]).tobytes() != datas[f][o : o + n]:
                    errors.append(f"mismatch at {extents[i]}")

        threads = [threading.Thread(target=waiter, args=(k,)) for k in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        s = pool.stats()
    assert s["inline_reads"] == 0  # all were read by the workers
    assert s["reads"] == len(extents)


def test_wait_on_unstarted_read_runs_it_inline(files: tuple[list[str], list[bytes]]) -> None:
    paths, datas = files
    with cio.ReadPool(paths, workers=1, direct=False) as pool:
        # One worker, a queue of 40 whole-file reads: the last one is still queued when
        # waited for, and the waiter reads it itself instead of waiting behind the rest.
        tickets = [pool.submit(0, 0, len(datas[0])) for _ in range(40)]
        assert pool.wait(tickets[-1]).tobytes() == datas[0]
        for t in tickets[:-1]:
            pool.wait(t)
        assert pool.stats()["inline_reads"] >= 1


def test_tmpfs_direct_is_clean_and_recorded() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    p = shm / f"colibri-test-io-{os.getpid()}.bin"
    try:
        data = _write(p, 1_000_003, seed=5)
        with cio.ReadPool([str(p)], workers=2, direct=True) as pool:
            for f, o, n in _extents([data], 40, seed=3):
                assert pool.read(f, o, n).tobytes() == data[o : o + n]
            s = pool.stats()
            # tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since: either is fine,
            # but a fallback must be recorded and consistent with how reads went.
            if pool.direct_active(0):
                assert s["fallbacks"] == 0 and s["buffered_reads"] == 0
            else:
                assert s["fallbacks"] == 1 and s["direct_reads"] == 0
            assert s["errors"] == 0
    finally:
        p.unlink(missing_ok=True)


@pytest.mark.parametrize("fault", ["refuse_direct_open", "einval_direct_read"])
@pytest.mark.parametrize("workers", [0, 3])
def test_fallback_when_direct_refused(
    files: tuple[list[str], list[bytes]], fault: str, workers: int
) -> None:
    paths, datas = files
    extents = _extents(datas, 60, seed=17)
    with cio.ReadPool(paths, workers=workers, direct=True, fault=fault) as pool:
        tickets = [pool.submit(f, o, n) for f, o, n in extents]
        for t, (f, o, n) in zip(tickets, extents, strict=True):
            assert pool.wait(t).tobytes() == datas[f][o : o + n]
        s = pool.stats()
        assert not pool.direct_active(0) and not pool.direct_active(1)
    assert s["fallbacks"] == 2  # one per file, however many reads met the refusal
    assert s["errors"] == 0 and s["direct_reads"] + s["buffered_reads"] == len(extents)
    # Only empty reads before a file's first refusal can count as direct (nothing was read).
    assert s["direct_reads"] <= sum(1 for _, _, n in extents if n == 0)


def test_direct_off_records_no_fallback(files: tuple[list[str], list[bytes]]) -> None:
    paths, _ = files
    with cio.ReadPool(paths, workers=1, direct=False, fault="refuse_direct_open") as pool:
        assert not pool.direct_active(0)
        assert pool.stats()["fallbacks"] == 0


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("workers", [0, 2])
def test_short_read_after_truncation(tmp_path: Path, workers: int, direct: bool) -> None:
    p = tmp_path / "model.bin"
    size = 1 << 20
    data = _write(p, size, seed=9)
    with cio.ReadPool([str(p)], workers=workers, direct=direct) as pool:
        os.truncate(p, size // 2)  # the file changes under a loaded model
        off, n = size // 2 - 100, 5000
        with pytest.raises(ModelIOError) as info:
            pool.read(0, off, n)
        msg = str(info.value)
        assert "short read" in msg and str(p) in msg
        assert f"{n} bytes at offset {off}" in msg
        assert "truncated" in msg
        # Through submit/wait too, and the pool keeps serving the extents that still exist.
        t_bad = pool.submit(0, size - 10, 10)
        t_good = pool.submit(0, 123, 4567)
        with pytest.raises(ModelIOError, match="short read"):
            pool.wait(t_bad)
        assert pool.wait(t_good).tobytes() == data[123 : 123 + 4567]
        s = pool.stats()
    assert s["errors"] == 2 and s["reads"] == 1 and s["waits"] == 3


def test_eio_maps_to_model_io_error_and_pool_recovers(files: tuple[list[str], list[bytes]]) -> None:
    paths, datas = files
    with cio.ReadPool(paths, workers=2, direct=True, fault="eio") as pool:
        with pytest.raises(ModelIOError) as info:
            pool.read(1, 10, 100)
        msg = str(info.value)
        assert "100 bytes at offset 10" in msg and paths[1] in msg and "Input/output error" in msg
        pool.set_fault("none")
        assert pool.read(1, 10, 100).tobytes() == datas[1][10:110]


def test_missing_file_and_bad_arguments(
    tmp_path: Path, files: tuple[list[str], list[bytes]]
) -> None:
    with pytest.raises(ModelIOError, match="cannot open"):
        cio.ReadPool([str(tmp_path / "nope.bin")], workers=1)
    paths, _ = files
    with pytest.raises(InvalidRequestError, match="workers"):
        cio.ReadPool(paths, workers=-1)
    with pytest.raises(InvalidRequestError, match="workers"):
        cio.ReadPool(paths, workers=cio.MAX_WORKERS + 1)
    with pytest.raises(InvalidRequestError, match="fault"):
        cio.ReadPool(paths, workers=1, fault="bogus")
    with cio.ReadPool(paths, workers=1) as pool:
        with pytest.raises(InvalidRequestError):
            pool.read(0, -1, 10)
        with pytest.raises(InvalidRequestError, match="not pending"):
            pool.wait(12345)
    assert cio.slab_bytes(0, 1) == ALIGN
    assert cio.slab_bytes(ALIGN - 1, 2) == 2 * ALIGN
    assert cio.slab_bytes(ALIGN, ALIGN) == ALIGN


def test_cancel_semantics_synchronous(files: tuple[list[str], list[bytes]]) -> None:
    paths, datas = files
    with cio.ReadPool(paths, workers=0, direct=True) as pool:
        a, b, c = (pool.submit(0, i * 1000, 1000) for i in range(3))
        assert pool.cancel(b)  # not started: dropped, costs no I/O
        assert not pool.cancel(b)  # already retired
        with pytest.raises(InvalidRequestError, match="not pending"):
            pool.wait(b)
        assert pool.wait(c).tobytes() == datas[0][2000:3000]
        assert not pool.cancel(c)  # done and retired
        assert pool.wait(a).tobytes() == datas[0][0:1000]
        s = pool.stats()
    assert s["cancelled"] == 1 and s["reads"] == 2


def test_cancel_semantics_with_workers(files: tuple[list[str], list[bytes]]) -> None:
    """cancel() takes a queued read off the queue and never waits for one in progress.

    Every read first sleeps (the pool's ``slow_read`` hook), so the reads the two workers
    have started are still running while the loop cancels: a cancel() that waited for a
    read in progress would always find it done when it returns. Whether this thread gets
    a CPU soon enough after cancel() returns is up to the scheduler (the machine may be
    loaded, the core built with a sanitizer), hence up to 20 rounds; no clock is read.
    """
    paths, datas = files
    size = len(datas[0])
    took_queued = returned_while_running = False
    for _ in range(20):
        with cio.ReadPool(paths, workers=2, direct=True, fault="slow_read") as pool:
            tickets = [pool.submit(0, 0, size) for _ in range(64)]
            cancelled = []
            for t in tickets:
                ok = pool.cancel(t)
                # Not cancelled and not done: it was running, and cancel() did not wait.
                returned_while_running |= not ok and not pool.done(t)
                cancelled.append(ok)
            # Reads already started are not cancelled and must still be waited for (their
            # bytes intact); the rest are gone.
            for t, ok in zip(tickets, cancelled, strict=True):
                if ok:
                    with pytest.raises(InvalidRequestError):
                        pool.wait(t)
                else:
                    assert pool.wait(t).tobytes() == datas[0]
            s = pool.stats()
            assert pool.pending() == 0
        assert s["cancelled"] == sum(cancelled)
        assert s["reads"] == 64 - sum(cancelled)
        took_queued |= sum(cancelled) >= 1
        if took_queued and returned_while_running:
            break
    assert took_queued, "no cancel() took a queued read off the queue in 20 rounds"
    assert returned_while_running, "cancel() of a running read never returned before the read ended"


def test_shutdown_with_outstanding_requests(files: tuple[list[str], list[bytes]]) -> None:
    paths, datas = files
    size = len(datas[0])
    # close() drops what is still queued; whether anything is still queued when it runs
    # depends on how fast the workers drain the queue (under ASan and on an idle host
    # they can finish all of it), so rounds repeat until one closes with reads queued.
    saw_dropped = False
    for _ in range(20):
        pool = cio.ReadPool(paths, workers=2, direct=False)
        tickets = [pool.submit(0, 0, size) for _ in range(200)]
        pool.close()
        ok = dropped = 0
        for t in tickets:
            try:
                assert pool.wait(t).tobytes() == datas[0]
                ok += 1
            except InvalidRequestError as e:
                assert "shut down" in str(e)
                dropped += 1
        assert ok + dropped == len(tickets)
        saw_dropped |= dropped >= 1
        if saw_dropped:
            break
    assert saw_dropped, "close() never found a queued read to drop in 20 rounds"
    with pytest.raises(InvalidRequestError, match="shut down"):
        pool.submit(0, 0, 10)
    pool.close()  # idempotent
    # Dropping a pool with reads queued and in flight neither hangs nor crashes.
    pool2 = cio.ReadPool(paths, workers=3, direct=True)
    for _ in range(30):
        pool2.submit(0, 0, size)
    del pool2


def test_idle_workers_use_no_cpu(files: tuple[list[str], list[bytes]]) -> None:
    paths, datas = files
    with cio.ReadPool(paths, workers=8, direct=True) as pool:
        for t in [pool.submit(0, 0, len(datas[0])) for _ in range(16)]:
            pool.wait(t)
        time.sleep(0.05)
        c0, w0 = time.process_time(), time.perf_counter()
        time.sleep(0.5)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    print(f"idle pool of 8 workers: {cpu * 1e3:.2f} ms CPU over {wall:.2f} s")
    assert cpu < 0.02


@pytest.mark.parametrize("hugepages", [False, True])
def test_bench_reads_every_offset(files: tuple[list[str], list[bytes]], hugepages: bool) -> None:
    """ReadPool.bench (the disk-bound measurement of benchmarks/bench_ds3_streaming.py), in
    4 KiB-page slabs or in one MADV_HUGEPAGE mapping like the expert cache's: every
    offset read once, whole, however many are in flight."""
    paths, _ = files
    offsets = [0, ALIGN, 5 * ALIGN, 100 * ALIGN, 7 * ALIGN, 3 * ALIGN]
    for in_flight in (1, 3):
        with cio.ReadPool(paths, workers=2, direct=True) as pool:
            secs = pool.bench(0, offsets, 64 * 1024, in_flight, hugepages)
            st = pool.stats()
        assert secs > 0
        assert st["reads"] == len(offsets) and st["bytes"] == len(offsets) * 64 * 1024


@pytest.mark.parametrize("hugepages", [False, True])
def test_bench_reads_into_more_slabs_than_in_flight(files: tuple[list[str], list[bytes]],
                                                    hugepages: bool) -> None:
    """ReadPool.bench(..., slabs=N): the reads land in N slabs in turn (the disk bound of
    bench_streaming.py reads into the expert cache's slot count) while no more than
    `in_flight` are outstanding: every offset read once, and the pool's trace never has more
    than `in_flight` submitted and not finished (before session 27 the benchmark kept all N
    queued behind a device cap)."""
    paths, _ = files
    offsets = [i * ALIGN for i in (0, 5, 100, 7, 3, 9, 11, 2, 40, 60, 1)]
    for in_flight, slabs in ((1, 4), (2, 5), (3, 0)):
        with cio.ReadPool(paths, workers=3, direct=True) as pool:
            pool.start_trace(100)
            secs = pool.bench(0, offsets, 64 * 1024, in_flight, hugepages, slabs=slabs)
            st, tr = pool.stats(), pool.trace()
        assert secs > 0
        assert st["reads"] == len(offsets) and st["bytes"] == len(offsets) * 64 * 1024
        assert sorted(int(o) for o in tr["offset"]) == sorted(offsets)
        events = sorted([(float(t), 1) for t in tr["submitted"]]
                        + [(float(t), -1) for t in tr["finished"]])
        outstanding = peak = 0
        for _, step in events:  # a finish sorts before a submit at the same instant
            outstanding += step
            peak = max(peak, outstanding)
        assert peak <= in_flight, (in_flight, slabs, peak)
    with cio.ReadPool(paths, workers=1, direct=True) as pool, pytest.raises(ValueError):
        pool.bench(0, offsets, 64 * 1024, 1, hugepages, slabs=-1)


def test_trace_records_every_finished_read(files: tuple[list[str], list[bytes]]) -> None:
    """ReadPool.start_trace / trace (benchmarks/_iotrace.py's input): one record per read
    that finished after start_trace, monotonic times in order, the extent, the demand flag
    and whether the waiter ran it; capped at max_records; off after start_trace(0)."""
    paths, datas = files
    with cio.ReadPool(paths, workers=2, direct=True) as pool:
        pool.read(0, 0, 100)  # before the trace: not recorded
        t0 = time.monotonic()
        pool.start_trace(100)
        tickets = [pool.submit(0, i * ALIGN, 5000, urgent=(i % 2 == 0)) for i in range(6)]
        for i, t in enumerate(tickets):
            assert pool.wait(t).tobytes() == datas[0][i * ALIGN : i * ALIGN + 5000]
        t1 = time.monotonic()
        tr = pool.trace()
        assert len(tr["started"]) == 6
        assert sorted(tr["offset"].tolist()) == [i * ALIGN for i in range(6)]
        assert set(tr["bytes"].tolist()) == {5000} and set(tr["file"].tolist()) == {0}
        assert sorted(tr["urgent"].tolist()) == [False] * 3 + [True] * 3
        assert not tr["failed"].any()
        assert (t0 <= tr["submitted"]).all() and (tr["finished"] <= t1).all()
        assert (tr["submitted"] <= tr["started"]).all() and (tr["started"] <= tr["finished"]).all()
        pool.start_trace(2)  # a new trace, capped
        for i in range(4):
            pool.read(1, i, 10)
        assert len(pool.trace()["started"]) == 2
        pool.start_trace(0)  # off
        pool.read(1, 0, 10)
        assert len(pool.trace()["started"]) == 0
    with cio.ReadPool(paths, workers=0, direct=True) as pool:  # no workers: all inline
        pool.start_trace(10)
        pool.read(0, 0, 10)
        tr = pool.trace()
        assert tr["inline"].tolist() == [True] and tr["urgent"].tolist() == [True]


def test_trace_marks_failed_reads(files: tuple[list[str], list[bytes]]) -> None:
    paths, _ = files
    with cio.ReadPool(paths, workers=1, direct=True, fault="eio") as pool:
        pool.start_trace(10)
        with pytest.raises(ModelIOError):
            pool.read(0, 0, 100)
        assert pool.trace()["failed"].tolist() == [True]
        assert pool.stats()["errors"] == 1
