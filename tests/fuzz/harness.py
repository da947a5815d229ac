"""One mutant, one child process: a memory cap, a timeout, and a classified outcome.

The worker (which has imported colibri once) forks a child per mutant; the child caps
its address space (RLIMIT_AS), runs the format's action (load the model, generate...) and
reports through a pipe; the parent kills it at the timeout. Outcomes:

``colibri_error``    a ``colibri.errors`` exception: the input was rejected (the goal)
``silent_load``      everything ran: the mutant was harmless (or it is garbage that loads)
``other_exception``  any other exception (TypeError, MemoryError, ...): a bug
``signal``           the child died by a signal (a crash): a bug
``timeout``          killed at the timeout: a hang, a bug

Without strace (see campaign.py) a Python audit hook in the child records every file
Python opens, and the action records the files it hands to the core; the campaign
checks them against the model directory.
"""

from __future__ import annotations

import faulthandler
import json
import os
import resource
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from colibri.errors import ColibriError

Action = Callable[..., None]
OPENED: list[str] = []  # filled in the child by the audit hook and by actions


@dataclass
class Outcome:
    kind: str
    error: str = ""  # exception type
    detail: str = ""  # message (cut) or traceback tail
    seconds: float = 0.0  # in the child, from the start of the action to its end
    cpu: float = 0.0  # CPU seconds the child spent on it (all its threads): the work,
    # without the time a loaded machine did not schedule it
    wall: float = 0.0  # fork to exit, seen by the parent
    maxrss_kb: int = 0  # the child's peak resident set (inherited pages included)
    pid: int = 0
    opened: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and args and isinstance(args[0], str | bytes):
        path = os.fsdecode(args[0])
        mode = args[1] if len(args) > 1 else "r"
        flags = args[2] if len(args) > 2 else 0
        writing = (isinstance(mode, str) and any(c in mode for c in "wax")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_CREAT)
        )
        if not writing:
            OPENED.append(os.path.abspath(path))


def vm_size_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(action: Action, args: tuple[Any, ...], mem_cap: int, audit: bool, w: int) -> None:
    payload: dict[str, Any]
    try:
        faulthandler.disable()  # a crash is reported as a signal, not as a traceback dump
        resource.setrlimit(resource.RLIMIT_AS, (mem_cap, mem_cap))
        if audit:
            sys.addaudithook(_audit)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            action(*args)
            payload = {"kind": "silent_load"}
        except ColibriError as exc:
            payload = {"kind": "colibri_error", "error": type(exc).__name__, "detail": str(exc)}
        except BaseException as exc:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-4:])
            payload = {"kind": "other_exception", "error": type(exc).__name__, "detail": tb}
        payload["seconds"] = time.perf_counter() - t0
        payload["cpu"] = time.process_time() - c0
        payload["detail"] = payload.get("detail", "")[:600]
        payload["opened"] = OPENED[:2000]
        data = json.dumps(payload).encode()
        while data:
            data = data[os.write(w, data) :]
    finally:
        os._exit(0)


def run_in_child(action: Action, args: tuple[Any, ...], *, timeout: float, mem_cap: int,
                 audit: bool = False) -> Outcome:  # fmt: skip
    """Runs ``action(*args)`` in a forked child; see the module docstring."""
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        _child(action, args, mem_cap, audit, w)
    os.close(w)
    pidfd = os.pidfd_open(pid)
    chunks: list[bytes] = []
    deadline = t0 + timeout
    timed_out = False
    open_fds = [r, pidfd]
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            break
        ready, _, _ = select.select(open_fds, [], [], left)
        if r in ready:
            chunk = os.read(r, 1 << 16)
            if chunk:
                chunks.append(chunk)
                continue
            open_fds.remove(r)  # EOF: the child closed its end (exiting)
        if pidfd in ready:
            break
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if r in open_fds:
        while chunk := os.read(r, 1 << 16):
            chunks.append(chunk)
    os.close(r)
    os.close(pidfd)
    out = Outcome("timeout" if timed_out else "other_exception", wall=wall,
                  maxrss_kb=int(usage.ru_maxrss), pid=pid)  # fmt: skip
    if timed_out:
        out.detail = f"killed after {timeout} s"
    elif os.WIFSIGNALED(status):
        out.kind, out.detail = "signal", signal.Signals(os.WTERMSIG(status)).name
    elif chunks:
        try:
            payload = json.loads(b"".join(chunks))
        except ValueError:
            out.detail = "unreadable result from the child"
        else:
            out.kind = payload["kind"]
            out.error = payload.get("error", "")
            out.detail = payload.get("detail", "")
            out.seconds = payload.get("seconds", 0.0)
            out.cpu = payload.get("cpu", 0.0)
            out.opened = payload.get("opened", [])
    else:
        out.detail = f"the child exited ({os.waitstatus_to_exitcode(status)}) without a result"
    return out
