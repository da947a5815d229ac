"""Saved sessions: ``Session.save(path)`` / ``Session.load(path, model)``.

A session file holds the tokens, the KV cache at its type (the core's state export), the
logits after the last token, and optionally a Sampler's settings and random state; a
reloaded session continues bit for bit where the saved one was (the same next-token
logits, the same draws). The format (version 1)::

    magic      16 bytes  b"COLIBRI-SESSION\\n"
    length      8 bytes  little-endian size of the header
    header     JSON      format, version, model fingerprint, KV type and size, tokens,
                         activation precision, logits size, sampler
    payload              the KV state, then the float32 logits
    checksum   32 bytes  SHA-256 of everything before it

Every state with tokens carries its logits (a save after a rollback recomputes them), and
a load always checks the restored state against them (`_verify`). The file is untrusted
input: anyone can edit it and recompute the checksum, so the header is checked field by
field (colibri.generate.session_header) and the load raises only colibri.errors
exceptions. The file refuses to load into another model: the header carries a fingerprint of the
model (its normalized config, every tensor's name, type, shape and extents, the files'
sizes, and a SHA-256 of the first and last MiB of each file), checked before anything is
read into the session. A corrupt or truncated file fails its checksum; a newer version is
refused by name. Writes are atomic (temporary file, fsync, rename).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import (
    ContextOverflowError,
    InvalidRequestError,
    ModelFormatError,
    ModelIOError,
    NumericalError,
)
from ..sampling import Sampler
from .session_header import parse_header, sampler_from

if TYPE_CHECKING:
    from ..engine.handle import EngineHandle
    from .runner import HasRunner, Runner
    from .session import Session

__all__ = ["FORMAT", "VERSION", "load_session", "model_fingerprint", "save_session"]

MAGIC = b"COLIBRI-SESSION\n"
FORMAT = "colibri-session"
VERSION = 1
_EDGE = 1 << 20  # bytes hashed at each end of every model file
_MAX_HEADER = 256 << 20

_FINGERPRINTS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def model_fingerprint(model: EngineHandle) -> str:
    """A SHA-256 naming the model's weights (computed once per loaded model)."""
    hit = _FINGERPRINTS.get(model)
    if hit is not None:
        return hit
    m = model.manifest
    h = hashlib.sha256()
    h.update(json.dumps(dataclasses.asdict(m.config), sort_keys=True, default=str).encode())
    for t in m.tensors.values():
        h.update(f"{t.name}|{t.dtype}|{list(t.shape)}|"
                 f"{[(e.file, e.offset, e.length) for e in t.extents]}\n".encode())
    for f in m.files:
        size = os.path.getsize(f)
        h.update(str(size).encode())
        with open(f, "rb") as fh:
            h.update(fh.read(_EDGE))
            if size > _EDGE:
                fh.seek(max(_EDGE, size - _EDGE))
                h.update(fh.read(_EDGE))
    digest = h.hexdigest()
    _FINGERPRINTS[model] = digest
    return digest


def _sampler_state(sampler: Sampler) -> dict[str, Any]:
    return {"sampling": sampler.sampling.to_dict(), "rng": sampler.rng.bit_generator.state}


def save_session(session: Session, path: str | os.PathLike[str], *,
                 sampler: Sampler | None = None) -> None:
    """Writes `session` (and `sampler`'s state) to `path`, atomically."""
    model = session._runner.handle
    core = session._core
    n = session.n_tokens
    if n != len(session.token_ids):
        raise InvalidRequestError("the session is inconsistent (interrupted mid-call?); "
                                  "reset it or roll it back before saving")
    if n and core.last_logits is None:
        # After a rollback the core holds no logits: recompute them (the same bits, and
        # the last KV entry rewritten with the same values), so that every saved state
        # carries the logits its load is checked against.
        session._refresh_logits()
    kv = core.export_kv(n)
    logits = core.last_logits
    logits_bytes = b"" if logits is None else np.ascontiguousarray(logits, np.float32).tobytes()
    header = {
        "format": FORMAT, "version": VERSION,
        "model": {"fingerprint": model_fingerprint(model), "name": model.name,
                  "architecture": model.config.arch},
        "kv_type": core.kv_type, "kv_bytes": len(kv), "n_tokens": n,
        "token_ids": session.token_ids,
        "activation_precision": model.engine_config.activation_precision.value,
        "logits_bytes": len(logits_bytes),
        "sampler": None if sampler is None else _sampler_state(sampler),
    }  # fmt: skip
    head = json.dumps(header).encode()
    body = MAGIC + struct.pack("<Q", len(head)) + head
    digest = hashlib.sha256(body)
    digest.update(kv)
    digest.update(logits_bytes)
    target = Path(path).expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                for part in (body, kv, logits_bytes, digest.digest()):
                    f.write(part)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ModelIOError(f"cannot save the session to {target}: {exc}") from exc


