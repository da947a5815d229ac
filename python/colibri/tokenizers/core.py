"""The Tokenizer and its streaming decoder."""

from __future__ import annotations

import codecs
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidRequestError, TokenOutOfRangeError
from .vocab import SPECIAL_TYPES, TokenType, VocabData

_ASCII_SPACE = " \t\n\v\f\r"  # C isspace(), what llama.cpp strips around lstrip/rstrip tokens



# Texts from this many characters are encoded through encode_batch, which releases the GIL
# while the Rust code runs (encode holds it: a 6 MB prompt froze every other Python
# thread, the server's event loop included, for seconds; 41k characters, the most a
# 512-token context lets the server tokenize, held it 100-120 ms on a loaded 2-core
# host). The ids are the same (tests/server/test_loop_hazards.py).
_RELEASE_GIL_FROM = 1 << 12


def _encode_one(enc: Any, text: str, add_special_tokens: bool) -> Any:
    if len(text) >= _RELEASE_GIL_FROM:
        return enc.encode_batch([text], add_special_tokens=add_special_tokens)[0]
    return enc.encode(text, add_special_tokens=add_special_tokens)

class Tokenizer:
    """Text <-> token ids for one model.

    Build one with :meth:`from_gguf` (the vocabulary embedded in a GGUF file, tokenized as
    llama.cpp does) or :meth:`from_hf` (a Hugging Face ``tokenizer.json`` directory,
    tokenized as the ``tokenizers`` library does).
    """

    def __init__(self, data: VocabData) -> None:
        self._d = data
        self._n = len(data.tokens)
        # Special tokens matched in the text, longest first (llama.cpp's order).
        order = sorted(
            (i for i, t in enumerate(data.types)
             if (t in SPECIAL_TYPES or t == TokenType.USER_DEFINED) and data.tokens[i]),
            key=lambda i: -len(data.tokens[i]),
        )  # fmt: skip
        self._specials_all = [(data.tokens[i], i) for i in order]
        self._specials_user = [
            (data.tokens[i], i) for i in order if data.types[i] == TokenType.USER_DEFINED
        ]
        self._skip = frozenset(i for i, t in enumerate(data.types) if t in SPECIAL_TYPES)

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_gguf(
        cls, path_or_reader: str | os.PathLike[str] | Mapping[str, Any] | Any
    ) -> Tokenizer:
        """The tokenizer embedded in a GGUF file: a path, an open ``gguf.GGUFReader``, or
        the file's already parsed metadata (see :meth:`from_gguf_metadata`).

        Raises ModelNotFoundError (no file), ModelFormatError (no or corrupt vocabulary) or
        UnsupportedError (a tokenizer model or pre-tokenizer type colibri does not know).
        """
        from .gguf_meta import TOKENIZER_PREFIXES, metadata_from_reader, read_metadata

        if isinstance(path_or_reader, (str, os.PathLike)):
            md = read_metadata(path_or_reader, TOKENIZER_PREFIXES)
            return cls.from_gguf_metadata(md, str(path_or_reader))
        if isinstance(path_or_reader, Mapping):
            return cls.from_gguf_metadata(path_or_reader)
        where = str(getattr(path_or_reader, "path", "GGUF reader"))
        md = metadata_from_reader(path_or_reader, TOKENIZER_PREFIXES)
        return cls.from_gguf_metadata(md, where)

    @classmethod
    def from_gguf_metadata(
        cls, metadata: Mapping[str, Any], where: str = "GGUF metadata"
    ) -> Tokenizer:
        """The tokenizer described by GGUF key/values that were already parsed, e.g. a
        model's ``Manifest.metadata``, so that the file is not read a second time.
        ``where`` names the source in error messages."""
        from .gguf_vocab import vocab_from_gguf

        return cls(vocab_from_gguf(dict(metadata), where))

    @classmethod
    def from_hf(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """The tokenizer of a Hugging Face model: a directory holding ``tokenizer.json``
        (plus ``tokenizer_config.json`` etc.), or the path of a ``tokenizer.json``."""
        from .hf_vocab import vocab_from_hf

        return cls(vocab_from_hf(Path(path)))

    # ------------------------------------------------------------------ properties

    @property
    def vocab_size(self) -> int:
        """Number of token ids (the largest id + 1)."""
        return self._n

    @property
    def bos_id(self) -> int | None:
        """The beginning-of-sequence token, or None when the vocabulary has none."""
        return self._d.bos_id

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence token declared by the model, or None."""
        return self._d.eos_id

    @property
    def eos_ids(self) -> frozenset[int]:
        """Every token that ends a generation: eos plus end-of-turn / end-of-message tokens
        (``<|im_end|>``, ``<|eot_id|>``, ``<|endoftext|>``...) that the vocabulary has."""
        return self._d.eos_ids

    @property
    def add_bos(self) -> bool:
        """Whether ``encode(..., add_special_tokens=True)`` puts bos first."""
        return self._d.add_bos

    @property
    def add_eos(self) -> bool:
        """Whether ``encode(..., add_special_tokens=True)`` puts eos last."""
        return self._d.add_eos

    @property
    def bos_token(self) -> str | None:
        """The text of the bos token (for chat templates), or None."""
        return None if self._d.bos_id is None else self._d.tokens[self._d.bos_id]

    @property
    def eos_token(self) -> str | None:
        """The text of the eos token (for chat templates), or None."""
        return None if self._d.eos_id is None else self._d.tokens[self._d.eos_id]

    @property
    def chat_template(self) -> str | None:
        """The model's own Jinja chat template, or None when it ships none."""
        return self._d.chat_template

    @property
    def chat_templates(self) -> dict[str, str]:
        """Named extra templates (GGUF ``tokenizer.chat_template.<name>``, HF lists)."""
        return dict(self._d.chat_templates)

    @property
    def kind(self) -> str:
        """``"bpe"`` (GGUF byte-level BPE), ``"spm"`` (GGUF SentencePiece) or ``"hf"``."""
        return self._d.kind

    @property
    def pre_type(self) -> str | None:
        """The GGUF pre-tokenizer type (``tokenizer.ggml.pre``), if any."""
        return self._d.pre

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry (as stored: ``"Ġthe"``, ``"▁the"``), or None."""
        return self._d.token_to_id.get(token)

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry of an id, as stored in the vocabulary."""
        self._check(token_id)
        return self._d.tokens[token_id]

    def token_type(self, token_id: int) -> TokenType:
        """The type of a token (normal, control, user-defined, byte...)."""
        self._check(token_id)
        return self._d.types[token_id]

    def is_special(self, token_id: int) -> bool:
        """True for control/unknown/unused tokens (those ``skip_special`` drops)."""
        self._check(token_id)
        return token_id in self._skip

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token: its text)."""
        self._check(token_id)
        return self._d.pieces[token_id]

    def __repr__(self) -> str:
        pre = f", pre={self._d.pre!r}" if self._d.pre else ""
        return f"Tokenizer({self._d.kind}{pre}, vocab_size={self._n}, source={self._d.source!r})"

    # ------------------------------------------------------------------ encode

    def encode(
        self, text: str, *, add_special_tokens: bool = True, special: bool = True
    ) -> list[int]:
        """Token ids of ``text``.

        ``add_special_tokens``: add the bos (and eos) tokens the model asks for
        (:attr:`add_bos`, :attr:`add_eos`). Use False for text that already holds them,
        such as a rendered chat template.
        ``special``: match the text of special tokens (``<|im_start|>``) as those tokens;
        with False they are tokenized as plain text (safe for untrusted input).
        """
        if not isinstance(text, str):
            raise InvalidRequestError(f"encode() takes a str, not {type(text).__name__}")
        d = self._d
        if d.hf_full is not None:
            enc = d.hf_full if special else d.hf_plain
            return list(_encode_one(enc, text, add_special_tokens).ids)
        out: list[int] = []
        if add_special_tokens and d.add_bos and d.bos_id is not None:
            out.append(d.bos_id)
        prev_special = True  # SentencePiece: a space before the first text fragment
        for frag in self._partition(text, special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            if d.escape_whitespace:
                if d.add_space_prefix and prev_special:
                    frag = " " + frag
                frag = frag.replace(" ", "\u2581")
            out.extend(_encode_one(d.fragment_encoder, frag, False).ids)
            prev_special = False
        if add_special_tokens and d.add_eos and d.eos_id is not None:
            out.append(d.eos_id)
        return out

    @property
    def control_tokens(self) -> list[tuple[str, int]]:
        """The special tokens only ``encode(special=True)`` matches in text (control,
        unknown, unused; not user-defined ones, which both modes match): (text, id) pairs,
        longest text first."""
        user = {tid for _, tid in self._specials_user}
        return [(tok, tid) for tok, tid in self._specials_all if tid not in user]

    def split_special(self, text: str) -> list[str | int]:
        """`text` split around the special tokens ``encode(special=True)`` matches: their
        ids, and the text between them (what :meth:`encode` then encodes piece by
        piece)."""
        return self._partition(text, True)

    def _partition(self, text: str, special: bool) -> list[str | int]:
        """Split text around special tokens, longest token first, as llama.cpp does."""
        frags: list[str | int] = [text] if text else []
        lstrip, rstrip = self._d.lstrip, self._d.rstrip
        for tok, tid in self._specials_all if special else self._specials_user:
            if tok not in text:
                continue
            new: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or tok not in frag:
                    new.append(frag)
                    continue
                parts = frag.split(tok)
                for k, part in enumerate(parts):
                    if k > 0:
                        new.append(tid)
                    if tid in rstrip and k > 0:
                        part = part.lstrip(_ASCII_SPACE)
                    if k + 1 < len(parts) and tid in lstrip:
                        part = part.rstrip(_ASCII_SPACE)
                    if part:
                        new.append(part)
            frags = new
        return frags

    def encode_batch(
        self, texts: Sequence[str], *, add_special_tokens: bool = True, special: bool = True
    ) -> list[list[int]]:
        """:meth:`encode` for each text."""
        return [
            self.encode(t, add_special_tokens=add_special_tokens, special=special) for t in texts
        ]

    # ------------------------------------------------------------------ decode

    def _check(self, token_id: int) -> None:
        if not 0 <= token_id < self._n:
            raise TokenOutOfRangeError(
                f"token id {token_id} is outside the vocabulary (0..{self._n - 1})"
            )

    def decode_bytes(self, ids: Iterable[int], *, skip_special: bool = False) -> bytes:
        """The bytes the ids stand for (what :meth:`decode` turns into text)."""
        pieces = self._d.pieces
        out: list[bytes] = []
        for i in ids:
            i = int(i)
            self._check(i)
            if skip_special and i in self._skip:
                continue
            out.append(pieces[i])
        raw = b"".join(out)
        if self._d.strip_leading_space and raw.startswith(b" "):
            raw = raw[1:]
        return raw

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """The text of the ids. Invalid UTF-8 (a sequence cut short) becomes U+FFFD.

        ``skip_special`` drops control tokens (bos, eos, ``<|im_end|>``...); user-defined
        tokens are always rendered. SentencePiece vocabularies drop the one space their
        encoder puts in front of the text. No other clean-up is done, so
        ``decode(encode(text, add_special_tokens=False)) == text`` for plain text.
        """
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", "replace")

    def stream(
        self, *, skip_special: bool = False, strip_leading_space: bool = True
    ) -> StreamDecoder:
        """A :class:`StreamDecoder` for this tokenizer."""
        return StreamDecoder(
            self, skip_special=skip_special, strip_leading_space=strip_leading_space
        )


class StreamDecoder:
    """Incremental detokenization: feed ids one at a time, get text as soon as it is whole.

    :meth:`add` returns only complete UTF-8 text: the bytes of a character split across
    tokens (emoji, CJK as byte-fallback or byte-level pieces) are held back until the
    character is complete. :meth:`flush` returns what is still held (an incomplete
    sequence becomes U+FFFD). The concatenation of every :meth:`add` and the final
    :meth:`flush` equals ``tokenizer.decode(all_ids, skip_special=skip_special)``.

    ``strip_leading_space=False`` keeps the space a SentencePiece token carries at the start
    of the stream: use it when the text continues a prompt (``"▁Paris"`` -> ``" Paris"``).
    """

    def __init__(
        self, tokenizer: Tokenizer, *, skip_special: bool = False, strip_leading_space: bool = True
    ) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special
        self._strip = strip_leading_space and tokenizer._d.strip_leading_space
        self.reset()

    def reset(self) -> None:
        """Forget everything (held bytes, position at the start of the text)."""
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._at_start = True
        self._ids: list[int] = []

    @property
    def ids(self) -> list[int]:
        """The ids fed so far."""
        return list(self._ids)

    def add(self, token_id: int) -> str:
        """Feed one id; the text that became complete (possibly "")."""
        tok = self._tok
        token_id = int(token_id)
        tok._check(token_id)
        self._ids.append(token_id)
        if self._skip_special and token_id in tok._skip:
            return ""
        piece = tok._d.pieces[token_id]
        if self._at_start and piece:
            self._at_start = False
            if self._strip and piece.startswith(b" "):
                piece = piece[1:]
        return self._dec.decode(piece, final=False)

    def add_many(self, ids: Iterable[int]) -> str:
        """Feed several ids; the text that became complete."""
        return "".join(self.add(i) for i in ids)

    def flush(self) -> str:
        """End of stream: the held-back bytes (an incomplete character becomes U+FFFD)."""
        out = self._dec.decode(b"", final=True)
        self._dec.reset()
        return out

    @property
    def pending(self) -> bool:
        """True while bytes of an incomplete character are held back."""
        return bool(self._dec.getstate()[0])
