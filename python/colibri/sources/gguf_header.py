"""A fast reader for the header of a GGUF file (llama.cpp's format).

``gguf.GGUFReader`` builds a NumPy view for every element of every metadata array while it
opens a file (seconds for a 50k-token vocabulary, ~20 s for 150k on a 2-core machine) and
maps every tensor. Colibri needs only the header, so :func:`read_gguf_header` walks it
directly: scalar arrays are read in bulk with NumPy, string arrays with one tight loop,
and the tensor infos (name, GGML dims, type, offset) are returned without touching the
tensor data. The metadata values are what ``gguf.ReaderField.contents()`` returns (Python
scalars, ``str``, lists), except that a string that is not valid UTF-8 is kept with
surrogate escapes (llama.cpp keeps the bytes) instead of failing.

Layout (GGUF v2/v3): magic ``GGUF``, u32 version, u64 tensor count, u64 key/value count,
the key/values, the tensor infos, padding to ``general.alignment`` (default 32), then the
tensor data; each tensor's offset is relative to that data start.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFormatError, ModelNotFoundError
from .paths import shown

# GGML_TYPES: id -> (name, block, bytes) of every GGML type (tests compare it with gguf's).
from .quant_types import GGML_TYPES as GGML_TYPES
from .quant_types import ggml_type

GGUF_MAGIC = b"GGUF"
GGUF_DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
_MAX_NESTING = 8  # arrays of arrays: a corrupt header must not recurse without bound

# GGUF value types (gguf.GGUFValueType).
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY = range(10)
_UINT64, _INT64, _FLOAT64 = 10, 11, 12
_SCALARS = {
    _UINT8: "B", _INT8: "b", _UINT16: "H", _INT16: "h", _UINT32: "I", _INT32: "i",
    _FLOAT32: "f", _BOOL: "?", _UINT64: "Q", _INT64: "q", _FLOAT64: "d",
}  # fmt: skip
_NUMPY = {
    _UINT8: "u1", _INT8: "i1", _UINT16: "u2", _INT16: "i2", _UINT32: "u4", _INT32: "i4",
    _FLOAT32: "f4", _BOOL: "?", _UINT64: "u8", _INT64: "i8", _FLOAT64: "f8",
}  # fmt: skip

def ggml_type_info(type_id: int) -> tuple[str, int, int] | None:
    """(name, elements per block, bytes per block) of a GGML type id; None if unknown."""
    return ggml_type(type_id)


class GGUFHeaderError(ModelFormatError):
    """The header cannot be parsed. ``detail`` is the message without the file name."""

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(f"{where}: {detail}")
        self.where = where
        self.detail = detail


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor info. ``dims`` is in GGML order (``ne[0]``, the row length, first)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to GGUFHeader.data_start

    @property
    def type_name(self) -> str:
        info = ggml_type_info(self.ggml_type)
        return info[0] if info is not None else f"type {self.ggml_type}"

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape in NumPy/PyTorch order (``dims`` reversed)."""
        return self.dims[::-1]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n

    @property
    def n_bytes(self) -> int:
        info = ggml_type_info(self.ggml_type)
        if info is None:
            raise ModelFormatError(f"tensor {shown(self.name)}: unknown GGML type {self.ggml_type}")
        _name, block, size = info
        return self.n_elements // block * size


@dataclass(frozen=True)
class GGUFHeader:
    """The parsed header of a GGUF file (no tensor data)."""

    where: str
    version: int
    byte_order: str  # "<" or ">" (a file written on a big-endian host)
    metadata: dict[str, Any]
    tensors: tuple[GGUFTensor, ...] = ()
    alignment: int = GGUF_DEFAULT_ALIGNMENT
    data_start: int = 0  # absolute file offset of the tensor data (0 if not read)
    tensor_count: int = 0
    tensor_by_name: Mapping[str, GGUFTensor] = field(default_factory=dict, repr=False)

    def data_offset(self, t: GGUFTensor) -> int:
        """Absolute file offset of a tensor's data."""
        return self.data_start + t.offset

    def data_end(self) -> int:
        """The file size the header requires: the end of its last tensor's data."""
        end = self.data_start
        for t in self.tensors:
            end = max(end, self.data_start + t.offset + t.n_bytes)
        return end


