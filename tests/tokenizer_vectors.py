"""llama.cpp's tokenizer test vectors, obtained from the llama-cpp-python source distribution.

``vendor/llama.cpp/models/ggml-vocab-<name>.gguf`` is a vocabulary-only GGUF file;
``.gguf.inp`` holds test inputs separated by ``\\n__ggml_vocab_test__\\n`` and ``.gguf.out``
one line of space-separated ids per input (made by llama.cpp with the model's Hugging Face
tokenizer, ``add_special_tokens=False``). The files are MIT-licensed data.

The source distribution is downloaded once with ``pip download`` and only those files are
extracted into ``build/test-data/vocab`` (reused across runs). Set ``COLIBRI_VOCAB_DIR`` to
a directory that already holds them to skip the download.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "test-data"
VOCAB_DIR = CACHE / "vocab"
SDIST_DIR = CACHE / "sdist"
SDIST = "llama-cpp-python==0.3.36"
_MEMBER_DIR = "/vendor/llama.cpp/models/"
_SEP = "\n__ggml_vocab_test__\n"


def vocab_dir() -> Path | None:
    """The directory holding ``ggml-vocab-*.gguf`` (+ .inp/.out), fetching it if needed;
    None when it cannot be obtained (no network, no pip)."""
    env = os.environ.get("COLIBRI_VOCAB_DIR")
    if env:
        return Path(env) if Path(env, "ggml-vocab-gpt-2.gguf").is_file() else None
    if (VOCAB_DIR / "ggml-vocab-gpt-2.gguf.out").is_file():
        return VOCAB_DIR
    archives = sorted(SDIST_DIR.glob("llama_cpp_python-0.3.36.tar.gz"))
    if not archives:
        SDIST_DIR.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--no-build-isolation", SDIST, "-d", str(SDIST_DIR)]  # fmt: skip
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=900)
        except (OSError, subprocess.SubprocessError):
            # --no-build-isolation needs the build backend installed; retry without it.
            cmd.remove("--no-build-isolation")
            try:
                subprocess.run(cmd, check=True, capture_output=True, timeout=900)
            except (OSError, subprocess.SubprocessError):
                return None
        archives = sorted(SDIST_DIR.glob("llama_cpp_python-0.3.36.tar.gz"))
        if not archives:
            return None
    tmp = VOCAB_DIR.with_name("vocab.partial")
    tmp.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archives[0]) as tar:
        for m in tar.getmembers():
            if _MEMBER_DIR not in m.name or not m.isfile():
                continue
            name = m.name.rsplit("/", 1)[1]
            if not name.startswith("ggml-vocab-"):
                continue
            src = tar.extractfile(m)
            if src is not None:
                (tmp / name).write_bytes(src.read())
    tmp.replace(VOCAB_DIR) if not VOCAB_DIR.exists() else None
    return VOCAB_DIR if (VOCAB_DIR / "ggml-vocab-gpt-2.gguf.out").is_file() else None


def vocab_names(directory: Path) -> list[str]:
    """Names (``qwen2``, ``gpt-2``...) of the vocabularies that have test vectors."""
    return sorted(
        p.name[len("ggml-vocab-") : -len(".gguf.inp")]
        for p in directory.glob("ggml-vocab-*.gguf.inp")
    )


def load_vectors(directory: Path, name: str) -> list[tuple[str, list[int]]]:
    """(input text, expected ids) pairs of one vocabulary."""
    base = directory / f"ggml-vocab-{name}.gguf"
    inputs = Path(f"{base}.inp").read_text(encoding="utf-8").split(_SEP)
    outputs = Path(f"{base}.out").read_text(encoding="utf-8").split("\n")
    if inputs and inputs[-1] == "":  # the file ends with a separator
        inputs.pop()
    pairs = []
    for text, line in zip(inputs, outputs, strict=False):
        pairs.append((text, [int(x) for x in line.split()]))
    return pairs
