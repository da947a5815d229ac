"""Tokenizers for colibri models (see docs/tokenizer.md).

>>> tok = Tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")   # doctest: +SKIP
>>> ids = tok.encode("Hello world")                                  # doctest: +SKIP
>>> tok.decode(ids)                                                  # doctest: +SKIP
'Hello world'

:class:`Tokenizer` reads the vocabulary embedded in a GGUF file (byte-level BPE with the
pre-tokenizer named by ``tokenizer.ggml.pre``, or SentencePiece) and tokenizes exactly as
llama.cpp does; or a Hugging Face ``tokenizer.json``. :class:`StreamDecoder` turns ids into
text one token at a time without ever emitting a broken UTF-8 sequence.
"""

from __future__ import annotations

from .tokenizers import StreamDecoder, Tokenizer, TokenType, supported_pre_types

__all__ = ["StreamDecoder", "TokenType", "Tokenizer", "supported_pre_types"]
