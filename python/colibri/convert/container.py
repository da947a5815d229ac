"""The native streaming container, version 1: the writer (the verifier is
:mod:`colibri.convert.verify`; the format's constants and the reader of manifest.json are
:mod:`colibri.sources.native_format`, re-exported here).

A container is a directory (``model.colibri/``)::

    manifest.json      written last, atomically: its presence means the container is whole
    dense.bin          every non-expert tensor, each at a 64-byte-aligned offset
    experts.bin        one blob per (layer, expert): gate, up, down, 4096-aligned and padded
    tokenizer files    copied from a Hugging Face source (tokenizer.json, ...), if any
    convert.journal    only while a conversion is unfinished (see write_container)

The specification is ``docs/format.md`` ("Native container"). With ``quant="keep"``
tensor bytes are copied unchanged from the source (same types, same block layout: a
relayout); another ``quant`` converts matrices to that type (:mod:`.quantize`), row chunk
by row chunk. FP8 block-scaled Hugging Face weights are always dequantized (:mod:`.fp8`).
Checksums are CRC-32 (``zlib.crc32``, the zlib polynomial): it is in the
standard library and runs in C at several GB/s, so verifying does not bottleneck a read;
the C++ reader can compute the same value with zlib's ``crc32()`` on the slab it just
read; and 32 bits are plenty to catch a torn write, a short read or bit rot, which is all
the checksum is for (it is not a defence against tampering).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    InvalidRequestError,
    ModelFormatError,
    ModelIOError,
    UnsupportedError,
)
from ..sources.hf_source import Fp8TensorInfo
from ..sources.manifest import Manifest, ModelConfig, TensorInfo
from ..sources.native_format import (
    ALIGNMENT,
    CHECKSUM,
    DENSE,
    EXPERTS,
    FORMAT,
    JOURNAL,
    MANIFEST,
    PROJECTIONS,
    TENSOR_ALIGNMENT,
    TOKENIZER_FILES,
    VERSION,
)
from ..sources.paths import ModelDir
from ..sources.quant_types import tensor_nbytes
from .quantize import check_quant, converted_chunks, target_dtype
from .source import open_convert_source, tensor_reader

__all__ = [  # the format's names are re-exported for callers that import them from here
    "ALIGNMENT", "CHECKSUM", "CHUNK", "DENSE", "EXPERTS", "FORMAT", "JOURNAL", "MANIFEST",
    "PROJECTIONS", "TENSOR_ALIGNMENT", "TOKENIZER_FILES", "VERSION", "WriteReport",
    "crc_range", "round_up", "write_container",
]  # fmt: skip

CHUNK = 16 << 20  # largest single read/write while copying
_EXPERT_RE = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.(\d+)$")

Progress = Callable[[int, int], None]


def round_up(n: int, a: int) -> int:
    return -(-n // a) * a


@dataclass(frozen=True)
class _Part:
    tensor: TensorInfo  # in the source
    offset: int  # from the start of the item
    dtype: str  # written as (the source's type: bytes copied; another: converted)
    nbytes: int  # written bytes

    @property
    def copied(self) -> bool:
        # A tensor the loader would transpose (MLA's W_UK from kv_b_proj) is written in its
        # final layout, so the container needs no load-time transform.
        return self.dtype == self.tensor.dtype and not self.tensor.transpose_heads


@dataclass(frozen=True)
class _Item:
    """One unit of the write: a dense tensor or an expert blob."""

    file: int  # 0: dense.bin, 1: experts.bin
    offset: int
    checked: int  # bytes the checksum covers (tensor bytes; the whole blob for experts)
    slot: int  # bytes the item occupies, padding included
    parts: tuple[_Part, ...]
    layer: int = -1
    expert: int = -1

    def label(self) -> str:
        if self.file == 1:
            return f"layer {self.layer} expert {self.expert}"
        return f"dense tensor {self.parts[0].tensor.name!r}"


@dataclass(frozen=True)
class WriteReport:
    items_total: int  # dense tensors + expert blobs
    items_written: int
    items_reused: int  # verified against the journal of an interrupted run and kept
    bytes_total: int  # dense.bin + experts.bin
    quant: str = "keep"  # the --quant choice


def _part(t: TensorInfo, offset: int, quant: str, config: ModelConfig) -> _Part:
    dtype = target_dtype(t, quant, config)
    return _Part(t, offset, dtype, tensor_nbytes(dtype, t.shape, t.name))


def _plan(manifest: Manifest, quant: str) -> list[_Item]:
    """Every item in write order: dense tensors (manifest order), then expert blobs by
    (layer, expert), each tensor in its output type."""
    experts: dict[tuple[int, int], dict[str, TensorInfo]] = {}
    dense: list[TensorInfo] = []
    for t in manifest.tensors.values():
        m = _EXPERT_RE.match(t.name)
        if m is None:
            dense.append(t)
            continue
        if t.rope_unpermute_heads:
            raise UnsupportedError(f"expert tensor {t.name!r} carries a RoPE permutation")
        experts.setdefault((int(m[1]), int(m[3])), {})[m[2]] = t
    items: list[_Item] = []
    off = 0
    for t in dense:
        part = _part(t, 0, quant, manifest.config)
        off = round_up(off, TENSOR_ALIGNMENT)
        slot = round_up(part.nbytes, TENSOR_ALIGNMENT)
        items.append(_Item(0, off, part.nbytes, slot, (part,)))
        off += slot
    off = 0
    for (layer, expert), projs in sorted(experts.items()):
        missing = [p for p in PROJECTIONS if p not in projs]
        if missing:
            raise ModelFormatError(
                f"{manifest.path}: layer {layer} expert {expert} has no {missing[0]} matrix"
            )
        parts: list[_Part] = []
        used = 0
        for p in PROJECTIONS:
            used = round_up(used, TENSOR_ALIGNMENT)
            parts.append(_part(projs[p], used, quant, manifest.config))
            used += parts[-1].nbytes
        slot = round_up(used, ALIGNMENT)
        items.append(_Item(1, off, slot, slot, tuple(parts), layer, expert))
        off += slot
    return items


def _totals(items: Sequence[_Item]) -> tuple[int, int]:
    ends = [0, 0]
    for it in items:
        ends[it.file] = max(ends[it.file], it.offset + it.slot)
    return ends[0], ends[1]


def _plan_digest(manifest: Manifest, items: Sequence[_Item]) -> str:
    """Identifies the layout and the source bytes: a journal with another digest is
    stale (another source, or the source changed) and is discarded."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{FORMAT}/{VERSION}\n".encode())
    for f in manifest.files:
        st = os.stat(f)
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    for it in items:
        h.update(f"{it.file}|{it.offset}|{it.checked}|{it.slot}".encode())
        for p in it.parts:
            t = p.tensor
            h.update(f"|{t.name}|{t.dtype}|{t.shape}|{p.offset}|{t.extents}|{p.dtype}"
                     f"|{t.transpose_heads}".encode())
            if isinstance(t, Fp8TensorInfo):
                h.update(f"|{t.scale.dtype}|{t.scale.extents}|{t.block}".encode())
        h.update(b"\n")
    return h.hexdigest()


