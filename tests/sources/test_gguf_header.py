"""The fast GGUF header parser (colibri.sources.gguf_header) against gguf.GGUFReader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from colibri.errors import ModelFormatError, ModelNotFoundError
from colibri.sources import open_model_source
from colibri.sources.gguf_header import (
    GGML_TYPES,
    GGUFHeader,
    GGUFHeaderError,
    parse_gguf_header,
    read_gguf_header,
)
from colibri.tokenizers import Tokenizer
from support.modelfactory import TinyModel
from support.realmodel import smollm2_gguf


def assert_same_as_reader(path: Path, header: GGUFHeader) -> None:
    reader = gguf.GGUFReader(path)
    want: dict[str, Any] = {
        k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")
    }
    assert list(header.metadata) == list(want)
    for key, value in want.items():
        assert header.metadata[key] == value, key
        assert type(header.metadata[key]) is type(value), key
    assert header.alignment == reader.alignment
    assert header.data_start == reader.data_offset
    assert header.tensor_count == len(reader.tensors)
    assert len(header.tensors) == len(reader.tensors)
    for t, r in zip(header.tensors, reader.tensors, strict=True):
        assert t.name == r.name
        assert t.dims == tuple(int(d) for d in r.shape)
        assert t.ggml_type == int(r.tensor_type)
        assert t.type_name == r.tensor_type.name
        assert header.data_offset(t) == r.data_offset
        assert t.n_elements == r.n_elements
        assert t.n_bytes == r.n_bytes
        assert header.tensor_by_name[t.name] is t
    ends = [r.data_offset + r.n_bytes for r in reader.tensors]
    assert header.data_end() == max(ends, default=reader.data_offset)


def test_ggml_type_table_matches_gguf() -> None:
    want = {int(t): (t.name, b, s) for t, (b, s) in gguf.GGML_QUANT_SIZES.items()}
    assert {k: v for k, v in GGML_TYPES.items() if k in want} == want


def test_smollm2_matches_gguf_reader() -> None:
    path = smollm2_gguf()
    header = read_gguf_header(path)
    assert_same_as_reader(path, header)
    assert len(header.metadata["tokenizer.ggml.tokens"]) == 49152
    assert len(header.metadata["tokenizer.ggml.merges"]) == 48900
    assert header.version == 3 and header.byte_order == "<"


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_0"])
def test_tiny_models_match_gguf_reader(tiny_models: dict[str, TinyModel], qtype: str) -> None:
    for t in tiny_models.values():
        path = t.gguf[qtype]
        assert_same_as_reader(path, read_gguf_header(path))


def _write(path: Path, endian: gguf.GGUFEndian = gguf.GGUFEndian.LITTLE, align: int = 0) -> None:
    w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    if align:
        w.add_custom_alignment(align)
    w.add_uint8("t.u8", 7)
    w.add_int16("t.i16", -3)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.floats", [0.5, 1.5, -2.0])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.bools", [True, False])
    w.add_array("t.strs", ["a", "", "ü€", "<|im_start|>"])
    for i, shape in enumerate([(3, 64), (5,), (2, 2, 32)]):
        data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + i
        w.add_tensor(f"w{i}", data)  # the writer swaps the bytes for a big-endian file
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("align", [0, 64, 1024])
def test_written_file_matches_gguf_reader(tmp_path: Path, align: int) -> None:
    p = tmp_path / "kv.gguf"
    _write(p, align=align)
    header = read_gguf_header(p)
    assert_same_as_reader(p, header)
    assert header.alignment == (align or 32) and header.data_start % header.alignment == 0
    assert header.metadata["t.strs"] == ["a", "", "ü€", "<|im_start|>"]
    assert [t.shape for t in header.tensors] == [(3, 64), (5,), (2, 2, 32)]


def _kv(key: str, vtype: int, payload: bytes) -> bytes:
    k = key.encode()
    return len(k).to_bytes(8, "little") + k + vtype.to_bytes(4, "little") + payload


def test_empty_and_nested_arrays() -> None:
    def arr(etype: int, n: int, body: bytes = b"") -> bytes:
        return etype.to_bytes(4, "little") + n.to_bytes(8, "little") + body

    one = (1).to_bytes(8, "little") + b"x"
    kvs = [
        _kv("a.empty_u32", 9, arr(4, 0)),
        _kv("a.empty_str", 9, arr(8, 0)),
        _kv("a.nested", 9, arr(9, 2, arr(5, 1, b"\xff\xff\xff\xff") + arr(8, 1, one))),
        _kv("a.bad_utf8", 8, (2).to_bytes(8, "little") + b"\xc3\x28"),
    ]
    blob = b"GGUF" + (3).to_bytes(4, "little") + bytes(8) + len(kvs).to_bytes(8, "little")
    h = parse_gguf_header(blob + b"".join(kvs))
    assert h.metadata == {
        "a.empty_u32": [],
        "a.empty_str": [],
        "a.nested": [[-1], ["x"]],
        "a.bad_utf8": b"\xc3\x28".decode("utf-8", errors="surrogateescape"),
    }
    with pytest.raises(GGUFHeaderError, match="duplicate metadata key 'a.empty_u32'"):
        parse_gguf_header(blob[:-8] + (2).to_bytes(8, "little") + kvs[0] + kvs[0])
    with pytest.raises(GGUFHeaderError, match="unknown value type 13"):
        parse_gguf_header(blob[:-8] + (1).to_bytes(8, "little") + _kv("k", 13, b""))
    deep = _kv("k", 9, arr(9, 1) * 50 + arr(4, 0))
    with pytest.raises(GGUFHeaderError, match="nested deeper"):
        parse_gguf_header(blob[:-8] + (1).to_bytes(8, "little") + deep)
    align = _kv("general.alignment", 4, (48).to_bytes(4, "little"))
    with pytest.raises(GGUFHeaderError, match="power of two"):
        parse_gguf_header(blob[:-8] + (1).to_bytes(8, "little") + align)


def test_big_endian(tmp_path: Path) -> None:
    little, big = tmp_path / "le.gguf", tmp_path / "be.gguf"
    _write(little)
    _write(big, gguf.GGUFEndian.BIG)
    a, b = read_gguf_header(little), read_gguf_header(big)
    assert b.byte_order == ">" and a.byte_order == "<"
    assert b.metadata == a.metadata and b.tensors == a.tensors
    assert b.data_start == a.data_start


def test_prefixes_and_metadata_only(tiny_models: dict[str, TinyModel]) -> None:
    path = tiny_models["llama"].gguf["Q8_0"]
    full = read_gguf_header(path)
    tok = read_gguf_header(path, prefixes=("tokenizer.",), tensors=False)
    assert tok.metadata == {k: v for k, v in full.metadata.items() if k.startswith("tokenizer.")}
    assert tok.tensors == () and tok.tensor_count == full.tensor_count


def test_errors(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        read_gguf_header(tmp_path / "missing.gguf")
    with pytest.raises(ModelNotFoundError):
        read_gguf_header(tmp_path)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(GGUFHeaderError, match="empty"):
        read_gguf_header(tmp_path / "empty.gguf")
    with pytest.raises(GGUFHeaderError, match="bad magic"):
        parse_gguf_header(b"GGML" + bytes(100))
    with pytest.raises(GGUFHeaderError, match="version 7"):
        parse_gguf_header(b"GGUF\x07\x00\x00\x00" + bytes(100))

    data = tiny_models["llama"].gguf["Q8_0"].read_bytes()
    h = read_gguf_header(tiny_models["llama"].gguf["Q8_0"])
    start, end = h.data_start, h.data_start - h.alignment  # the infos end in (end, start]
    # Every cut inside the header is a clean, located error.
    for cut in sorted({*range(0, 64), *range(64, end, max(1, end // 300)), end}):
        with pytest.raises(GGUFHeaderError) as info:
            parse_gguf_header(data[:cut], "cut.gguf")
        assert str(info.value).startswith("cut.gguf: ")
    # Random byte damage: a ModelFormatError or a parse, never another exception.
    rng = np.random.default_rng(0)
    for _ in range(300):
        bad = bytearray(data[:start])
        for i in rng.integers(8, start, size=3):
            bad[i] = int(rng.integers(0, 256))
        try:
            parse_gguf_header(bytes(bad))
        except ModelFormatError:
            pass


def _patched_type(data: bytes, name: str, new_type: int) -> bytes:
    # The tensor info of ``name`` (1-D here) is name, u32 n_dims, u64 dim, u32 type, u64 offset.
    raw = name.encode()
    i = data.index(len(raw).to_bytes(8, "little") + raw) + 8 + len(raw)
    n_dims = int.from_bytes(data[i : i + 4], "little")
    j = i + 4 + 8 * n_dims
    return data[:j] + new_type.to_bytes(4, "little") + data[j + 4 :]


def test_unknown_tensor_type(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    data = tiny_models["llama"].gguf["F32"].read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(_patched_type(data, "output_norm.weight", 99))
    with pytest.raises(GGUFHeaderError, match="unknown GGML type 99"):
        read_gguf_header(bad)
    with pytest.raises(ModelFormatError, match="not a readable GGUF"):
        open_model_source(bad)


def test_tokenizer_from_manifest_metadata() -> None:
    path = smollm2_gguf()
    m = open_model_source(path)
    a = Tokenizer.from_gguf(path)
    b = Tokenizer.from_gguf_metadata(m.metadata, str(path))
    c = Tokenizer.from_gguf(m.metadata)
    text = "Hello <|im_start|>user\nwörld 123!"
    ids = a.encode(text, special=True)
    assert b.encode(text, special=True) == ids == c.encode(text, special=True)
    assert (b.vocab_size, b.bos_id, b.eos_ids, b.chat_template) == (
        a.vocab_size,
        a.bos_id,
        a.eos_ids,
        a.chat_template,
    )
