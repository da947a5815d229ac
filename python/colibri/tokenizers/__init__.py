"""Tokenizers: GGUF-embedded vocabularies (as llama.cpp tokenizes them) and Hugging Face
``tokenizer.json`` files. The public names are re-exported by :mod:`colibri.tokenizers`."""

from __future__ import annotations

from .core import StreamDecoder, Tokenizer
from .pretok import supported_pre_types
from .vocab import TokenType

__all__ = ["StreamDecoder", "TokenType", "Tokenizer", "supported_pre_types"]
