"""Whether a grammar (colibri.generate.structured's Grammar) admits a whole text, checked
by llguidance byte by byte: a tokenizer whose tokens are the 256 bytes, so no model's
vocabulary decides what can be written."""

from __future__ import annotations

import functools
from typing import Any

import llguidance as llg


class _Bytes:
    def __init__(self) -> None:
        self.eos_token_id, self.bos_token_id = 256, None
        self.tokens = [bytes([i]) for i in range(256)] + [b""]
        self.special_token_ids = [256]

    def __call__(self, data: bytes) -> list[int]:
        return list(data)


@functools.cache
def _tokenizer() -> Any:
    return llg.LLTokenizer(llg.TokenizerWrapper(_Bytes()))


def accepts(grammar: Any, text: str) -> bool:
    """`text` is a whole sentence of `grammar` (every byte allowed, and it may end there)."""
    m = llg.LLMatcher(_tokenizer(), grammar.grammar(), log_level=0)
    if m.is_error():
        raise AssertionError(m.get_error())
    ids = list(text.encode("utf-8"))
    if m.validate_tokens(ids) != len(ids):
        return False
    m.consume_tokens(ids)
    return bool(m.is_accepting())
