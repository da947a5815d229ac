"""What ``Model.load(spec)`` and ``colibri run --model SPEC`` load: one rule for both.

In order:

1. an existing file or directory (``~`` expanded) is loaded as it is; with ``filename`` a
   directory is searched for the one file matching that pattern;
2. a named model of :data:`colibri.models.hub.NAMED_MODELS` (``smollm2``, ``smollm2-moe-demo``...)
   comes from the installed package or colibri's cache, fetched or built on first use;
3. a Hugging Face repository id (``org/name``) is a snapshot already in the local Hugging
   Face cache, found through ``huggingface_hub`` with ``local_files_only=True`` (no
   network); ``filename`` (a pattern such as ``"*Q4_K_M.gguf"``) picks one GGUF of it.
   ``download=True`` lets ``huggingface_hub`` fetch what the cache lacks (its own
   configuration, token and endpoint apply);
4. anything else raises :class:`~colibri.errors.ModelNotFoundError` listing what was tried:
   the path, the named models, colibri's cache directory and the Hugging Face cache.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import TextIO

from ..errors import ModelNotFoundError
from .hub import NAMED_MODELS, ResolvedModel, default_cache_dir, lookup_name, resolve_model

__all__ = ["looks_like_repo_id", "resolve_hf_snapshot", "resolve_model_spec"]

# Hugging Face's repository names: one slash, letters, digits, '-', '_', '.'.
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# A missing "dir/model.gguf" is a mistyped path, not a repository id.
_FILE_SUFFIXES = (".gguf", ".json", ".safetensors", ".colibri")


def looks_like_repo_id(spec: str) -> bool:
    """``org/name`` with Hugging Face's characters (and no ``..`` or a leading ``.``)."""
    return bool(_REPO_ID.match(spec)) and ".." not in spec


def _pick_file(directory: Path, pattern: str, where: str) -> Path:
    """The one file under `directory` whose name (or path relative to it) matches
    `pattern`; a clear error for none or several."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() or p.is_symlink())
    rel = {p: p.relative_to(directory).as_posix() for p in files}
    hits = [p for p in files
            if fnmatch.fnmatch(p.name, pattern) or fnmatch.fnmatch(rel[p], pattern)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        have = ", ".join(rel[p] for p in files if p.suffix.lower() == ".gguf") or "no .gguf files"
        raise ModelNotFoundError(f"no file in {where} matches {pattern!r} (it has: {have})")
    names = ", ".join(rel[p] for p in hits)
    raise ModelNotFoundError(
        f"{len(hits)} files in {where} match {pattern!r} ({names}); give a pattern that "
        "matches one of them"
    )


def resolve_hf_snapshot(
    repo_id: str,
    *,
    filename: str | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    download_option: str = "download=True",
) -> Path:
    """The path of ``repo_id``'s snapshot in the Hugging Face cache (``cache_dir``, or
    huggingface_hub's default, ``$HF_HUB_CACHE``), or of the one file in it matching
    ``filename``. Raises ModelNotFoundError when it is not there (or huggingface_hub is
    not installed), naming `download_option` (the caller's way to allow a download:
    ``download=True`` in Python, ``--download`` on the command line); with `download`, a
    failed download says why (the network, the repository)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:
        raise ModelNotFoundError(
            f"{repo_id!r} looks like a Hugging Face repository id, but huggingface_hub is "
            "not installed: pip install huggingface_hub (or pass a local path)"
        ) from exc
    from huggingface_hub import constants

    where_cache = str(cache_dir) if cache_dir is not None else constants.HF_HUB_CACHE
    patterns = [filename] if filename is not None else None
    try:
        snapshot = snapshot_download(
            repo_id, revision=revision, local_files_only=not download,
            cache_dir=None if cache_dir is None else str(cache_dir),
            allow_patterns=patterns,
        )  # fmt: skip
    except LocalEntryNotFoundError as exc:
        rev = f" at revision {revision!r}" if revision else ""
        if download:  # the download itself failed: say why, not "download it"
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            raise ModelNotFoundError(
                f"could not download {repo_id!r}{rev} from the Hugging Face Hub into "
                f"{where_cache}: {type(cause).__name__}: {_first_line(cause)}; check the "
                "network (or HF_ENDPOINT / HF_HUB_OFFLINE), or download it elsewhere and "
                "pass its directory"
            ) from exc
        raise ModelNotFoundError(
            f"{repo_id!r}{rev} is not a file or directory, and as a Hugging Face repository "
            f"id it is not in the local Hugging Face cache ({where_cache}); "
            f"download it first (hf download {repo_id}"
            f"{' --include ' + repr(filename) if filename else ''}), or pass "
            f"{download_option} to let huggingface_hub fetch it"
        ) from exc
    except (OSError, ValueError) as exc:  # a bad revision, a broken cache entry
        raise ModelNotFoundError(
            f"cannot resolve {repo_id!r} in the Hugging Face cache ({where_cache}): {exc}"
        ) from exc
    path = Path(str(snapshot))
    if filename is not None:
        return _pick_file(path, filename, f"the cached snapshot of {repo_id}")
    return path


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]


def resolve_model_spec(
    spec: str | os.PathLike[str] | None,
    *,
    filename: str | None = None,
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    hf_cache_dir: str | os.PathLike[str] | None = None,
    download: bool = False,
    download_option: str = "download=True",
    log: TextIO | None = None,
) -> ResolvedModel:
    """The file or directory to load for `spec` (see the module docstring for the rule).
    None is the default named model. Progress of a first-use fetch goes to `log`."""
    if spec is None:
        return resolve_model(None, cache_dir, log=log)
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if path.exists():
        if filename is not None and path.is_dir():
            return ResolvedModel(_pick_file(path, filename, str(path)), None)
        return ResolvedModel(path, None)
    if lookup_name(text) is not None:
        return resolve_model(text, cache_dir, log=log)
    if looks_like_repo_id(text) and path.suffix.lower() not in _FILE_SUFFIXES:
        snapshot = resolve_hf_snapshot(text, filename=filename, revision=revision,
                                       cache_dir=hf_cache_dir, download=download,
                                       download_option=download_option)
        return ResolvedModel(snapshot, text)
    raise ModelNotFoundError(not_found_message(text, cache_dir))


def not_found_message(spec: str, cache_dir: str | os.PathLike[str] | None = None) -> str:
    names = ", ".join(
        m.name + (f" (alias {', '.join(m.aliases)})" if m.aliases else "")
        for m in NAMED_MODELS.values()
    )
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return (
        f"no model {spec!r}: the path {str(Path(spec).expanduser())!r} does not exist, "
        f"and it is not a named model ({names}; fetched into {cache} on first use) nor a "
        "Hugging Face repository id (org/name, from the local Hugging Face cache). Pass a "
        ".gguf file, a Hugging Face checkpoint directory, a native container, a named model "
        "or org/name"
    )
