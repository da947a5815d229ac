"""The header of a saved session, read as untrusted data (colibri.generate.session_store).

Anyone can edit a session file and recompute its SHA-256, so the checksum proves nothing
about intent: every field of the JSON header is checked here by type and range before it
is used (bools are not ints, nesting is bounded before the JSON is parsed, every size
against the model), and every failure is a ``ModelFormatError`` naming the field. The
saved sampler's random state is compared key by key with a fresh generator's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ColibriError, ModelFormatError
from ..sampling import Sampler, Sampling

__all__ = ["MAX_DEPTH", "SessionHeader", "parse_header", "sampler_from"]

MAX_DEPTH = 16  # the format nests 4 levels (header > sampler > rng > state); room to spare
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)  # one JSON string (linear: no overlap)
_MAX_TEXT = 4096  # model names, types, digests: short strings
_MAX_RNG_INT = 1 << 256
_MAX_TOKEN = 1 << 31


@dataclass(frozen=True)
class SessionHeader:
    """The checked fields of a session header."""

    fingerprint: str
    model_name: str
    architecture: str
    kv_type: str
    kv_bytes: int
    logits_bytes: int
    token_ids: list[int]
    activation_precision: str
    sampler: dict[str, Any] | None


def _depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text, strings left out."""
    bare = np.frombuffer(_STRING.sub(b"", raw), dtype=np.uint8)
    step = (np.isin(bare, (ord("["), ord("{"))).astype(np.int64)
            - np.isin(bare, (ord("]"), ord("}"))).astype(np.int64))
    return int(np.cumsum(step).max(initial=0))


def _fail(where: str, what: str) -> ModelFormatError:
    return ModelFormatError(f"{where}: malformed session header: {what}")


def _int(doc: dict[str, Any], key: str, where: str, lo: int, hi: int) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _fail(where, f"{key!r} must be an integer in [{lo}, {hi}], got {_show(v)}")
    return v


def _text(doc: dict[str, Any], key: str, where: str) -> str:
    v = doc.get(key)
    if not isinstance(v, str) or len(v) > _MAX_TEXT:
        raise _fail(where, f"{key!r} must be a string of at most {_MAX_TEXT} characters, "
                           f"got {_show(v)}")
    return v


def _show(v: object) -> str:
    text = repr(v) if isinstance(v, (int, float, str, type(None))) else type(v).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def parse_header(raw: bytes, where: str, *, fmt: str, version: int) -> SessionHeader:
    """The checked header from its JSON bytes (`raw`), or ModelFormatError. The sizes and
    token ids are checked against the model by the caller, once it knows the file is from
    that model (so that another model's file is named as such)."""
    import json

    if _depth(raw) > MAX_DEPTH:
        raise _fail(where, f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ModelFormatError(f"{where}: the session header is not JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise ModelFormatError(f"{where}: not a {fmt} file")
    if doc.get("version") != version or isinstance(doc.get("version"), bool):
        raise ModelFormatError(f"{where}: session format version {_show(doc.get('version'))}; "
                               f"this colibri reads version {version} (saved by another "
                               "release?)")
    model = doc.get("model")
    if not isinstance(model, dict):
        raise _fail(where, f"'model' must be an object, got {_show(model)}")
    ids = doc.get("token_ids")
    if not isinstance(ids, list):
        raise _fail(where, f"'token_ids' must be a list, got {_show(ids)}")
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < _MAX_TOKEN:
            raise _fail(where, f"a saved token id ({_show(t)}) is not an int32 token id")
    n = _int(doc, "n_tokens", where, 0, 1 << 40)
    if n != len(ids):
        raise _fail(where, f"'n_tokens' is {n} but 'token_ids' holds {len(ids)}")
    sampler = doc.get("sampler")
    if sampler is not None and not isinstance(sampler, dict):
        raise _fail(where, f"'sampler' must be an object or null, got {_show(sampler)}")
    return SessionHeader(
        fingerprint=_text(model, "fingerprint", where),
        model_name=_text(model, "name", where),
        architecture=_text(model, "architecture", where),
        kv_type=_text(doc, "kv_type", where),
        kv_bytes=_int(doc, "kv_bytes", where, 0, 1 << 48),
        logits_bytes=_int(doc, "logits_bytes", where, 0, 1 << 40),
        token_ids=ids,
        activation_precision=_text(doc, "activation_precision", where),
        sampler=sampler,
    )


def _same_shape(saved: object, fresh: object, path: str) -> str | None:
    """Where `saved` differs in keys or types from `fresh` (a generator's state), or None."""
    if isinstance(fresh, dict):
        if not isinstance(saved, dict) or set(saved) != set(fresh):
            return path
        for k, v in fresh.items():
            bad = _same_shape(saved[k], v, f"{path}.{k}")
            if bad:
                return bad
        return None
    if isinstance(fresh, str):
        return None if saved == fresh else path
    if isinstance(fresh, int) and not isinstance(fresh, bool):
        ok = (isinstance(saved, int) and not isinstance(saved, bool)
              and 0 <= saved < _MAX_RNG_INT)
        return None if ok else path
    return path  # the generator's state holds only objects, strings and ints


def sampler_from(doc: dict[str, Any], where: str) -> Sampler:
    """The saved Sampler (its settings and random state), or ModelFormatError."""
    if set(doc) != {"sampling", "rng"}:
        raise _fail(where, "'sampler' must hold exactly 'sampling' and 'rng'")
    try:
        sampler = Sampler(Sampling.from_dict(doc["sampling"]))
    except ColibriError as exc:
        raise _fail(where, f"the saved sampling settings are invalid ({exc})") from exc
    except (TypeError, ValueError, OverflowError, KeyError, AttributeError) as exc:
        raise _fail(where, f"the saved sampling settings are invalid ({exc!r})") from exc
    bad = _same_shape(doc["rng"], sampler.rng.bit_generator.state, "rng")
    if bad:
        raise _fail(where, f"the saved random state does not fit this generator (at {bad})")
    try:
        sampler.rng.bit_generator.state = doc["rng"]
    except (TypeError, ValueError, OverflowError, KeyError) as exc:
        raise _fail(where, f"the saved random state is invalid ({exc})") from exc
    return sampler
