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

The file refuses to load into another model: the header carries a fingerprint of the
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

from ..errors import ContextOverflowError, InvalidRequestError, ModelFormatError, ModelIOError
from ..sampling import Sampler, Sampling

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


def _sampler_from(doc: dict[str, Any]) -> Sampler:
    sampler = Sampler(Sampling.from_dict(doc["sampling"]))
    sampler.rng.bit_generator.state = doc["rng"]
    return sampler


def save_session(session: Session, path: str | os.PathLike[str], *,
                 sampler: Sampler | None = None) -> None:
    """Writes `session` (and `sampler`'s state) to `path`, atomically."""
    model = session._runner.handle
    core = session._core
    n = session.n_tokens
    if n != len(session.token_ids):
        raise InvalidRequestError("the session is inconsistent (interrupted mid-call?); "
                                  "reset it or roll it back before saving")
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


def _read(path: Path) -> tuple[dict[str, Any], bytes, bytes]:
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
    try:
        header = json.loads(data[start:start + hlen])
    except ValueError as exc:
        raise ModelFormatError(f"{path}: the session header is not JSON ({exc})") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ModelFormatError(f"{path}: not a {FORMAT} file")
    version = header.get("version")
    if version != VERSION:
        raise ModelFormatError(f"{path}: session format version {version!r}; this colibri "
                               f"reads version {VERSION} (saved by another release?)")
    payload = data[start + hlen:-32]
    try:
        kv_len, lg_len = int(header["kv_bytes"]), int(header["logits_bytes"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelFormatError(f"{path}: malformed session header ({exc!r})") from exc
    if kv_len < 0 or lg_len < 0 or kv_len + lg_len != len(payload):
        raise ModelFormatError(f"{path}: the payload does not match the header's sizes")
    return header, payload[:kv_len], payload[kv_len:]


def load_session(path: str | os.PathLike[str], owner: HasRunner | Runner) -> Session:
    """Restores a session saved by :func:`save_session` into `owner`'s model."""
    from .runner import runner_of

    runner = runner_of(owner)
    model = runner.handle
    p = Path(path).expanduser()
    header, kv, logits_bytes = _read(p)
    saved = header.get("model", {})
    if saved.get("fingerprint") != model_fingerprint(model):
        raise InvalidRequestError(
            f"{p} was saved from another model ({saved.get('name')!r}, "
            f"{saved.get('architecture')!r}); this is {model.name!r}: load it with the model "
            "it was saved from"
        )
    precision = model.engine_config.activation_precision.value
    if header.get("activation_precision") != precision:
        raise InvalidRequestError(
            f"{p} was computed with activation_precision {header.get('activation_precision')!r} "
            f"and this model runs {precision!r}: set_activation_precision("
            f"{header.get('activation_precision')!r}) first, so that the cached state and new "
            "tokens agree"
        )
    ids = header.get("token_ids")
    n = header.get("n_tokens")
    if not isinstance(ids, list) or n != len(ids):
        raise ModelFormatError(f"{p}: malformed token list")
    if n > model.context_length:
        raise ContextOverflowError(f"{p} holds {n} tokens but this model's sessions hold "
                                   f"{model.context_length}; raise EngineConfig.context_length")
    vocab = model.config.vocab_size
    if not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
        raise ModelFormatError(f"{p}: a saved token id is outside the vocabulary [0, {vocab})")
    if logits_bytes and (len(logits_bytes) != 4 * vocab or not ids):
        raise ModelFormatError(f"{p}: the saved logits are not one row of {vocab}")
    session = runner.session()
    if header.get("kv_type") != session._core.kv_type:
        raise InvalidRequestError(f"{p} holds a {header.get('kv_type')!r} KV cache; this "
                                  f"model's sessions use {session._core.kv_type!r}")
    session._core.import_kv(kv, ids)
    if logits_bytes:
        # The core keeps the logits it computed: recompute the last token's (the same bits,
        # the forward is deterministic) and check them against the saved ones, a last
        # proof that the state and the model agree.
        session._refresh_logits()
        saved_logits = np.frombuffer(logits_bytes, dtype=np.float32)
        if not np.array_equal(session.last_logits(), saved_logits):
            raise InvalidRequestError(
                f"{p}: the restored state does not reproduce the saved logits (another model "
                "build or KV cache type?); it cannot be continued exactly")
    if header.get("sampler") is not None:
        session.sampler = _sampler_from(header["sampler"])
    return session