# ---------------------------------------------------------------------------- I/O helpers


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    """temp file + fsync + rename + fsync of the directory."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def crc_range(f: io.BufferedIOBase, offset: int, length: int, buf: bytearray, where: str) -> int:
    """CRC-32 of ``length`` bytes at ``offset``, read in chunks; ModelIOError when short."""
    crc = 0
    f.seek(offset)
    left = length
    view = memoryview(buf)
    while left:
        n = f.readinto(view[: min(left, len(buf))])
        if not n:
            raise ModelIOError(f"{where}: short read at offset {offset + length - left}")
        crc = zlib.crc32(view[:n], crc)
        left -= n
    return crc


def _is_zero(f: io.BufferedIOBase, offset: int, length: int) -> bool:
    if length == 0:
        return True
    f.seek(offset)
    data = f.read(length)
    return len(data) == length and data.count(0) == length


def _copy_item(
    item: _Item,
    out: io.BufferedIOBase,
    sources: Sequence[io.BufferedIOBase],
    names: Sequence[Path],
    buf: bytearray,
) -> int:
    """Writes one item (parts, zero gaps, zero padding) at its offset; returns its CRC."""
    crc = 0
    view = memoryview(buf)
    out.seek(item.offset)
    pos = 0
    for part in item.parts:
        gap = bytes(part.offset - pos)
        out.write(gap)
        crc = zlib.crc32(gap, crc)
        if not part.copied:
            for chunk in converted_chunks(part.tensor, part.dtype, tensor_reader(sources, names)):
                out.write(chunk.data)
                crc = zlib.crc32(chunk.data, crc)
            pos = part.offset + part.nbytes
            continue
        for e in part.tensor.extents:
            src = sources[e.file]
            src.seek(e.offset)
            left = e.length
            while left:
                n = src.readinto(view[: min(left, len(buf))])
                if not n:
                    raise ModelIOError(
                        f"{names[e.file]}: short read in tensor {part.tensor.name!r} at "
                        f"offset {e.offset + e.length - left}; the source file is truncated"
                    )
                out.write(view[:n])
                crc = zlib.crc32(view[:n], crc)
                left -= n
        pos = part.offset + part.nbytes
    pad = bytes(item.slot - pos)
    out.write(pad)
    if item.checked == item.slot:
        crc = zlib.crc32(pad, crc)
    return crc


# ---------------------------------------------------------------------------- journal


def _read_journal(path: Path, digest: str, quant: str) -> dict[int, int]:
    """item index -> CRC recorded by an interrupted run with the same plan ({} if none).

    Raises InvalidRequestError when the interrupted run converted with another ``quant``:
    resuming would mix two conversions, and silently starting over would discard work the
    user may have meant to resume."""
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return {}
    out: dict[int, int] = {}
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            break  # a torn last line: the run died while writing it
        if i == 0:
            if not isinstance(rec, dict):
                return {}
            theirs = rec.get("quant", "keep")
            if theirs != quant:
                raise InvalidRequestError(
                    f"{path.parent} holds an interrupted conversion with --quant {theirs}; "
                    f"rerun it with --quant {theirs} to resume, or delete {path} (or the "
                    f"whole directory) to start over with --quant {quant}."
                )
            if rec.get("plan") != digest:
                return {}
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("i"), int):
            break
        out[rec["i"]] = int(rec["crc"])
    return out


# ---------------------------------------------------------------------------- manifest.json


def _json_default(obj: object) -> Any:
    raise UnsupportedError(
        f"metadata value of type {type(obj).__name__} cannot be stored in {MANIFEST}"
    )


def _container_json(
    manifest: Manifest,
    items: Sequence[_Item],
    crcs: Sequence[int],
    tokenizer_files: list[str],
    quant: str,
) -> bytes:
    dense_size, experts_size = _totals(items)
    dense: list[dict[str, Any]] = []
    experts: list[dict[str, Any]] = []
    for it, crc in zip(items, crcs, strict=True):
        if it.file == 0:
            t = it.parts[0].tensor
            dense.append({
                "name": t.name, "dtype": it.parts[0].dtype, "shape": list(t.shape),
                "offset": it.offset, "length": it.parts[0].nbytes, "crc32": crc,
                "rope_unpermute_heads": t.rope_unpermute_heads,
            })
        else:
            rec: dict[str, Any] = {
                "layer": it.layer, "expert": it.expert, "offset": it.offset,
                "length": it.slot, "crc32": crc,
            }
            for proj, p in zip(PROJECTIONS, it.parts, strict=True):
                rec[proj] = {
                    "dtype": p.dtype, "shape": list(p.tensor.shape),
                    "offset": p.offset, "length": p.nbytes,
                }
            experts.append(rec)
    config = asdict(manifest.config)
    for key in ("rope_scaling", "compress_rope_scaling"):
        if config[key] is not None:
            config[key] = dict(getattr(manifest.config, key) or {})
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "checksum": CHECKSUM,
        "alignment": ALIGNMENT,
        "source": {"kind": manifest.source, "name": manifest.path.name},
        "quant": quant,
        "config": config,
        "metadata": _metadata(manifest),
        "tokenizer_files": tokenizer_files,
        "files": {"dense": {"name": DENSE, "size": dense_size},
                  "experts": {"name": EXPERTS, "size": experts_size}},
        "dense": dense,
        "experts": experts,
    }
    return _dump(doc).encode()


def _dump(doc: Mapping[str, Any]) -> str:
    """``doc`` as JSON with one top-level key per line and one dense tensor or expert per
    line. Each value goes through json's C encoder in one piece: ``indent=`` would use the
    pure-Python encoder, whose many small chunks cost tens of MiB for a large vocabulary
    in the metadata (memory that, unlike the weights, scales with the tokenizer)."""

    def one(v: Any) -> str:
        return json.dumps(v, separators=(", ", ": "), default=_json_default)

    lines = []
    for k, v in doc.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            body = ",\n  ".join(one(x) for x in v)
            lines.append(f" {one(k)}: [\n  {body}\n ]")
        else:
            lines.append(f" {one(k)}: {one(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _metadata(manifest: Manifest) -> dict[str, Any]:
    """The source's metadata, without an FP8 ``quantization_config``: the container's
    weights are no longer FP8."""
    meta = dict(manifest.metadata)
    if any(isinstance(t, Fp8TensorInfo) for t in manifest.tensors.values()):
        meta.pop("quantization_config", None)
    return meta


# ---------------------------------------------------------------------------- writer


def write_container(
    source: Manifest | str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    quant: str = "keep",
    progress: Progress | None = None,
) -> WriteReport:
    """Writes a model (a manifest, or the path of a GGUF file, a Hugging Face directory,
    FP8 included, or a container) as a native container at ``dst`` (a directory, created
    if needed).

    ``quant`` is one of ``keep`` (copy every tensor's bytes; FP8 weights become BF16),
    ``f32``, ``f16``, ``bf16``, ``q8_0``, ``q4_0``, ``q4_1``: the type of every matrix
    (norms, biases and routers are F32), see :mod:`colibri.convert.quantize`.

    Streams extent by extent in chunks of at most 16 MiB, or 4 Mi values per conversion
    step (memory does not grow with the model). Every finished item's checksum is
    appended to ``convert.journal``; a rerun after an interruption re-reads and verifies
    the journaled items, keeps the valid prefix and continues from the first missing or
    damaged one, so the result is byte for byte what an uninterrupted run writes;
    resuming with another ``quant`` raises InvalidRequestError. ``manifest.json`` is
    written last and atomically. ``progress(bytes_done, bytes_total)`` is called once
    after the resume check and after every item; an exception it raises interrupts the
    conversion (resumable).
    """
    check_quant(quant)
    manifest = source if isinstance(source, Manifest) else open_convert_source(source)
    out_dir = Path(dst)
    if any(f.resolve().parent == out_dir.resolve() for f in manifest.files):
        raise InvalidRequestError(
            f"{out_dir} holds the source's own files; convert into another directory"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    items = _plan(manifest, quant)
    digest = _plan_digest(manifest, items)
    dense_size, experts_size = _totals(items)
    total = dense_size + experts_size
    journal_path = out_dir / JOURNAL
    recorded = _read_journal(journal_path, digest, quant)
    # From here on the container is not whole: drop the marker before touching data.
    final = out_dir / MANIFEST
    if final.exists():
        final.unlink()
        _fsync_dir(out_dir)
    paths = (out_dir / DENSE, out_dir / EXPERTS)
    buf = bytearray(CHUNK)
    with contextlib.ExitStack() as stack:
        outs: list[io.BufferedIOBase] = [
            stack.enter_context(open(p, "r+b" if p.exists() else "w+b")) for p in paths
        ]
        sources: list[io.BufferedIOBase] = [
            stack.enter_context(open(f, "rb")) for f in manifest.files
        ]
        crcs: list[int] = []
        # The verified prefix: every item journaled with a CRC its bytes still match.
        for i, it in enumerate(items):
            want = recorded.get(i)
            if want is None:
                break
            f = outs[it.file]
            try:
                got = crc_range(f, it.offset, it.checked, buf, str(paths[it.file]))
            except ModelIOError:
                break
            if got != want or not _is_zero(f, it.offset + it.checked, it.slot - it.checked):
                break
            crcs.append(got)
        reused = len(crcs)
        head = {"format": FORMAT, "version": VERSION, "quant": quant, "plan": digest}
        jlines = [json.dumps(head)]
        jlines += [json.dumps({"i": i, "crc": c}) for i, c in enumerate(crcs)]
        _atomic_write(journal_path, ("\n".join(jlines) + "\n").encode())
        done = sum(it.slot for it in items[:reused])
        if progress is not None:
            progress(done, total)
        with open(journal_path, "ab") as journal:
            for i in range(reused, len(items)):
                it = items[i]
                crc = _copy_item(it, outs[it.file], sources, manifest.files, buf)
                outs[it.file].flush()
                crcs.append(crc)
                journal.write(json.dumps({"i": i, "crc": crc}).encode() + b"\n")
                journal.flush()
                done += it.slot
                if progress is not None:
                    progress(done, total)
        for f, size in zip(outs, (dense_size, experts_size), strict=True):
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
    tokenizer_files = _copy_tokenizer_files(manifest, out_dir)
    _atomic_write(final, _container_json(manifest, items, crcs, tokenizer_files, quant))
    journal_path.unlink()
    _fsync_dir(out_dir)
    return WriteReport(len(items), len(items) - reused, reused, total, quant)


def _copy_tokenizer_files(manifest: Manifest, out_dir: Path) -> list[str]:
    """A Hugging Face source's tokenizer files, copied next to the data (a GGUF source's
    tokenizer lives in the metadata, which manifest.json carries)."""
    if manifest.source != "hf":
        return []
    root = ModelDir(manifest.path)
    copied = []
    for name in TOKENIZER_FILES:
        src = root.optional(name, "tokenizer file")  # never a file outside the source
        if src is not None:
            tmp = out_dir / (name + ".tmp")
            shutil.copyfile(src, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, out_dir / name)
            copied.append(name)
    return copied


# ---------------------------------------------------------------------------- verifier
