"""A GGUF file as fields, and back: what the GGUF mutators edit.

Parsed independently of colibri's reader (a fuzzer must not share the code it tests).
:func:`parse` keeps every key/value with its value type (and element type for arrays),
every tensor info and the data region; :func:`serialize` writes them back (byte-identical
for an unmodified document, tested) and reports the byte offsets where fields end, so
that truncation can cut at field boundaries. A value is written as its declared type, so
a mutator that changes a type must change the value to match, unless it wants the bytes
of one type read as another (``KV.raw``).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
              U64: "Q", I64: "q", F64: "d"}  # fmt: skip
INT_TYPES = (U8, I8, U16, I16, U32, I32, U64, I64)
FLOAT_TYPES = (F32, F64)


@dataclass
class KV:
    key: str | bytes
    vtype: int
    value: Any
    etype: int = -1  # element type of an array
    raw: bytes | None = None  # written instead of the encoded value when set


@dataclass
class TensorInfo:
    name: str | bytes
    dims: list[int]
    ggml_type: int
    offset: int


@dataclass
class GGUFDoc:
    version: int
    kvs: list[KV]
    tensors: list[TensorInfo]
    data: bytes  # from the aligned data start to the end of the file
    alignment: int = 32
    n_kv: int | None = None  # written instead of len(kvs) when set (a lying count)
    n_tensors: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class _Reader:
    def __init__(self, buf: bytes) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v

    def string(self) -> str | bytes:
        n = self.take("Q")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw

    def value(self, vtype: int) -> tuple[Any, int]:
        if vtype in SCALAR_FMT:
            return self.take(SCALAR_FMT[vtype]), -1
        if vtype == STRING:
            return self.string(), -1
        if vtype == ARRAY:
            etype, n = self.take("I"), self.take("Q")
            return [self.value(etype)[0] for _ in range(n)], etype
        raise ValueError(f"value type {vtype}")


def parse(buf: bytes) -> GGUFDoc:
    r = _Reader(buf)
    assert buf[:4] == b"GGUF"
    r.pos = 4
    version = r.take("I")
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    kvs: list[KV] = []
    alignment = 32
    for _ in range(n_kv):
        key = r.string()
        vtype = r.take("I")
        value, etype = r.value(vtype)
        kvs.append(KV(key, vtype, value, etype))
        if key == "general.alignment":
            alignment = value
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        tensors.append(TensorInfo(name, dims, r.take("I"), r.take("Q")))
    start = -(-r.pos // alignment) * alignment
    return GGUFDoc(version, kvs, tensors, buf[start:], alignment)


def _enc_str(s: str | bytes) -> bytes:
    raw = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def _enc_value(vtype: int, value: Any, etype: int) -> bytes:
    if vtype in SCALAR_FMT:
        fmt = "<" + SCALAR_FMT[vtype]
        try:
            return struct.pack(fmt, value)
        except (struct.error, TypeError, OverflowError):
            # A value that does not fit its type: the nearest thing that does (a float
            # too large for f32 is infinity; anything else, the bytes of 0).
            if vtype in FLOAT_TYPES and isinstance(value, int | float):
                return struct.pack(fmt, math.copysign(math.inf, value))
            return bytes(struct.calcsize(fmt))
    if vtype == STRING:
        return _enc_str(value if isinstance(value, str | bytes) else str(value))
    if vtype == ARRAY:
        items = value if isinstance(value, list) else [value]
        out = [struct.pack("<IQ", etype, len(items))]
        for v in items:
            out.append(_enc_value(etype, v, -1 if etype != ARRAY else STRING))
        return b"".join(out)
    return b""  # an unknown type: nothing follows (the reader must reject it)


def serialize(doc: GGUFDoc) -> tuple[bytes, list[int]]:
    """The file's bytes and the offsets at which header fields end."""
    out = bytearray(b"GGUF")
    marks: list[int] = []

    def put(b: bytes) -> None:
        out.extend(b)
        marks.append(len(out))

    put(struct.pack("<I", doc.version))
    put(struct.pack("<Q", len(doc.tensors) if doc.n_tensors is None else doc.n_tensors))
    put(struct.pack("<Q", len(doc.kvs) if doc.n_kv is None else doc.n_kv))
    for kv in doc.kvs:
        put(_enc_str(kv.key))
        put(struct.pack("<I", kv.vtype))
        put(kv.raw if kv.raw is not None else _enc_value(kv.vtype, kv.value, kv.etype))
    for t in doc.tensors:
        put(_enc_str(t.name))
        put(struct.pack("<I", len(t.dims)))
        put(b"".join(struct.pack("<Q", d) for d in t.dims))
        put(struct.pack("<I", t.ggml_type))
        put(struct.pack("<Q", t.offset))
    align = doc.alignment if isinstance(doc.alignment, int) and doc.alignment > 0 else 32
    out.extend(bytes(-len(out) % align))
    marks.append(len(out))
    out.extend(doc.data)
    return bytes(out), marks


def fits(vtype: int, value: Any) -> bool:
    """Whether ``value`` can be encoded as ``vtype``."""
    if vtype in INT_TYPES:
        fmt = SCALAR_FMT[vtype]
        bits = struct.calcsize(fmt) * 8
        lo, hi = (0, 2**bits - 1) if fmt.isupper() else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
    if vtype in FLOAT_TYPES:
        return isinstance(value, float | int) and not isinstance(value, bool)
    if vtype == BOOL:
        return isinstance(value, bool)
    if vtype == STRING:
        return isinstance(value, str | bytes)
    return vtype == ARRAY
