"""Chat templates' control-token markers, and a tokenizer whose control tokens they are.

The real templates (build/test-data/templates, support/tokenizer_vectors.templates_dir)
come without their models' tokenizers. :func:`marker_tokenizer` builds one that has every
template's markers as control tokens: SmolLM2's tokenizer.json (byte-level BPE) with the
markers added as special tokens through the ``tokenizers`` library, so that one tokenizer
serves every template family. :func:`plain_encoder` is the same tokenizer in the
``tokenizers`` library with special tokens not matched (``encode_special_tokens``): the
oracle for text encoded as plain text.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

from support.tokenizer_vectors import hf_tokenizer_dir, smollm2_gguf, templates_dir

BOS, EOS = "<s>", "</s>"  # what the templates get as bos_token / eos_token

# The shapes control tokens take in the templates: <|im_start|>, DeepSeek's <|User|> with
# full-width bars (U+FF5C), <|turn>,
# [INST], [gMASK], <start_of_turn>. Generic tags (<think>, <tool_call>) are left out:
# they are ordinary (user-defined) tokens in most vocabularies.
_MARKER = re.compile(
    r"<\|[^<>|\s'\"]{1,40}\|>|<\uff5c[^<>\uff5c'\"]{1,40}\uff5c>|<\|[a-z_]{1,30}>|\[/?[A-Z_]{3,30}\]"
    r"|\[gMASK\]|<(?:start|end)_of_turn>"
)


@functools.cache
def template_sources() -> dict[str, str]:
    """Every real template's Jinja source, by file name."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(templates_dir().glob("*.jinja"))}


def markers(source: str) -> list[str]:
    """The control-token markers a template's source writes (plus bos and eos), longest
    first."""
    found = set(_MARKER.findall(source)) | {BOS, EOS}
    return sorted(found, key=lambda m: (-len(m), m))


@functools.cache
def _marker_tokenizer_json() -> Path:
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    src = hf_tokenizer_dir("smollm2", smollm2_gguf()) / "tokenizer.json"
    every = sorted({m for s in template_sources().values() for m in markers(s)})
    tk = HFTokenizer.from_file(str(src))
    tk.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in every])
    out = Path(tempfile.mkdtemp(prefix="colibri-markers-")) / "tokenizer.json"
    tk.save(str(out))
    return out


@functools.cache
def marker_tokenizer() -> object:
    """colibri's Tokenizer of SmolLM2's vocabulary plus every template's markers as
    control tokens (cached per process)."""
    from colibri.tokenizers import Tokenizer

    return Tokenizer.from_hf(_marker_tokenizer_json())


@functools.cache
def plain_encoder() -> object:
    """The ``tokenizers`` library's tokenizer of :func:`marker_tokenizer`, special tokens
    encoded as plain text."""
    from tokenizers import Tokenizer as HFTokenizer

    tk = HFTokenizer.from_file(str(_marker_tokenizer_json()))
    tk.encode_special_tokens = True
    return tk
