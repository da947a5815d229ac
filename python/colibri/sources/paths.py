"""Files a model names must lie inside the model's directory.

Model files come from strangers (docs/reliability.md): a safetensors index, a container
manifest or a symlink in a downloaded directory can name any path on the machine. Every
file a source opens because the model's own files name it (shards, tokenizer files,
container data, a directory's one ``.gguf``) goes through :class:`ModelDir`, which
resolves it, symlinks included, and refuses it unless it lies inside the directory.

One exception keeps the Hugging Face hub cache working: a snapshot directory
(``models--org--name/snapshots/<revision>/``) holds symlinks into the repository's
``blobs/`` directory, so for such a directory that ``blobs/`` is inside too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import ModelFormatError

_MAX_SHOWN = 120  # characters of a hostile name quoted in a message


def shown(name: object) -> str:
    """``repr(name)``, cut short: a message names the entry, never megabytes of it."""
    text = repr(name)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 5] + "...'"


def clip(text: str, limit: int = 40) -> str:
    """A short field of a file (a dtype, a type name), cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


class ModelDir:
    """A model's directory and the files its sources may read."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory)
        self.real = _real(self.path)
        roots = [self.real]
        blobs = self.real.parent.parent / "blobs"
        if self.real.parent.name == "snapshots" and blobs.is_dir():
            roots.append(_real(blobs))  # the hub cache: snapshot files link into blobs/
        self.roots = tuple(roots)

    def contains(self, path: Path) -> bool:
        """Whether ``path`` resolves (symlinks followed) inside the directory."""
        real = _real(path)
        return any(_within(real, r) for r in self.roots)

    def file(self, name: object, what: str, where: object) -> Path:
        """The resolved path of the regular file ``name`` (relative to the directory).

        ``what`` says what the entry is ("shard", "tokenizer file") and ``where`` which file
        or setting named it, for the message. ModelFormatError when the name is not a
        relative path, resolves outside the directory, does not exist, or is not a regular
        file (a FIFO or a device would hang or stream forever).
        """
        path = self._resolve(name, what, where)
        if path is None:
            raise ModelFormatError(
                f"{where}: {what} {shown(name)} is missing from {self.path}; the model is "
                f"incomplete: download or convert it again"
            )
        return path

    def optional(self, name: str, what: str, where: object = None) -> Path | None:
        """Like :meth:`file` for a file the model may lack (tokenizer_config.json,
        generation_config.json...): None when it does not exist."""
        return self._resolve(name, what, self.path if where is None else where)

    def listed(self, path: Path, what: str) -> Path:
        """The resolved path of a file found by listing the directory (a glob match)."""
        return self.file(path.name, what, self.path)

    def _resolve(self, name: object, what: str, where: object) -> Path | None:
        if not isinstance(name, str) or not name or "\0" in name:
            raise ModelFormatError(f"{where}: {what} name {shown(name)} is not a file name")
        if os.path.isabs(name) or name.startswith("~"):
            raise ModelFormatError(
                f"{where}: {what} {shown(name)} is an absolute path; a model may only name "
                f"files inside its directory {self.path}"
            )
        candidate = self.path / name
        if not self.contains(candidate):
            raise ModelFormatError(
                f"{where}: {what} {shown(name)} resolves outside the model directory "
                f"{self.path}; refusing to read it"
            )
        real = _real(candidate)
        try:
            st = real.stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ModelFormatError(f"{where}: {what} {shown(name)} cannot be read ({exc})") from exc
        if not stat.S_ISREG(st.st_mode):
            raise ModelFormatError(f"{where}: {what} {shown(name)} is not a regular file")
        return real
