"""
Expert read path: O_DIRECT reads into aligned slabs and the I/O worker pool (internal).
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
import typing_extensions
__all__: list[str] = ['DIRECT_ALIGNMENT', 'MAX_WORKERS', 'PrefetchGovernor', 'ReadPool', 'ReadQueue', 'crc32', 'crc32_accelerated', 'slab_bytes']
class ReadQueue:
    """
    The read pool's queue order (demand reads first), for tests.
    """
    def __init__(self) -> None:
        ...
    def __len__(self) -> int:
        ...
    def pop(self) -> int:
        ...
    def push(self, ticket: typing.SupportsInt | typing.SupportsIndex, urgent: bool) -> None:
        ...
class PrefetchGovernor:
    """
    The expert store's prefetch on/off rule (rolling accuracy with hysteresis), for tests.
    """
    def __init__(self, window: typing.SupportsInt | typing.SupportsIndex = 128, min_samples: typing.SupportsInt | typing.SupportsIndex = 32, off_below: typing.SupportsFloat | typing.SupportsIndex = 0.55, on_at: typing.SupportsFloat | typing.SupportsIndex = 0.65) -> None:
        ...
    def record(self, used: bool) -> None:
        ...
    def reset(self) -> None:
        ...
    @property
    def accuracy(self) -> float:
        ...
    @property
    def active(self) -> bool:
        ...
    @property
    def samples(self) -> int:
        ...
    @property
    def switched_off(self) -> int:
        ...
    @property
    def switched_on(self) -> int:
        ...
class ReadPool:
    """
    I/O worker pool over a list of files. workers=0 reads synchronously in wait(); direct asks for O_DIRECT (falls back to buffered per file where refused). fault is a test hook: none, refuse_direct_open, einval_direct_read, eio, slow_read.
    """
    def __enter__(self) -> typing.Any:
        ...
    def __exit__(self, *args: typing.Any) -> None:
        ...
    def __init__(self, paths: collections.abc.Sequence[str], workers: typing.SupportsInt | typing.SupportsIndex = 1, direct: bool = True, fault: str = 'none') -> None:
        ...
    def bench(self, file: typing.SupportsInt | typing.SupportsIndex, offsets: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], length: typing.SupportsInt | typing.SupportsIndex, in_flight: typing.SupportsInt | typing.SupportsIndex, hugepages: bool = False, slabs: typing.SupportsInt | typing.SupportsIndex = 0) -> float:
        """
        Timed read loop in C++ (preallocated, pre-faulted slabs, `in_flight` outstanding); returns seconds. hugepages=True puts the slabs in one MADV_HUGEPAGE mapping, as the expert cache's arena; `slabs` (0: one per read in flight) destination slabs are used in turn, so many distinct pages can be read into at a low depth.
        """
    def cancel(self, ticket: typing.SupportsInt | typing.SupportsIndex) -> bool:
        """
        Drop a read not yet started; False if running or done (then wait for it).
        """
    def close(self) -> None:
        ...
    def direct_active(self, file: typing.SupportsInt | typing.SupportsIndex) -> bool:
        """
        Whether reads of this file currently use O_DIRECT.
        """
    def done(self, ticket: typing.SupportsInt | typing.SupportsIndex) -> bool:
        ...
    def file_size(self, file: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def in_flight(self) -> int:
        """
        Reads queued or running (not finished).
        """
    def pending(self) -> int:
        ...
    def read(self, file: typing.SupportsInt | typing.SupportsIndex, offset: typing.SupportsInt | typing.SupportsIndex, length: typing.SupportsInt | typing.SupportsIndex) -> numpy.typing.NDArray[numpy.uint8]:
        """
        submit + wait.
        """
    def reset_stats(self) -> None:
        ...
    def set_fault(self, fault: str) -> None:
        ...
    def start_trace(self, max_records: typing.SupportsInt | typing.SupportsIndex) -> None:
        """
        Record every read that finishes from now on (at most max_records; 0 stops); drops the old trace.
        """
    def stats(self) -> dict[str, typing.Any]:
        ...
    def submit(self, file: typing.SupportsInt | typing.SupportsIndex, offset: typing.SupportsInt | typing.SupportsIndex, length: typing.SupportsInt | typing.SupportsIndex, urgent: bool = False) -> int:
        """
        Queue a read; returns a ticket. urgent=True: a demand read, queued ahead of every non-urgent one.
        """
    def trace(self) -> dict[str, typing.Any]:
        """
        The trace so far: dict of numpy columns (submitted, started, finished: CLOCK_MONOTONIC seconds, as time.monotonic(); offset, bytes, file, urgent, inline, failed), one entry per finished read.
        """
    def wait(self, ticket: typing.SupportsInt | typing.SupportsIndex) -> numpy.typing.NDArray[numpy.uint8]:
        """
        Block until this read is done; returns its bytes (numpy uint8, zero-copy).
        """
    @property
    def direct(self) -> bool:
        ...
    @property
    def max_in_flight(self) -> int:
        """
        Reads on the device at once, apart from the workers (0: no cap).
        """
    @max_in_flight.setter
    def max_in_flight(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def workers(self) -> int:
        ...
def crc32(data: typing_extensions.Buffer, crc: typing.SupportsInt | typing.SupportsIndex = 0, reference: bool = False) -> int:
    """
    CRC-32 (zlib's polynomial) of a contiguous buffer, continuing `crc`; reference=True uses zlib only (the oracle of the folded path).
    """
def crc32_accelerated() -> bool:
    """
    Whether crc32 folds with carry-less multiplies on this CPU.
    """
def slab_bytes(offset: typing.SupportsInt | typing.SupportsIndex, length: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Bytes of the aligned slab a read of this extent needs.
    """
DIRECT_ALIGNMENT: int = 4096
MAX_WORKERS: int = 64
