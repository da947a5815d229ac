"""Reading the tokenizer metadata of a GGUF file.

``gguf.GGUFReader`` builds a NumPy view for every element of every array while it opens a
file: about 20 s for a 150k-token vocabulary on a 2-core machine. A tokenizer needs only
the key/value header, so :func:`read_metadata` walks it directly (a fraction of a second)
and stops before the tensor infos. An already open ``GGUFReader`` is accepted as well
(:func:`metadata_from_reader`), so a caller that has one does not parse the file twice.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFormatError, ModelNotFoundError

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


class _Cursor:
    def __init__(self, buf: mmap.mmap | bytes, order: str, where: str) -> None:
        self.buf = buf
        self.pos = 0
        self.order = order
        self.where = where

    def take(self, fmt: str) -> Any:
        s = struct.Struct(self.order + fmt)
        if self.pos + s.size > len(self.buf):
            raise ModelFormatError(f"{self.where}: GGUF header is truncated (at byte {self.pos})")
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def string(self) -> str:
        n = self.take("Q")
        end = self.pos + n
        if end > len(self.buf):
            raise ModelFormatError(f"{self.where}: GGUF header is truncated (string at {self.pos})")
        raw = self.buf[self.pos : end]
        self.pos = end
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            # llama.cpp keeps the bytes; a vocabulary entry that is not UTF-8 is kept as
            # text with surrogate escapes so that it still maps to one distinct token.
            return bytes(raw).decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            etype = self.take("I")
            n = self.take("Q")
            if etype in _NUMPY:
                dt = np.dtype(_NUMPY[etype]).newbyteorder("<" if self.order == "<" else ">")
                end = self.pos + n * dt.itemsize
                if end > len(self.buf):
                    raise ModelFormatError(f"{self.where}: GGUF header is truncated (array)")
                arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos)
                self.pos = end
                return arr.tolist()
            if etype == _STRING:
                return self._strings(n)
            return [self.value(etype) for _ in range(n)]
        raise ModelFormatError(f"{self.where}: unknown GGUF value type {vtype} at byte {self.pos}")

    def _strings(self, n: int) -> list[str]:
        buf, pos, size = self.buf, self.pos, len(self.buf)
        q = struct.Struct(self.order + "Q").unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(n):
            if pos + 8 > size:
                raise ModelFormatError(f"{self.where}: GGUF header is truncated (string array)")
            (ln,) = q(buf, pos)
            pos += 8
            end = pos + ln
            if end > size:
                raise ModelFormatError(f"{self.where}: GGUF header is truncated (string array)")
            raw = buf[pos:end]
            try:
                append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                append(bytes(raw).decode("utf-8", errors="surrogateescape"))
            pos = end
        self.pos = pos
        return out


def read_metadata(path: str | os.PathLike[str], prefixes: tuple[str, ...] = ()) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (keys starting with one of ``prefixes``; all
    keys when it is empty). Raises ModelNotFoundError / ModelFormatError."""
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
            raise ModelFormatError(f"{where}: empty file, not a GGUF model") from exc
        try:
            return _parse(buf, where, prefixes)
        finally:
            buf.close()


def _parse(buf: mmap.mmap | bytes, where: str, prefixes: tuple[str, ...]) -> dict[str, Any]:
    if len(buf) < 8 or bytes(buf[:4]) != b"GGUF":
        raise ModelFormatError(f"{where}: not a GGUF file (bad magic {bytes(buf[:4])!r})")
    (version,) = struct.unpack_from("<I", buf, 4)
    order = "<"
    if version & 0xFFFF == 0:  # written on a big-endian host
        order = ">"
        (version,) = struct.unpack_from(">I", buf, 4)
    if version not in (2, 3):
        raise ModelFormatError(f"{where}: GGUF version {version} is not supported (2 or 3)")
    cur = _Cursor(buf, order, where)
    cur.pos = 8
    cur.take("Q")  # tensor count
    n_kv = cur.take("Q")
    md: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.take("I")
        value = cur.value(vtype)
        if not prefixes or key.startswith(prefixes):
            md[key] = value
    return md


def metadata_from_reader(reader: Any, prefixes: tuple[str, ...] = ()) -> dict[str, Any]:
    """The same dictionary as :func:`read_metadata`, from an open ``gguf.GGUFReader``."""
    md: dict[str, Any] = {}
    try:
        fields = reader.fields
    except AttributeError as exc:
        raise TypeError(
            f"expected a path or a gguf.GGUFReader, got {type(reader).__name__}"
        ) from exc
    for key, field in fields.items():
        if key.startswith("GGUF.") or (prefixes and not key.startswith(prefixes)):
            continue
        try:
            md[key] = field.contents()
        except (UnicodeDecodeError, ValueError, IndexError) as exc:
            raise ModelFormatError(f"GGUF metadata key {key!r} cannot be decoded: {exc}") from exc
    return md
