"""A safetensors file as (header length, header JSON, data), and back."""

from __future__ import annotations

import json
import struct
from typing import Any


def parse(buf: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack("<Q", buf[:8])
    header: dict[str, Any] = json.loads(buf[8 : 8 + n])
    return header, buf[8 + n :]


def serialize(header: Any, data: bytes, *, length: int | None = None) -> tuple[bytes, list[int]]:
    """The file (header padded with spaces to 8 bytes, as the reference writer does) and
    the offsets where its parts end: the length field, the header, each tensor."""
    raw = json.dumps(header, separators=(",", ":"), allow_nan=True).encode("utf-8", "surrogatepass")
    raw += b" " * (-len(raw) % 8)
    n = len(raw) if length is None else length
    out = struct.pack("<Q", n & (2**64 - 1)) + raw + data
    marks = [8, 8 + len(raw)]
    if isinstance(header, dict):
        for info in header.values():
            if isinstance(info, dict) and isinstance(info.get("data_offsets"), list):
                end = info["data_offsets"][-1] if info["data_offsets"] else 0
                if isinstance(end, int) and 0 <= end <= len(data):
                    marks.append(8 + len(raw) + end)
    return out, sorted(set(marks))
