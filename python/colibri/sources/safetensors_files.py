"""Safetensors files of a Hugging Face checkpoint: which shard files a directory names
(its ``model.safetensors.index.json``, or every ``*.safetensors``; each confined to the
model directory) and each file's header, parsed and checked against the file (8-byte
little-endian length + JSON, ``data_offsets`` relative to the end of the header). Tensor
bytes stay on disk; hf_source.py describes them by extents.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError
from .fields import as_int, bad
from .paths import ModelDir, shown
from .quant_types import bytes_per_element
from .validate import check_packed

__all__ = ["FLOAT_DTYPES", "FP8_DTYPE", "ITEMSIZE", "read_safetensors_header", "shard_files"]

# Read as they are: bytes per element (safetensors names these types as GGML does).
FLOAT_DTYPES = {n: bytes_per_element(n) for n in ("F32", "F16", "BF16")}
FP8_DTYPE = "F8_E4M3"  # safetensors' name for torch.float8_e4m3fn (the core's name too)
# Bytes per element, for the header's size checks.
ITEMSIZE = {**FLOAT_DTYPES, FP8_DTYPE: bytes_per_element(FP8_DTYPE)}
_MAX_HEADER = 100 * 1024 * 1024



def _header_entry(path: Path, name: str, info: Any) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of one header entry, every field typed."""
    what = f"{path}: header entry {shown(name)}"
    if not isinstance(info, dict):
        raise ModelFormatError(f"{what} is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str):
        raise bad(what, "dtype", dtype, "a string")
    if not isinstance(shape, list):
        raise bad(what, "shape", shape, "a list of sizes")
    dims = tuple(as_int(d, "shape", what) for d in shape)
    if not isinstance(offsets, list) or len(offsets) != 2:
        raise bad(what, "data_offsets", offsets, "[begin, end]")
    b, e = (as_int(x, "data_offsets", what, hi=2**63 - 1) for x in offsets)
    return dtype, dims, b, e


def read_safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """name -> (dtype, shape, absolute offset, length) for every tensor in the file.

    Checks that the header parses, that every tensor's bytes lie inside the file and that
    the tensors fill the data region exactly, without gaps (the format requires it: a gap
    means a header that no longer describes the bytes, e.g. a shifted header length).
    """
    size = os.stat(path).st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ModelFormatError(f"{path}: {size} bytes, too short to be a safetensors file")
        (n,) = struct.unpack("<Q", head)
        # The length field is arbitrary bytes in a file that is not safetensors: say so,
        # without echoing them as a number.
        if n < 2 or n > min(size - 8, _MAX_HEADER):
            raise ModelFormatError(
                f"{path}: not a safetensors file, or a truncated one: its 8-byte header "
                f"length does not fit the file ({size} bytes)."
            )
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelFormatError(
            f"{path}: not a safetensors file: its header is not UTF-8 (byte {exc.start})"
        ) from exc
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ModelFormatError(
            f"{path}: not a safetensors file: its header is not valid JSON ({shown(exc)})"
        ) from exc
    if not isinstance(header, dict):
        raise ModelFormatError(f"{path}: not a safetensors file: its header is not a JSON object")
    start = 8 + n
    out: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, b, e = _header_entry(path, name, info)
        if e < b or start + e > size:
            raise ModelFormatError(
                f"{path}: tensor {shown(name)} claims bytes [{start + b}, {start + e}) but the "
                f"file is {size} bytes (expected at least {start + e}). The file is truncated "
                f"or its header is corrupt."
            )
        if dtype in ITEMSIZE:
            numel = math.prod(shape)
            if e - b != numel * ITEMSIZE[dtype]:
                raise ModelFormatError(
                    f"{path}: tensor {shown(name)} ({dtype}, shape {shape}) needs "
                    f"{numel * ITEMSIZE[dtype]} bytes but its header gives {e - b}. "
                    f"The header is corrupt."
                )
        out[name] = (dtype, shape, start + b, e - b)
    check_packed(((o, o + n_, k) for k, (_d, _s, o, n_) in out.items()), start, size, 0, path)
    return out


def shard_files(d: Path, root: ModelDir) -> list[Path]:
    index = root.optional("model.safetensors.index.json", "safetensors index")
    if index is not None:
        try:
            doc = json.loads(index.read_bytes())
        except (OSError, ValueError, RecursionError) as exc:
            raise ModelFormatError(
                f"{index}: not a valid safetensors index ({shown(exc)})"
            ) from exc
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFormatError(f"{index}: not a valid safetensors index (no weight_map)")
        names: list[str] = []
        for tensor, shard in weight_map.items():
            if not isinstance(shard, str):
                raise bad(index, f"weight_map[{shown(tensor)}]", shard, "a shard file name")
            if shard not in names:
                names.append(shard)
        # Each shard once, in name order; every one inside the model directory.
        return [root.file(n, "shard", index) for n in sorted(names)]
    files = [root.listed(f, "safetensors file") for f in sorted(d.glob("*.safetensors"))]
    if not files:
        raise ModelFormatError(
            f"{d}: config.json found but no *.safetensors weights. colibri reads safetensors "
            f"checkpoints (save with safe_serialization=True)."
        )
    return files