def read_gguf_header(
    path: str | os.PathLike[str], *, prefixes: tuple[str, ...] = (), tensors: bool = True
) -> GGUFHeader:
    """Parse the header of the GGUF file at ``path``.

    Only metadata keys that start with one of ``prefixes`` are kept (all when empty);
    ``tensors=False`` stops after the key/values. Raises ModelNotFoundError (no file) or
    GGUFHeaderError, a ModelFormatError (not a GGUF file, truncated or corrupt header).
    """
    p = Path(path)
    if p.is_dir():
        raise ModelNotFoundError(f"{p} is a directory, not a GGUF file")
    if not p.is_file():
        raise ModelNotFoundError(f"{p}: no such GGUF file")
    where = str(p)
    with open(p, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # an empty file cannot be mapped
            raise GGUFHeaderError(where, "empty file, not a GGUF file") from exc
        try:
            return parse_gguf_header(buf, where, prefixes=prefixes, tensors=tensors)
        finally:
            buf.close()


def parse_gguf_header(
    buf: mmap.mmap | bytes,
    where: str = "GGUF data",
    *,
    prefixes: tuple[str, ...] = (),
    tensors: bool = True,
) -> GGUFHeader:
    """:func:`read_gguf_header` on the bytes of a file (``bytes`` or an ``mmap``)."""
    if len(buf) < 8 or bytes(buf[:4]) != GGUF_MAGIC:
        raise GGUFHeaderError(where, "not a GGUF file (bad magic: it does not start with 'GGUF')")
    (version,) = struct.unpack_from("<I", buf, 4)
    order = "<"
    if version & 0xFFFF == 0:  # written on a big-endian host
        order = ">"
        (version,) = struct.unpack_from(">I", buf, 4)
    if version not in (2, 3):
        raise GGUFHeaderError(where, f"GGUF version {version} is not supported (2 or 3)")
    cur = _Cursor(buf, order, where)
    cur.pos = 8
    n_tensors = cur.take("Q")
    n_kv = cur.take("Q")
    # Counts against the bytes that follow (a key/value takes at least 13 bytes, a tensor
    # info 24), so a claim of 2**63 entries fails here rather than after a long loop.
    left = cur.size - cur.pos
    if n_kv > left // 13 or n_tensors > left // 24:
        raise cur.error(
            f"it claims {n_kv} key/values and {n_tensors} tensors, more than the "
            f"{left} bytes that follow can hold"
        )
    md: dict[str, Any] = {}
    seen: set[str] = set()
    alignment = GGUF_DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = cur.string(strict=True, what="metadata key")
        if key in seen:
            raise cur.error(f"duplicate metadata key {shown(key)}")
        seen.add(key)
        vtype = cur.take("I")
        value = cur.value(vtype, key)
        if key == "general.alignment":
            if vtype != _UINT32 or value == 0 or value & (value - 1):
                raise cur.error(
                    f"general.alignment must be a power of two (u32), not {shown(value)}"
                )
            alignment = value
        if not prefixes or key.startswith(prefixes):
            md[key] = value
    if not tensors:
        return GGUFHeader(where, version, order, md, alignment=alignment, tensor_count=n_tensors)
    infos: list[GGUFTensor] = []
    by_name: dict[str, GGUFTensor] = {}
    for _ in range(n_tensors):
        t = cur.tensor_info()
        if t.name in by_name:
            raise cur.error(f"duplicate tensor {shown(t.name)}")
        by_name[t.name] = t
        infos.append(t)
    data_start = -(-cur.pos // alignment) * alignment
    return GGUFHeader(
        where, version, order, md, tuple(infos), alignment, data_start, n_tensors, by_name
    )


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, order: str, where: str) -> None:
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.order = order
        self.where = where
        self._q = struct.Struct(order + "Q").unpack_from

    def error(self, detail: str) -> GGUFHeaderError:
        return GGUFHeaderError(self.where, f"corrupt GGUF header: {detail} (at byte {self.pos})")

    def truncated(self, what: str) -> GGUFHeaderError:
        return GGUFHeaderError(
            self.where, f"GGUF header is truncated ({what} at byte {self.pos} of {self.size})"
        )

    def take(self, fmt: str) -> Any:
        s = struct.Struct(self.order + fmt)
        if self.pos + s.size > self.size:
            raise self.truncated("value")
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def string(self, *, strict: bool = False, what: str = "string") -> str:
        if self.pos + 8 > self.size:
            raise self.truncated(what)
        (n,) = self._q(self.buf, self.pos)
        start, end = self.pos + 8, self.pos + 8 + n
        if end > self.size:
            raise self.truncated(what)
        raw = bytes(self.buf[start:end])
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if strict:
                raise self.error(f"{what} of {len(raw)} bytes is not UTF-8") from exc
            # llama.cpp keeps the bytes; a vocabulary entry that is not UTF-8 is kept as
            # text with surrogate escapes so that it still maps to one distinct token.
            s = raw.decode("utf-8", errors="surrogateescape")
        self.pos = end
        return s

    def value(self, vtype: int, key: str, depth: int = 0) -> Any:
        fmt = _SCALARS.get(vtype)
        if fmt is not None:
            return self.take(fmt)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.take("I")
            n = self.take("Q")
            if etype in _NUMPY:
                dt = np.dtype(_NUMPY[etype]).newbyteorder("<" if self.order == "<" else ">")
                end = self.pos + n * dt.itemsize
                if end > self.size:
                    raise self.truncated(f"array {shown(key)}")
                arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
                self.pos = end
                out: list[Any] = arr.tolist()
                del arr  # release the buffer export before the mmap closes
                return out
            if etype == _STRING:
                return self._strings(n, key)
            if etype == _ARRAY and depth >= _MAX_NESTING:
                raise self.error(f"arrays nested deeper than {_MAX_NESTING} in key {shown(key)}")
            if etype == _ARRAY or n == 0:
                return [self.value(etype, key, depth + 1) for _ in range(n)]
        raise self.error(f"unknown value type {vtype} for key {shown(key)}")

    def _strings(self, n: int, key: str) -> list[str]:
        buf, pos, size, q = self.buf, self.pos, self.size, self._q
        out: list[str] = []
        append = out.append
        try:
            for _ in range(n):
                (ln,) = q(buf, pos)
                pos += 8
                end = pos + ln
                if end > size:
                    raise IndexError
                raw = buf[pos:end]
                try:
                    append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    append(bytes(raw).decode("utf-8", errors="surrogateescape"))
                pos = end
        except (IndexError, struct.error):
            self.pos = pos
            raise self.truncated(f"string array {shown(key)}") from None
        self.pos = pos
        return out

    def tensor_info(self) -> GGUFTensor:
        name = self.string(strict=True, what="tensor name")
        n_dims = self.take("I")
        if n_dims > GGML_MAX_DIMS:
            raise self.error(
                f"tensor {shown(name)} has {n_dims} dimensions (at most {GGML_MAX_DIMS})"
            )
        end = self.pos + 8 * n_dims
        if end > self.size:
            raise self.truncated(f"tensor {shown(name)}")
        dims = struct.unpack_from(f"{self.order}{n_dims}Q", self.buf, self.pos)
        self.pos = end
        n = 1
        for d in dims:
            n *= d
        if n >= 2**63:  # llama.cpp's limit too: the element count must fit an int64
            raise self.error(f"tensor {shown(name)} has dimensions {list(dims)} ({n} elements)")
        ggml_type = self.take("I")
        offset = self.take("Q")
        info = ggml_type_info(ggml_type)
        if info is None:
            raise self.error(f"tensor {shown(name)} has unknown GGML type {ggml_type}")
        if n_dims and dims[0] % info[1]:
            raise self.error(
                f"tensor {shown(name)} ({info[0]}) has rows of {dims[0]} elements, not a multiple "
                f"of its block size {info[1]}"
            )
        return GGUFTensor(name, tuple(int(d) for d in dims), ggml_type, offset)
