"""Model.load("org/name") from the local Hugging Face cache (huggingface_hub,
local_files_only: nothing is downloaded), on a cache built here in the layout
huggingface_hub writes: models--org--name/{refs/<revision>, blobs/<hash>,
snapshots/<commit>/<file> -> ../../blobs/<hash>}."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import colibri as co
from colibri.errors import ModelNotFoundError
from support.cli_run import _env, assert_one_line_error, colibri_cli
from support.modelfactory import TinyModel

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _add_repo(cache: Path, repo: str, files: dict[str, Path], revision: str = "main",
              commit: str = COMMIT) -> Path:
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    snap = root / "snapshots" / commit
    for name, src in files.items():
        data = src.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    return snap


@pytest.fixture()
def hf_cache(tmp_path: Path, tiny_models: dict[str, TinyModel]) -> Path:
    cache = tmp_path / "hub"
    tiny = tiny_models["llama"]
    _add_repo(cache, "tiny-org/tiny-llama-GGUF", {
        "tiny-llama.Q8_0.gguf": tiny.gguf["Q8_0"], "tiny-llama.Q4_0.gguf": tiny.gguf["Q4_0"],
        "README.md": tiny.hf_dir / "config.json",
    })
    _add_repo(cache, "tiny-org/tiny-llama", {
        p.name: p for p in sorted(tiny.hf_dir.iterdir()) if p.is_file()
    })
    _add_repo(cache, "tiny-org/tiny-llama-GGUF", {"tiny-llama.F32.gguf": tiny.gguf["F32"]},
              revision="v0", commit="f" * 40)
    return cache


def _logits(model: co.Model) -> np.ndarray:
    return model.session().forward([3, 1, 4, 1, 5], all_logits=True)


def test_a_gguf_by_filename_pattern(hf_cache: Path, tiny_models: dict[str, TinyModel]) -> None:
    tiny = tiny_models["llama"]
    m = co.Model.load("tiny-org/tiny-llama-GGUF", filename="*Q8_0.gguf", hf_cache_dir=hf_cache)
    assert m.name == "tiny-org/tiny-llama-GGUF"
    assert m.manifest.path.name == "tiny-llama.Q8_0.gguf"
    np.testing.assert_array_equal(_logits(m), _logits(co.Model.load(tiny.gguf["Q8_0"])))
    old = co.Model.load("tiny-org/tiny-llama-GGUF", filename="*.gguf", revision="v0",
                        hf_cache_dir=hf_cache)
    np.testing.assert_array_equal(_logits(old), _logits(co.Model.load(tiny.gguf["F32"])))
    with pytest.raises(ModelNotFoundError, match=r"2 files .* match '\*\.gguf' "
                                                 r"\(tiny-llama.Q4_0.gguf, tiny-llama.Q8_0.gguf\)"):
        co.Model.load("tiny-org/tiny-llama-GGUF", filename="*.gguf", hf_cache_dir=hf_cache)
    with pytest.raises(ModelNotFoundError, match=r"no file .* matches '\*Q6_K.gguf'"):
        co.Model.load("tiny-org/tiny-llama-GGUF", filename="*Q6_K.gguf", hf_cache_dir=hf_cache)


def test_a_checkpoint_snapshot(hf_cache: Path, tiny_models: dict[str, TinyModel]) -> None:
    m = co.Model.load("tiny-org/tiny-llama", hf_cache_dir=hf_cache)
    assert m.manifest.source == "hf"
    np.testing.assert_array_equal(_logits(m), _logits(co.Model.load(tiny_models["llama"].hf_dir)))


def test_not_in_the_cache_is_a_clear_error(hf_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError) as info:
        co.Model.load("tiny-org/absent", hf_cache_dir=hf_cache)
    msg = str(info.value)
    assert "'tiny-org/absent'" in msg and str(hf_cache) in msg and "download=True" in msg
    assert "hf download tiny-org/absent" in msg  # huggingface_hub 1.x+ has no huggingface-cli
    with pytest.raises(ModelNotFoundError, match="revision 'v9'"):
        co.Model.load("tiny-org/tiny-llama", revision="v9", hf_cache_dir=hf_cache)
    # A missing path that looks like a file is reported as a path, not looked up.
    with pytest.raises(ModelNotFoundError, match="does not exist, and it is not a named model"):
        co.Model.load("models/absent.gguf")


def test_an_existing_path_wins(hf_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               tiny_models: dict[str, TinyModel]) -> None:
    local = tmp_path / "tiny-org" / "tiny-llama"
    shutil.copytree(tiny_models["llama"].hf_dir, local)
    monkeypatch.chdir(tmp_path)
    m = co.Model.load("tiny-org/tiny-llama", hf_cache_dir=hf_cache / "nowhere")
    assert m.manifest.path.resolve() == local.resolve()


def test_the_cli_takes_repository_ids(hf_cache: Path) -> None:
    env = _env(HF_HUB_CACHE=str(hf_cache), HF_HUB_OFFLINE="1")
    proc = colibri_cli("info", "--json", "tiny-org/tiny-llama", env=env)
    assert proc.returncode == 0, proc.stderr
    assert '"source": "hf"' in proc.stdout


def test_the_cli_names_its_own_download_option_and_a_network_failure(hf_cache: Path) -> None:
    """On the command line the advice is --download, not Python's download=True; with
    --download and no Hub to reach, the error says the download failed and why (issue 38,
    item 4), instead of repeating "download it first"."""
    env = _env(HF_HUB_CACHE=str(hf_cache), HF_HUB_OFFLINE="0",
               HF_ENDPOINT="http://127.0.0.1:9")  # the discard port: connection refused
    absent = colibri_cli("info", "tiny-org/absent", env=env)
    line = assert_one_line_error(absent, 1, "not in the local Hugging Face cache",
                                 "hf download tiny-org/absent", "pass --download")
    assert "download=True" not in line
    failed = colibri_cli("info", "tiny-org/absent", "--download", env=env)
    line = assert_one_line_error(failed, 1, "could not download 'tiny-org/absent' from the "
                                 "Hugging Face Hub", "check the network")
    assert "download it first" not in line
