"""Caller text in a chat prompt stays text: the ids of a rendered conversation.

A chat template writes control tokens (``<|im_start|>``, ``<|eot_id|>``...) as text, so
the rendered prompt must be encoded with special tokens matched. Encoding it whole would
match them inside the caller's strings too: a user message holding ``<|im_start|>system``
would open a real system turn. :func:`encode_chat` keeps them apart:

1. every string the caller passes (message contents and text parts, tool calls' names and
   arguments, tool results, tool definitions, documents, other template variables, and
   the keys of mappings) has each control token's text replaced by a sentinel: a nonce
   drawn for this render (drawn again in the rare case that it occurs in the input), so no
   caller can write one, and the token's index;
2. the template renders the masked values (trimming, splitting or quoting them as it
   likes). A sentinel is lowercase letters and digits, which JSON (``tojson``, ASCII or
   not), Python's ``repr`` and HTML escaping leave as they are; a template that escapes
   the text gets the token's text back unescaped;
3. the rendered text is split around the control tokens it holds (the template's own),
   and the text between them is encoded with the sentinels put back as the literal text
   they stand for, encoded as plain text.

Only control tokens are masked: the tokens ``encode(special=False)`` does not match either
(control, unknown, unused). User-defined added tokens (``<think>``, ``<tool_call>`` in
many vocabularies) are matched in any text, by Hugging Face's tokenizers as well, and stay
as they are. A conversation whose strings hold no control-token text is encoded exactly as
before (the rendered text encoded whole), id for id.

``special_tokens_in_content=True`` (trusted callers only) restores the old behaviour: the
rendered text encoded whole, control tokens matched in the caller's text too.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from ..tokenizers import Tokenizer
from .nesting import check_nesting

__all__ = ["PlainContent", "chat_text", "encode_chat"]

# Sentinel: nonce (a prefix and 128 random bits in hex) + the control token's index
# (decimal) + _CLOSE. Matched without regard to case when put back (a template may
# upper-case a text).
_PREFIX, _CLOSE = "colibriplain", "z"
_ANCHOR = 3


class _Collision(Exception):
    """The drawn nonce occurs in the caller's text: render again with another."""


class PlainContent:
    """One render's masking of caller strings (:meth:`mask`) and the encoding of the text
    the template made of them (:meth:`encode`). Use a new one for each render."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._controls = tokenizer.control_tokens  # longest first
        # Tokens grouped by their first characters, so that a long text is searched once
        # per group (a few dozen) rather than once per token (thousands in some vocabs).
        self._groups: dict[str, list[int]] = {}
        for k, (token, _) in enumerate(self._controls):
            self._groups.setdefault(token[:_ANCHOR], []).append(k)
        self._used = False
        self._nonce = _PREFIX + secrets.token_hex(16)
        self._sentinel = re.compile(re.escape(self._nonce) + r"(\d+)" + _CLOSE, re.IGNORECASE)

    @property
    def used(self) -> bool:
        """Whether :meth:`mask` replaced any control token's text."""
        return self._used

    def mask(self, value: Any) -> Any:
        """A copy of `value` (a str, or lists, tuples, mappings and dataclasses of them:
        a dataclass becomes a dict) with every control token's text in its strings
        replaced by a sentinel. Values of other types are kept as they are. Raises
        _Collision when a string holds this render's nonce (:func:`encode_chat` then
        renders again with a new one), InvalidRequestError when `value` nests deeper than
        chat.nesting.MAX_NESTING (checked first: the copy recurses)."""
        check_nesting(value, "values given to the chat template")
        return self._mask(value)

    def _mask(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._mask_str(value)
        if isinstance(value, Mapping):
            return {self._mask(k): self._mask(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._mask(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self._mask(v) for v in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self._mask(dataclasses.asdict(value))
        return value

    def _mask_str(self, text: str) -> str:
        if self._nonce in text:
            raise _Collision
        found = sorted(k for anchor, group in self._groups.items() if anchor in text
                       for k in group if self._controls[k][0] in text)
        if not found:
            return text
        self._used = True
        # One pass, longest token first at each place: a sentinel once written is not
        # searched again (its digits could be a token's text).
        index = {self._controls[k][0]: k for k in found}
        pattern = "|".join(re.escape(self._controls[k][0]) for k in found)
        return re.sub(pattern, lambda m: f"{self._nonce}{index[m[0]]}{_CLOSE}", text)

    def encode(self, text: str) -> list[int]:
        """The ids of `text` (rendered from masked values): control tokens matched in the
        template's text, each sentinel encoded as the plain text of its token. Text
        without sentinels is encoded whole, as ``encode(special=True)`` does."""
        tok = self._tok
        if not self._used or not self._sentinel.search(text):
            return tok.encode(text, add_special_tokens=False, special=True)
        ids: list[int] = []
        for piece in tok.split_special(text):
            if isinstance(piece, int):
                ids.append(piece)
            else:
                ids.extend(tok.encode(self.text(piece), add_special_tokens=False, special=False))
        return ids

    def text(self, rendered: str) -> str:
        """`rendered` with each sentinel put back as the text of its token: the text
        :meth:`encode` gives the ids of."""
        if not self._used:
            return rendered
        controls = self._controls
        return self._sentinel.sub(
            lambda m: controls[int(m[1])][0] if int(m[1]) < len(controls) else m[0], rendered)


def encode_chat(tokenizer: Tokenizer, render: Callable[[Callable[[Any], Any]], str], *,
                special_tokens_in_content: bool = False) -> list[int]:
    """The ids of a conversation: ``render(plain)`` renders the chat template with every
    value the caller passed wrapped in ``plain(...)`` (which masks control-token text in
    it, see the module docstring) and returns the text; that text is then encoded with
    only the template's own control tokens matched. ``special_tokens_in_content=True``:
    no masking, the text encoded whole with special tokens matched everywhere."""
    if special_tokens_in_content:
        text = render(lambda value: value)
        return tokenizer.encode(text, add_special_tokens=False, special=True)
    plain, text = _render_masked(tokenizer, render)
    return plain.encode(text)


def chat_text(tokenizer: Tokenizer, render: Callable[[Callable[[Any], Any]], str], *,
              special_tokens_in_content: bool = False) -> str:
    """The text :func:`encode_chat` gives the ids of (the same arguments): the template
    rendered from the masked values, with the control tokens' text put back. It differs
    from rendering the values as they are only where a template looks for control-token
    text inside them (or escapes it), and there it is what the model is given."""
    if special_tokens_in_content:
        return render(lambda value: value)
    plain, text = _render_masked(tokenizer, render)
    return plain.text(text)


def _render_masked(tokenizer: Tokenizer, render: Callable[[Callable[[Any], Any]], str],
                   ) -> tuple[PlainContent, str]:
    while True:  # again only if the caller's text holds the nonce (2**-128 by chance)
        plain = PlainContent(tokenizer)
        try:
            return plain, render(plain.mask)
        except _Collision:
            continue
