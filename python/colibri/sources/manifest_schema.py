"""The schema of a native container's ``manifest.json`` (``docs/format.md``), checked at
open, before any value is used.

A manifest is JSON from wherever the container came from: every key is checked for
presence and type, every value for the range the format allows (``crc32`` an unsigned
32-bit integer, never null; ``rope_unpermute_heads`` 0, or the head count on the Q/K
tensors the GGUF converter permutes; every shape dimension >= 1; the layout the writer
produces: dense tensors at 64-byte offsets, expert blobs back to back at 4096, their
matrices at 64-byte offsets inside them). The result is typed records
(:class:`ContainerDoc`) that :func:`~.native_source.load_native` and
:func:`~colibri.convert.verify_container` read instead of the raw JSON, so a malformed
manifest is a ModelFormatError naming the record and the field, never a TypeError,
KeyError or IndexError further on. Unknown top-level keys are ignored (a later minor
addition); unknown keys inside records are refused (a misspelt key must not silently
turn a check off).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..errors import ModelFormatError
from .fields import as_dict, as_int, as_list, as_str, bad
from .manifest import ModelConfig
from .native_format import ALIGNMENT as BLOB_ALIGNMENT
from .native_format import DENSE as DENSE_FILE
from .native_format import EXPERTS as EXPERTS_FILE
from .native_format import PROJECTIONS, QUANT_CHOICES, TENSOR_ALIGNMENT, TOKENIZER_FILES
from .paths import shown
from .quant_types import check_dtype
from .validate import check_config

SOURCE_KINDS = ("gguf", "hf")
MAX_OFFSET = 2**62  # byte offsets and lengths; far beyond any file
_CRC = 2**32 - 1
_Q = re.compile(r"^blk\.\d{1,9}\.attn_q(\.bias)?$")
_K = re.compile(r"^blk\.\d{1,9}\.attn_k(\.bias)?$")


@dataclass(frozen=True)
class DenseRecord:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int
    crc32: int
    rope_unpermute_heads: int


@dataclass(frozen=True)
class PartRecord:
    dtype: str
    shape: tuple[int, ...]
    offset: int  # inside the blob
    length: int


@dataclass(frozen=True)
class ExpertRecord:
    layer: int
    expert: int
    offset: int
    length: int
    crc32: int
    parts: tuple[PartRecord, PartRecord, PartRecord]  # gate, up, down


@dataclass(frozen=True)
class ContainerDoc:
    source_kind: str
    source_name: str
    quant: str
    config: ModelConfig
    metadata: dict[str, Any]
    tokenizer_files: tuple[str, ...]
    dense_size: int
    experts_size: int
    dense: tuple[DenseRecord, ...]
    experts: tuple[ExpertRecord, ...]


def _keys(rec: Mapping[str, Any], required: set[str], optional: set[str], what: str) -> None:
    missing = required - rec.keys()
    if missing:
        raise ModelFormatError(f"{what}: key {sorted(missing)[0]!r} is missing")
    extra = rec.keys() - required - optional
    if extra:
        raise ModelFormatError(f"{what}: unknown key {shown(sorted(extra)[0])}")


def _shape(value: Any, what: str, max_dims: int) -> tuple[int, ...]:
    dims = as_list(value, "shape", what)
    if not 1 <= len(dims) <= max_dims:
        raise bad(what, "shape", value, f"a list of 1 to {max_dims} sizes")
    return tuple(as_int(d, "shape", what, lo=1) for d in dims)


def _span(rec: Mapping[str, Any], what: str) -> tuple[int, int]:
    return (as_int(rec["offset"], "offset", what, hi=MAX_OFFSET),
            as_int(rec["length"], "length", what, hi=MAX_OFFSET))  # fmt: skip


def _dtype(value: Any, what: str, where: object) -> str:
    dtype = as_str(value, "dtype", what)
    check_dtype(what, dtype, where)  # UnsupportedError for a type the core cannot read
    return dtype


def _config(raw: Any, where: object) -> ModelConfig:
    """The ModelConfig, field by field, checked as every source's is (check_config)."""
    d = dict(as_dict(raw, "config", where))
    _keys(d, set(), {f.name for f in fields(ModelConfig)}, f"{where}: config")
    for key in ("arch", "vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads",
                "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta",
                "max_position_embeddings", "tie_word_embeddings"):  # fmt: skip
        if key not in d:
            raise ModelFormatError(f"{where}: config: key {key!r} is missing")
    for key in ("moe_layers", "eos_token_ids", "indexer_types", "sliding_layers", "hash_layers",
                "linear_layers", "compress_ratios", "csa_layers"):
        if key in d:
            d[key] = tuple(as_list(d[key], f"config.{key}", where))
    for key in ("rope_scaling", "compress_rope_scaling"):
        if d.get(key) is not None:
            d[key] = dict(as_dict(d[key], f"config.{key}", where))
    cfg = ModelConfig(**d)
    check_config(cfg, where)
    return cfg


def _dense(raw: Any, i: int, cfg: ModelConfig, where: object) -> DenseRecord:
    what = f"{where}: dense[{i}]"
    rec = as_dict(raw, f"dense[{i}]", where)
    # rope_unpermute_heads is required: absent, a GGUF Llama's Q/K rows would silently
    # stay in llama.cpp's order.
    _keys(rec, {"name", "dtype", "shape", "offset", "length", "crc32", "rope_unpermute_heads"},
          set(), what)  # fmt: skip
    name = as_str(rec["name"], "name", what)
    what = f"{where}: dense tensor {shown(name)}"
    offset, length = _span(rec, what)
    heads = as_int(rec["rope_unpermute_heads"], "rope_unpermute_heads", what)
    allowed = {0}
    if _Q.match(name):
        allowed.add(cfg.n_heads)
    elif _K.match(name):
        allowed.add(cfg.n_kv_heads)
    if heads not in allowed:
        raise bad(what, "rope_unpermute_heads", heads,
                  " or ".join(str(a) for a in sorted(allowed)) + " for this tensor")  # fmt: skip
    if offset % TENSOR_ALIGNMENT:
        raise bad(what, "offset", offset, f"a multiple of {TENSOR_ALIGNMENT}")
    return DenseRecord(
        name, _dtype(rec["dtype"], what, where), _shape(rec["shape"], what, 2), offset, length,
        as_int(rec["crc32"], "crc32", what, hi=_CRC), heads,
    )  # fmt: skip