def _read(path: Path) -> tuple[bytes, bytes]:
    """The header's JSON bytes and the payload, once the magic, sizes and checksum pass."""
    try:
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise InvalidRequestError(f"no session file {str(path)!r}") from exc
    except OSError as exc:
        raise ModelIOError(f"cannot read the session file {path}: {exc}") from exc
    if not data.startswith(MAGIC):
        raise ModelFormatError(f"{path} is not a colibri session file (wrong magic)")
    if len(data) < len(MAGIC) + 8 + 32:
        raise ModelFormatError(f"{path}: the session file is truncated")
    if hashlib.sha256(data[:-32]).digest() != data[-32:]:
        raise ModelFormatError(f"{path}: the session file is corrupt or truncated (its SHA-256 "
                               "does not match)")
    (hlen,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    if hlen > _MAX_HEADER or start + hlen > len(data) - 32:
        raise ModelFormatError(f"{path}: the session header size {hlen} is impossible")
    return data[start:start + hlen], data[start + hlen:-32]


def load_session(path: str | os.PathLike[str], owner: HasRunner | Runner) -> Session:
    """Restores a session saved by :func:`save_session` into `owner`'s model. The file is
    untrusted: its header is checked field by field (colibri.generate.session_header),
    every size against the model, and the restored state must reproduce the saved logits;
    anything else raises a colibri.errors exception."""
    from .runner import runner_of

    runner = runner_of(owner)
    model = runner.handle
    p = Path(path).expanduser()
    raw, payload = _read(p)
    vocab = model.config.vocab_size
    header = parse_header(raw, str(p), fmt=FORMAT, version=VERSION)
    if header.kv_bytes + header.logits_bytes != len(payload):
        raise ModelFormatError(f"{p}: the payload does not match the header's sizes")
    if header.fingerprint != model_fingerprint(model):
        raise InvalidRequestError(
            f"{p} was saved from another model ({header.model_name!r}, "
            f"{header.architecture!r}); this is {model.name!r}: load it with the model "
            "it was saved from"
        )
    precision = model.engine_config.activation_precision.value
    if header.activation_precision != precision:
        raise InvalidRequestError(
            f"{p} was computed with activation_precision {header.activation_precision!r} "
            f"and this model runs {precision!r}: set_activation_precision("
            f"{header.activation_precision!r}) first, so that the cached state and new "
            "tokens agree"
        )
    ids = header.token_ids
    n = len(ids)
    if n > model.context_length:
        raise ContextOverflowError(f"{p} holds {n} tokens but this model's sessions hold "
                                   f"{model.context_length}; raise EngineConfig.context_length")
    if any(t >= vocab for t in ids):
        raise ModelFormatError(f"{p}: a saved token id is outside the vocabulary [0, {vocab})")
    if n and not header.logits_bytes:
        raise ModelFormatError(
            f"{p} holds {n} tokens but no logits to verify them against (a file saved "
            "after a rollback by an earlier release): load it there, forward a token and "
            "save it again")
    if header.logits_bytes != (4 * vocab if n else 0):
        raise ModelFormatError(f"{p}: the saved logits are not one row of {vocab}")
    sampler = None if header.sampler is None else sampler_from(header.sampler, str(p))
    session = runner.session()
    if header.kv_type != session._core.kv_type:
        raise InvalidRequestError(f"{p} holds a {header.kv_type!r} KV cache; this "
                                  f"model's sessions use {session._core.kv_type!r}")
    kv, logits_bytes = payload[:header.kv_bytes], payload[header.kv_bytes:]
    session._core.import_kv(kv, ids)
    if n:
        _verify(session, logits_bytes, p)
    if sampler is not None:
        session.sampler = sampler
    return session


def _verify(session: Session, logits_bytes: bytes, p: Path) -> None:
    """The last check of a restored state: roll back the last token and forward it again
    (the forward is deterministic, so an intact state gives the saved logits bit for bit).
    Its attention reads every position's keys and values in every layer, so an edit of the
    KV bytes, the last token or the logits shows; the session is reset on failure."""
    saved = np.frombuffer(logits_bytes, dtype=np.float32)
    try:
        session._refresh_logits()
        same = np.array_equal(session.last_logits(), saved)
    except NumericalError:
        same = False
    if not same:
        session.reset()
        raise InvalidRequestError(
            f"{p}: the restored state does not reproduce the saved logits (the file was "
            "edited, or another model build or KV cache type?); it cannot be continued "
            "exactly")
