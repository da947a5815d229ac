"""Starting ``colibri serve`` in a subprocess for the server tests (tests/server/test_server_*.py).

The server listens on 127.0.0.1 on a port the OS picks (``--port 0``); its "serving ...
at http://127.0.0.1:PORT/v1" line on stderr says which. Its stderr is drained by a thread
(kept for failure messages) so the access log never fills the pipe. ``stop()`` sends
SIGTERM, the graceful shutdown, and waits for the exit status.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_READY = re.compile(r"colibri: serving .* at (http://127\.0\.0\.1:\d+)/v1")
START_TIMEOUT = 120.0
SERVER_KEY = "test-key"  # the conftest smollm2_server's API key
SERVER_CTX = 512


class ServerProcess:
    def __init__(self, model: Path | str, *flags: str) -> None:
        self.cmd = [sys.executable, "-m", "colibri", "serve", str(model), "--host",
                    "127.0.0.1", "--port", "0", *flags]
        self.proc = subprocess.Popen(self.cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url = ""
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(START_TIMEOUT) or not self.url:
            self.stop()
            raise RuntimeError(f"the server did not start: {self.cmd}\n{self.log()}")

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            m = _READY.search(line)
            if m and not self.url:
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()  # the process ended (before or after starting)

    def log(self) -> str:
        return "".join(self.lines[-60:])

    @property
    def base(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return self.url + "/v1"

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful: running requests finish), then the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def metric(text: str, name: str) -> float:
    """The value of an unlabelled metric in Prometheus text."""
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    if m is None:
        raise AssertionError(f"{name} missing from /metrics")
    return float(m.group(1))


def wait_for(cond: object, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