def _expert(raw: Any, i: int, where: object) -> ExpertRecord:
    what = f"{where}: experts[{i}]"
    rec = as_dict(raw, f"experts[{i}]", where)
    _keys(rec, {"layer", "expert", "offset", "length", "crc32", *PROJECTIONS}, set(), what)
    layer = as_int(rec["layer"], "layer", what)
    expert = as_int(rec["expert"], "expert", what)
    what = f"{where}: layer {layer} expert {expert}"
    offset, length = _span(rec, what)
    if offset % BLOB_ALIGNMENT or length % BLOB_ALIGNMENT or length == 0:
        raise ModelFormatError(
            f"{what}: blob [{offset}, {offset + length}) is not a non-empty run of "
            f"{BLOB_ALIGNMENT}-byte blocks"
        )
    parts: list[PartRecord] = []
    end = 0
    for proj in PROJECTIONS:
        pw = f"{what} {proj}"
        sub = as_dict(rec[proj], proj, what)
        _keys(sub, {"dtype", "shape", "offset", "length"}, set(), pw)
        p_off, p_len = _span(sub, pw)
        if p_off % TENSOR_ALIGNMENT or p_off < end or p_len == 0:
            raise ModelFormatError(
                f"{pw}: offset {p_off} must be a multiple of {TENSOR_ALIGNMENT} after the "
                f"previous matrix (which ends at {end}), length > 0"
            )
        end = p_off + p_len
        parts.append(PartRecord(_dtype(sub["dtype"], pw, where), _shape(sub["shape"], pw, 2),
                                p_off, p_len))  # fmt: skip
    if -(-end // BLOB_ALIGNMENT) * BLOB_ALIGNMENT != length:
        raise ModelFormatError(
            f"{what}: the blob is {length} bytes, but its matrices end at {end} (the writer "
            f"pads to the next multiple of {BLOB_ALIGNMENT})"
        )
    return ExpertRecord(layer, expert, offset, length, as_int(rec["crc32"], "crc32", what,
                        hi=_CRC), (parts[0], parts[1], parts[2]))  # fmt: skip


def _file(files: dict[str, Any], key: str, name: str, where: object) -> int:
    rec = as_dict(files.get(key), f"files.{key}", where)
    _keys(rec, {"name", "size"}, set(), f"{where}: files.{key}")
    if rec["name"] != name:
        raise bad(where, f"files.{key}.name", rec["name"], repr(name))
    return as_int(rec["size"], f"files.{key}.size", where, hi=MAX_OFFSET)


def check_container_doc(doc: Mapping[str, Any], where: object) -> ContainerDoc:
    """The typed records of a parsed manifest.json (format and version already checked
    by ``read_container_json``). Raises ModelFormatError naming the record and field;
    UnsupportedArchitectureError / UnsupportedError for what colibri cannot run."""
    for key in ("source", "config", "files", "dense", "experts"):
        if key not in doc:
            raise ModelFormatError(f"{where}: key {key!r} is missing")
    source = as_dict(doc["source"], "source", where)
    kind = source.get("kind")
    if kind not in SOURCE_KINDS:
        raise bad(where, "source.kind", kind, " or ".join(map(repr, SOURCE_KINDS)))
    name = as_str(source.get("name", ""), "source.name", where)
    quant = doc.get("quant", "keep")
    if quant not in QUANT_CHOICES:
        raise bad(where, "quant", quant, "one of " + ", ".join(QUANT_CHOICES))
    metadata = as_dict(doc.get("metadata", {}), "metadata", where)
    tok = as_list(doc.get("tokenizer_files", []), "tokenizer_files", where)
    for t in tok:
        if t not in TOKENIZER_FILES:
            raise bad(where, "tokenizer_files", t, "names from " + ", ".join(TOKENIZER_FILES))
    files = as_dict(doc["files"], "files", where)
    dense_size = _file(files, "dense", DENSE_FILE, where)
    experts_size = _file(files, "experts", EXPERTS_FILE, where)
    cfg = _config(doc["config"], where)
    dense = tuple(_dense(r, i, cfg, where)
                  for i, r in enumerate(as_list(doc["dense"], "dense", where)))  # fmt: skip
    experts = tuple(_expert(r, i, where)
                    for i, r in enumerate(as_list(doc["experts"], "experts", where)))  # fmt: skip
    seen_names: set[str] = set()
    for d in dense:
        if d.name in seen_names:
            raise ModelFormatError(f"{where}: dense tensor {shown(d.name)} appears twice")
        seen_names.add(d.name)
    seen_keys: set[tuple[int, int]] = set()
    for e in experts:
        if (e.layer, e.expert) in seen_keys:
            raise ModelFormatError(f"{where}: layer {e.layer} expert {e.expert} appears twice")
        seen_keys.add((e.layer, e.expert))
    return ContainerDoc(kind, name, quant, cfg, metadata, tuple(tok), dense_size,
                        experts_size, dense, experts)  # fmt: skip


__all__ = [
    "ContainerDoc",
    "DenseRecord",
    "ExpertRecord",
    "PartRecord",
    "check_container_doc",
]
