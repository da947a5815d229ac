"""Defect 6 of issue 8 (checksums) and the crc32 behind it.

* dense.bin is verified at load: a 1-byte corruption is a ModelFormatError (it used to
  load and compute garbage); IOConfig.checksums="off" skips the check.
* "first" re-verifies blobs once their file changed (test_streaming_faults.py,
  test_checksums_catch_a_file_changed_after_the_first_read).
* The core's crc32 (PCLMUL folding where the CPU has it) equals zlib's, the polynomial the
  container was written with, for every length and alignment; its folding constants are
  derived here from the polynomial, independently of the C++ source.
"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import numpy as np
import pytest

import colibri as co
from colibri import _core
from colibri.convert import verify_container, write_container
from colibri.errors import ModelFormatError
from support.modelfactory import TinyModel
from support.untrusted import copy_dir


@pytest.fixture(scope="module")
def smallc(tiny_models: dict[str, TinyModel], tmp_path_factory: pytest.TempPathFactory) -> Path:
    c = tmp_path_factory.mktemp("ck") / "c"
    write_container(tiny_models["qwen2_moe"].gguf["Q8_0"], c)
    return c


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))


def test_dense_checksums_verified_at_load(smallc: Path, tmp_path: Path) -> None:
    c = copy_dir(smallc, tmp_path / "c")
    doc = json.loads((c / "manifest.json").read_text())
    rec = next(r for r in doc["dense"] if r["name"] == "blk.1.attn_q")
    ref = co.Model.load(c).session().forward([1, 2, 3])
    _flip(c / "dense.bin", rec["offset"] + rec["length"] // 2)
    with pytest.raises(ModelFormatError, match=r"'blk\.1\.attn_q'.*fails its checksum"):
        co.Model.load(c)
    assert any("blk.1.attn_q" in p for p in verify_container(c))
    off = co.Model.load(c, co.EngineConfig(io=co.IOConfig(checksums="off")))
    assert not np.array_equal(off.session().forward([1, 2, 3]), ref)  # what "off" risks


def test_dense_checksum_covers_every_tensor(smallc: Path, tmp_path: Path) -> None:
    """Each dense tensor's bytes, exactly: flipping the last byte of any one is caught,
    flipping a padding byte between tensors is not (nothing reads it)."""
    doc = json.loads((smallc / "manifest.json").read_text())
    rng = random.Random(0)
    for rec in rng.sample(doc["dense"], 4):
        c = copy_dir(smallc, tmp_path / rec["name"])
        _flip(c / "dense.bin", rec["offset"] + rec["length"] - 1)
        with pytest.raises(ModelFormatError, match="fails its checksum"):
            co.Model.load(c)


# --------------------------------------------------------------------------- crc32

P = 0x104C11DB7  # CRC-32 (zlib / ISO-HDLC), normal form


def _fold_constant(n: int) -> int:
    """x^n mod P, bit-reflected in 32 bits and shifted left by one: the multiplier that
    moves a reflected 64-bit half n - 64 bits forward (csrc/io/crc32.cpp, K(n))."""
    r = 1
    for _ in range(n):
        r <<= 1
        if r >> 32 & 1:
            r ^= P
    return int(f"{r:032b}"[::-1], 2) << 1


def test_fold_constants_derive_from_the_polynomial() -> None:
    src = (Path(__file__).resolve().parents[2] / "csrc" / "io" / "crc32.cpp").read_text()
    for n, name in ((1056, "kFold1024Lo"), (992, "kFold1024Hi"),
                    (160, "kFold128Lo"), (96, "kFold128Hi")):  # fmt: skip
        assert f"{name} = {_fold_constant(n):#x};" in src, name


def test_crc32_equals_zlib() -> None:
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    for n in [*range(0, 300), 511, 512, 513, 4095, 4096, 65537, 1 << 20]:
        for start in (0, 1, 7):  # unaligned buffers too
            chunk = data[start : start + n]
            init = int(rng.integers(0, 2**32))
            assert _core.io.crc32(chunk, init) == zlib.crc32(chunk, init), (n, start)
    a, b = data[:1000], data[1000:70000]
    assert _core.io.crc32(b, _core.io.crc32(a)) == zlib.crc32(a + b)  # continues like zlib
    assert _core.io.crc32(data, 0, True) == zlib.crc32(data)  # the reference path is zlib


def test_crc32_of_a_real_blob_matches_the_manifest(smallc: Path) -> None:
    doc = json.loads((smallc / "manifest.json").read_text())
    data = (smallc / "experts.bin").read_bytes()
    for rec in doc["experts"][:8]:
        blob = data[rec["offset"] : rec["offset"] + rec["length"]]
        assert _core.io.crc32(blob) == rec["crc32"]
