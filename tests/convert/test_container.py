"""The native streaming container: layout, round trip (bit-identical logits), resume after
an interruption (byte-identical result), verification (docs/format.md, "Native
container")."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.convert import ALIGNMENT, verify_container, write_container
from colibri.convert.container import JOURNAL, MANIFEST
from colibri.errors import ModelFormatError
from colibri.sources import Manifest, open_model_source
from colibri.sources.native_source import load_native
from support.modelfactory import TinyModel, prompt_ids

ENGINE = colibri.EngineConfig(context_length=64)


def logits(manifest: Manifest) -> np.ndarray:
    """Every position's logits of ``prompt_ids(16)`` with the model ``manifest`` describes,
    loaded by Model.load from its path."""
    with colibri.Model.load(manifest.path, engine=ENGINE) as m:
        return np.asarray(m.session().forward(prompt_ids(16), all_logits=True))


def read_extents(m: Manifest, name: str) -> bytes:
    out = b""
    for e in m.tensors[name].extents:
        with open(m.files[e.file], "rb") as f:
            f.seek(e.offset)
            out += f.read(e.length)
    return out


def container_files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


SOURCES = ["hf", "F32", "Q8_0", "Q4_0"]


def source_path(t: TinyModel, kind: str) -> Path:
    return t.hf_dir if kind == "hf" else t.gguf[kind]


@pytest.mark.parametrize("kind", SOURCES)
def test_round_trip_bit_identical(
    tiny_model: TinyModel, kind: str, tmp_path: Path
) -> None:
    src = open_model_source(source_path(tiny_model, kind))
    dst = tmp_path / "model.colibri"
    report = write_container(src, dst)
    assert report.items_reused == 0 and report.items_written == report.items_total
    nat = load_native(dst)
    assert nat.config == src.config
    assert nat.source == src.source
    assert set(nat.tensors) == set(src.tensors)
    for name, t in src.tensors.items():
        n = nat.tensors[name]
        assert (n.dtype, n.shape, n.rope_unpermute_heads) == (
            t.dtype, t.shape, t.rope_unpermute_heads
        ), name
        assert read_extents(nat, name) == read_extents(src, name), name
    assert np.array_equal(logits(nat), logits(src))
    assert verify_container(dst) == []
    assert not (dst / JOURNAL).exists()


def test_expert_blobs_layout(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    src = open_model_source(tiny_models["qwen2_moe"].gguf["Q4_0"])
    dst = tmp_path / "c"
    write_container(src, dst)
    doc = json.loads((dst / MANIFEST).read_text())
    assert (doc["format"], doc["version"], doc["checksum"]) == ("colibri-container", 1, "crc32")
    cfg = src.config
    assert len(doc["experts"]) == cfg.n_experts * sum(cfg.moe_layers)
    size = (dst / "experts.bin").stat().st_size
    assert size == doc["files"]["experts"]["size"]
    end = 0
    for rec in doc["experts"]:
        assert rec["offset"] % ALIGNMENT == 0 and rec["length"] % ALIGNMENT == 0
        assert rec["offset"] == end  # blobs are back to back
        end += rec["length"]
        assert rec["gate"]["offset"] == 0
        assert rec["gate"]["offset"] + rec["gate"]["length"] <= rec["up"]["offset"]
        assert rec["up"]["offset"] + rec["up"]["length"] <= rec["down"]["offset"]
        assert rec["down"]["offset"] + rec["down"]["length"] <= rec["length"]
        assert rec["gate"]["dtype"] == "Q4_0"
    assert end == size
    # GGUF tokenizer metadata passes through: the tokenizer works the same.
    with colibri.Model.load(dst, engine=ENGINE) as a, colibri.Model.load(
        tiny_models["qwen2_moe"].gguf["Q4_0"], engine=ENGINE
    ) as b:
        assert a.tokenizer.encode("hello world") == b.tokenizer.encode("hello world")


def test_hf_tokenizer_files_copied(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    hf = tiny_models["llama"].hf_dir
    src_dir = tmp_path / "hf"
    src_dir.mkdir()
    for p in hf.iterdir():  # copies: a symlink out of a model's directory is refused
        shutil.copy(p, src_dir / p.name)
    (src_dir / "tokenizer_config.json").write_text('{"model_max_length": 7}')
    dst = tmp_path / "c"
    write_container(open_model_source(src_dir), dst)
    assert (dst / "tokenizer_config.json").read_text() == '{"model_max_length": 7}'
    assert not (dst / "config.json").exists()  # never mistaken for an HF directory
    nat = load_native(dst)
    assert nat.path == dst and nat.source == "hf"


class Interrupt(Exception):
    pass


def interrupt_after(n: int):  # type: ignore[no-untyped-def]
    calls = [0]

    def progress(done: int, total: int) -> None:
        assert 0 <= done <= total
        calls[0] += 1
        if calls[0] > n:  # the first call reports the resume check
            raise Interrupt

    return progress


@pytest.mark.parametrize("kind", ["hf", "Q8_0"])
def test_resume_is_byte_identical(
    tiny_models: dict[str, TinyModel], kind: str, tmp_path: Path
) -> None:
    src = open_model_source(source_path(tiny_models["qwen3_moe"], kind))
    ref = tmp_path / "ref"
    write_container(src, ref)
    n_dense = len(json.loads((ref / MANIFEST).read_text())["dense"])
    dst = tmp_path / "dst"
    stop = n_dense + 5  # inside the expert blobs
    with pytest.raises(Interrupt):
        write_container(src, dst, progress=interrupt_after(stop))
    # Half-written: no manifest, so it is never taken for a whole container.
    assert not (dst / MANIFEST).exists() and (dst / JOURNAL).exists()
    with pytest.raises(ModelFormatError, match="interrupted"):
        load_native(dst)
    assert verify_container(dst) != []
    report = write_container(src, dst)
    assert report.items_reused == stop
    assert report.items_written == report.items_total - stop
    assert container_files(dst) == container_files(ref)


def test_resume_rewrites_damaged_blob(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    src = open_model_source(tiny_models["mixtral"].gguf["Q4_0"])
    ref = tmp_path / "ref"
    write_container(src, ref)
    n_dense = len(json.loads((ref / MANIFEST).read_text())["dense"])
    dst = tmp_path / "dst"
    with pytest.raises(Interrupt):
        write_container(src, dst, progress=interrupt_after(n_dense + 4))
    # Damage the third journaled blob and tear the journal's last line.
    with open(dst / "experts.bin", "r+b") as f:
        f.seek(2 * ALIGNMENT + 10)
        b = f.read(1)
        f.seek(2 * ALIGNMENT + 10)
        f.write(bytes([b[0] ^ 0xFF]))
    with open(dst / JOURNAL, "ab") as f:
        f.write(b'{"i": 99')
    report = write_container(src, dst)
    assert report.items_reused == n_dense + 2
    assert container_files(dst) == container_files(ref)
    # A rerun over a finished container rewrites it (no journal) to the same bytes.
    write_container(src, dst)
    assert container_files(dst) == container_files(ref)


def test_stale_journal_is_discarded(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    a = open_model_source(tiny_models["olmoe"].gguf["Q8_0"])
    b = open_model_source(tiny_models["olmoe"].gguf["Q4_0"])
    dst = tmp_path / "dst"
    with pytest.raises(Interrupt):
        write_container(a, dst, progress=interrupt_after(10))
    report = write_container(b, dst)
    assert report.items_reused == 0
    ref = tmp_path / "ref"
    write_container(b, ref)
    assert container_files(dst) == container_files(ref)


def test_verify_names_the_damage(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    src = open_model_source(tiny_models["qwen3_moe"].gguf["Q8_0"])
    dst = tmp_path / "c"
    write_container(src, dst)
    assert verify_container(dst) == []
    doc = json.loads((dst / MANIFEST).read_text())
    blob = next(r for r in doc["experts"] if r["layer"] == 1 and r["expert"] == 3)
    dense = doc["dense"][1]
    for name, off in (("experts.bin", blob["offset"] + 100), ("dense.bin", dense["offset"])):
        with open(dst / name, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 1]))
    problems = verify_container(dst)
    assert len(problems) == 2, problems
    assert any(p.startswith("layer 1 expert 3: checksum mismatch") for p in problems)
    assert any(repr(dense["name"]) in p for p in problems)
    # Truncation is reported too; a missing manifest makes it incomplete.
    with open(dst / "experts.bin", "r+b") as f:
        f.truncate(blob["offset"])
    assert any("experts.bin is" in p for p in verify_container(dst))
    last = doc["experts"][-1]
    assert any(
        p.startswith(f"layer {last['layer']} expert {last['expert']}:")
        for p in verify_container(dst)
    )
    with pytest.raises(ModelFormatError, match="truncated"):
        load_native(dst)
    (dst / MANIFEST).unlink()
    assert "no manifest.json" in verify_container(dst)[0]


def test_newer_version_rejected(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    dst = tmp_path / "c"
    write_container(open_model_source(tiny_models["llama"].gguf["Q8_0"]), dst)
    doc = json.loads((dst / MANIFEST).read_text())
    doc["version"] = 2
    (dst / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(colibri.errors.UnsupportedError, match="version 2"):
        load_native(dst)
    shutil.rmtree(dst)
    with pytest.raises(colibri.errors.ModelNotFoundError):
        load_native(dst)


def test_model_load_opens_a_container_like_its_source(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    """open_model_source dispatches a container directory, so Model.load (and the
    tokenizer) work on it unchanged."""
    src = tiny_models["qwen2_moe"].gguf["Q8_0"]
    dst = tmp_path / "m.colibri"
    write_container(open_model_source(src), dst)
    ids = [1, 5, 9, 33, 7]
    a = colibri.Model.load(src).session().forward(ids, all_logits=True)
    b = colibri.Model.load(dst).session().forward(ids, all_logits=True)
    np.testing.assert_array_equal(a, b)
    text = "ab ba"
    assert colibri.Model.load(dst).tokenizer.encode(text) == (
        colibri.Model.load(src).tokenizer.encode(text)
    )
    (dst / "manifest.json").unlink()
    (dst / "convert.journal").write_text("")
    with pytest.raises(ModelFormatError, match="interrupted"):
        colibri.Model.load(dst)
