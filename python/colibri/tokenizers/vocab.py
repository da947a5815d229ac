"""The data behind a :class:`~colibri.tokenizers.Tokenizer`, whatever file it came from."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache
from typing import Any


class TokenType(IntEnum):
    """GGUF ``tokenizer.ggml.token_type`` values (llama.cpp's ``llama_token_type``)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# Token types that decode to nothing when ``skip_special=True`` and that are only matched
# in the text when ``special=True`` (user-defined tokens are always matched and rendered).
SPECIAL_TYPES = frozenset({TokenType.CONTROL, TokenType.UNKNOWN, TokenType.UNUSED})

# Token texts that end a generation (llama.cpp's end-of-generation list, llama-vocab.cpp).
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
    "<end_of_utterance>", "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek
})  # fmt: skip


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character that stands for each
    byte in a byte-level BPE vocabulary -> the byte."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def byte_level_bytes(text: str) -> bytes:
    """The bytes a byte-level BPE token stands for (characters outside the alphabet,
    which a well-formed vocabulary does not have, are kept as their UTF-8)."""
    table = byte_decoder()
    try:
        return bytes(table[c] for c in text)
    except KeyError:
        return b"".join(
            bytes([table[c]]) if c in table else c.encode("utf-8", "surrogateescape") for c in text
        )


def byte_token_value(text: str) -> int | None:
    """The byte of a SentencePiece byte-fallback token ``<0xAB>``, or None."""
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return int(text[3:5], 16)
        except ValueError:
            return None
    return None


def eog_ids(tokens: list[str], eos: int | None, extra: tuple[int | None, ...] = ()) -> set[int]:
    """End-of-generation ids: eos, the given eot/eom ids and the tokens named like one."""
    # Ids from a config (generation_config.json's eos_token_id) may lie outside the
    # vocabulary: such an id can never be generated, so it is no end-of-generation id.
    ids = {i for i in (eos, *extra) if i is not None and 0 <= i < len(tokens)}
    ids.update(i for i, t in enumerate(tokens) if t in EOG_TEXTS)
    # o200k_harmony (gpt-oss): "<|end|>" ends a message, not the generation.
    texts = {tokens[i] for i in ids}
    if {"<|return|>", "<|call|>", "<|end|>"} <= texts:
        ids = {i for i in ids if tokens[i] != "<|end|>"}
    return ids


@dataclass
class VocabData:
    """Everything a Tokenizer needs; built by ``gguf_vocab`` or ``hf_vocab``."""

    tokens: list[str]  # id -> text as stored in the vocabulary
    types: list[TokenType]  # id -> token type
    pieces: list[bytes]  # id -> the bytes the token decodes to
    fragment_encoder: Any  # tokenizers.Tokenizer that encodes plain text (no special tokens)
    kind: str  # "bpe" (byte-level), "spm" (SentencePiece) or "hf" (tokenizer.json)
    source: str  # where the vocabulary came from, for messages
    bos_id: int | None = None
    eos_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    eos_ids: frozenset[int] = frozenset()
    pre: str | None = None  # GGUF tokenizer.ggml.pre
    add_space_prefix: bool = False  # SentencePiece: " " before the text (and after specials)
    escape_whitespace: bool = False  # SentencePiece: " " -> "▁" before encoding
    strip_leading_space: bool = False  # decode drops one leading space (SentencePiece)
    lstrip: frozenset[int] = frozenset()  # special tokens that eat whitespace on their left
    rstrip: frozenset[int] = frozenset()  # ... and on their right
    chat_template: str | None = None
    chat_templates: dict[str, str] = field(default_factory=dict)  # named extra templates
    # Hugging Face tokenizer.json: the full tokenizer (special tokens, post-processor) and
    # a copy that does not match special tokens in the text.
    hf_full: Any = None
    hf_plain: Any = None
    token_to_id: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.token_to_id:
            # llama.cpp keeps the last id of a duplicated text; so do we.
            self.token_to_id = {t: i for i, t in enumerate(self.tokens)}
