"""Defect 1 of issue 8: no file outside the model's directory is ever read.

Every file a model names (safetensors shards in an index, tokenizer files, a container's
data files, a directory's one .gguf) must resolve, symlinks followed, inside the model's
directory, or loading fails with a ModelFormatError naming the entry; error messages do
not echo raw bytes of a file that is not what it claims to be.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

import colibri
from colibri.convert import verify_container, write_container
from colibri.errors import ModelFormatError
from colibri.sources import open_model_source
from colibri.tokenizers import Tokenizer
from support.modelfactory import TinyModel
from support.untrusted import bounded, copy_dir, edit_json


@pytest.fixture
def sharded(tiny_models: dict[str, TinyModel], tmp_path: Path) -> Path:
    """tmp/model: the llama checkpoint with an index naming one shard; tmp/outside holds a
    valid copy of that shard (what an escaping name would reach)."""
    d = copy_dir(tiny_models["llama"].hf_dir, tmp_path / "model")
    os.rename(d / "model.safetensors", d / "model-00001-of-00001.safetensors")
    (tmp_path / "outside").mkdir()
    shutil.copy(d / "model-00001-of-00001.safetensors", tmp_path / "outside" / "stolen.safetensors")
    names = json.loads((d / "model-00001-of-00001.safetensors").read_bytes()[8:][
        : struct.unpack("<Q", (d / "model-00001-of-00001.safetensors").read_bytes()[:8])[0]])
    weight_map = {n: "model-00001-of-00001.safetensors" for n in names if n != "__metadata__"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


def _point_index_at(d: Path, target: str) -> None:
    def edit(doc: dict) -> None:  # type: ignore[type-arg]
        for k in doc["weight_map"]:
            doc["weight_map"][k] = target

    edit_json(d / "model.safetensors.index.json", edit)
    (d / "model-00001-of-00001.safetensors").unlink()


def test_sharded_checkpoint_loads(sharded: Path) -> None:
    assert open_model_source(sharded).files == ((sharded / "model-00001-of-00001.safetensors")
                                                .resolve(),)  # fmt: skip


@pytest.mark.parametrize("target", [
    "../outside/stolen.safetensors", "sub/../../outside/stolen.safetensors", "ABSOLUTE",
    "/proc/self/environ", "/etc/passwd", "~/stolen.safetensors",
])  # fmt: skip
def test_index_naming_a_file_outside_is_refused(sharded: Path, target: str) -> None:
    if target == "ABSOLUTE":
        target = str(sharded.parent / "outside" / "stolen.safetensors")
    _point_index_at(sharded, target)
    for load in (open_model_source, colibri.Model.load,
                 lambda d: write_container(d, d.parent / "out")):  # colibri convert  # fmt: skip
        with pytest.raises(ModelFormatError, match="shard") as err:
            load(sharded)
        assert repr(target) in str(err.value)  # the message names the entry
        assert "outside the model directory" in str(err.value) or "absolute" in str(err.value)
    assert not (sharded.parent / "out" / "manifest.json").exists()


def test_shard_symlinked_outside_is_refused(sharded: Path) -> None:
    shard = sharded / "model-00001-of-00001.safetensors"
    shard.unlink()
    os.symlink(sharded.parent / "outside" / "stolen.safetensors", shard)
    with pytest.raises(ModelFormatError, match="resolves outside the model directory"):
        open_model_source(sharded)
    (sharded / "model.safetensors.index.json").unlink()  # found by listing instead
    with pytest.raises(ModelFormatError, match="resolves outside the model directory"):
        open_model_source(sharded)


def test_symlinks_inside_the_directory_and_the_hub_cache_load(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """Symlinks that stay inside are fine, and so is the Hugging Face hub cache layout
    (snapshots/<rev>/file -> ../../blobs/<hash>)."""
    repo = tmp_path / "models--org--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(tiny_models["llama"].hf_dir.iterdir())):
        shutil.copy(f, blobs / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snap / f.name)
    m = open_model_source(snap)
    assert m.files[0].parent == blobs.resolve()
    with colibri.Model.load(snap) as model:
        assert model.session().forward([1, 2]).shape == (256,)


def test_gguf_in_directory_symlinked_outside(tiny_models: dict[str, TinyModel],
                                            tmp_path: Path) -> None:  # fmt: skip
    d = tmp_path / "model"
    d.mkdir()
    os.symlink(tiny_models["llama"].gguf["Q8_0"], d / "model.gguf")
    with pytest.raises(ModelFormatError, match="GGUF file 'model.gguf' resolves outside"):
        open_model_source(d)
    # The path of the file itself is the user's choice, symlink or not.
    assert open_model_source(d / "model.gguf").config.arch == "llama"


def test_tokenizer_files_outside_are_refused(tiny_models: dict[str, TinyModel],
                                            tmp_path: Path) -> None:  # fmt: skip
    d = tmp_path / "tok"
    d.mkdir()
    (tmp_path / "secret.json").write_text('{"chat_template": "stolen"}')
    from fuzz.seeds import _byte_level_tokenizer

    _byte_level_tokenizer(d / "tokenizer.json")
    assert Tokenizer.from_hf(d).vocab_size == 256
    os.symlink(tmp_path / "secret.json", d / "tokenizer_config.json")
    with pytest.raises(ModelFormatError, match="'tokenizer_config.json' resolves outside"):
        Tokenizer.from_hf(d)
    (d / "tokenizer_config.json").unlink()
    os.symlink(tmp_path / "secret.json", d / "chat_template.jinja")
    with pytest.raises(ModelFormatError, match="'chat_template.jinja' resolves outside"):
        Tokenizer.from_hf(d)


def test_fifo_is_never_opened(tmp_path: Path) -> None:
    """A FIFO named like a tokenizer file would block the reader forever."""
    from fuzz.seeds import _byte_level_tokenizer

    _byte_level_tokenizer(tmp_path / "tokenizer.json")
    os.mkfifo(tmp_path / "tokenizer_config.json")
    out = bounded(lambda: Tokenizer.from_hf(tmp_path), timeout=30)
    assert (out.kind, out.error) == ("colibri_error", "ModelFormatError"), out
    assert "not a regular file" in out.detail


def test_container_files_outside_are_refused(tiny_models: dict[str, TinyModel],
                                             tmp_path: Path) -> None:  # fmt: skip
    c = tmp_path / "c"
    write_container(tiny_models["qwen3_moe"].gguf["Q8_0"], c)
    (tmp_path / "x").mkdir()
    shutil.move(c / "dense.bin", tmp_path / "x" / "dense.bin")
    os.symlink(tmp_path / "x" / "dense.bin", c / "dense.bin")
    with pytest.raises(ModelFormatError, match="'dense.bin' resolves outside"):
        open_model_source(c)
    problems = verify_container(c)  # `colibri verify` reports it and reads nothing there
    assert len(problems) == 1 and "resolves outside" in problems[0]


def test_safetensors_header_bytes_are_not_echoed(tiny_models: dict[str, TinyModel],
                                                tmp_path: Path) -> None:  # fmt: skip
    """A file that is not safetensors (here: what /proc/self/environ would give) is
    reported as such; its first 8 bytes are not quoted as a "header length"."""
    d = copy_dir(tiny_models["llama"].hf_dir, tmp_path / "m")
    content = b"SHELL=/bin/bash\nHOME=/root\nSECRET_TOKEN=hunter2\n"
    (d / "model.safetensors").write_bytes(content)
    with pytest.raises(ModelFormatError, match="not a safetensors file") as err:
        open_model_source(d)
    assert str(struct.unpack("<Q", content[:8])[0]) not in str(err.value)
    assert "SHELL" not in str(err.value) and "hunter2" not in str(err.value)
