"""Building a tokenizer from the vocabulary embedded in a GGUF file (llama.cpp's conventions).

* ``tokenizer.ggml.model = gpt2``: byte-level BPE. The text is split by the regexes of its
  ``tokenizer.ggml.pre`` family (see :mod:`.pretok`), mapped to GPT-2 byte symbols and
  merged by rank (``tokenizer.ggml.merges``) with the ``tokenizers`` library's BPE model.
* ``tokenizer.ggml.model = llama``: SentencePiece (llama.cpp's "SPM"). llama.cpp merges the
  adjacent pair whose concatenation is the vocabulary entry with the highest score, and
  falls back to ``<0xXX>`` byte tokens for characters that are not in the vocabulary. The
  same result comes from a BPE model whose merge list holds every split ``(a, b)`` of every
  token ``a + b``, ranked by the score of ``a + b``, with byte fallback. Spaces become
  ``▁`` and one is put in front of the text and after each special token
  (``tokenizer.ggml.add_space_prefix``, default true).

Special tokens (control, user-defined, unknown types) are matched in the text by the
:class:`~colibri.tokenizers.Tokenizer` itself, before these encoders run.
"""

from __future__ import annotations

import math
from typing import Any

from tokenizers import Regex, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ..errors import ModelFormatError, UnsupportedError
from ..sources.paths import shown
from .pretok import PRE_TOKENIZERS, supported_pre_types
from .vocab import SPECIAL_TYPES, TokenType, VocabData, byte_level_bytes, byte_token_value, eog_ids

SUPPORTED_MODELS = ("gpt2", "llama")
_P = "tokenizer.ggml."


_TYPES = {int(t): t for t in TokenType}


def _types(md: dict[str, Any], n: int, where: str) -> list[TokenType]:
    raw = md.get(_P + "token_type")
    if raw is None:
        return [TokenType.NORMAL] * n
    if not isinstance(raw, list) or len(raw) != n:
        raise ModelFormatError(
            f"{where}: {_P}token_type must be a list with one entry per token ({n}); "
            f"the file is corrupt"
        )
    out = [_TYPES.get(t) if type(t) is int else None for t in raw]
    if None in out:
        i = out.index(None)
        raise ModelFormatError(
            f"{where}: unknown token type {shown(raw[i])} for token {i} in {_P}token_type"
        )
    return out  # type: ignore[return-value]  # no None left


def _opt_id(md: dict[str, Any], key: str, n: int) -> int | None:
    v = md.get(_P + key)
    if type(v) is not int:  # absent, or not an id (a bool, a string...): no such token
        return None
    return v if 0 <= v < n else None


def _check_types(md: dict[str, Any], where: str) -> None:
    """The tokenizer keys this module reads have the types it reads them as."""

    def typed(key: str, kind: type | tuple[type, ...], what: str) -> None:
        v = md.get(_P + key if not key.startswith("tokenizer.") else key)
        if v is not None and not isinstance(v, kind):
            raise ModelFormatError(f"{where}: {key} must be {what}, not {shown(v)}")

    typed("model", str, "a string")
    typed("pre", str, "a string")
    typed("tokenizer.chat_template", str, "a string")
    typed("tokenizer.chat_templates", list, "a list of names")
    for key in ("tokens", "merges"):
        v = md.get(_P + key)
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            raise ModelFormatError(f"{where}: {_P}{key} must be a list of strings")
    scores = md.get(_P + "scores")
    if scores is not None and (
        not isinstance(scores, list)
        or not all(type(x) in (int, float) and math.isfinite(x) for x in scores)
    ):
        raise ModelFormatError(f"{where}: {_P}scores must be a list of finite numbers")


def _utf8(text: str) -> bool:
    """Whether a token's text is valid UTF-8 (the header keeps invalid bytes as
    surrogate escapes, which ``tokenizers`` cannot take)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _encodable(tokens: list[str]) -> list[bool]:
    """Per token: whether it can be handed to ``tokenizers`` (one fast check when all
    can). A token that is not valid UTF-8 can never come out of encoding valid text, so
    leaving it out of the encoder changes nothing; it still decodes to its bytes."""
    try:
        "".join(tokens).encode("utf-8")
        return [True] * len(tokens)
    except UnicodeEncodeError:
        return [_utf8(t) for t in tokens]


def vocab_from_gguf(md: dict[str, Any], where: str) -> VocabData:
    """A VocabData from GGUF metadata (keys ``tokenizer.*`` and ``general.name``)."""
    _check_types(md, where)
    model = md.get(_P + "model")
    if model is None:
        raise ModelFormatError(f"{where}: the GGUF file has no tokenizer ({_P}model is missing)")
    if model not in SUPPORTED_MODELS:
        raise UnsupportedError(
            f"{where}: tokenizer model {model!r} is not supported; colibri reads "
            f"{', '.join(repr(m) for m in SUPPORTED_MODELS)} (byte-level BPE, SentencePiece)"
        )
    tokens = md.get(_P + "tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ModelFormatError(f"{where}: {_P}tokens is missing or empty")
    n = len(tokens)
    types = _types(md, n, where)
    name = str(md.get("general.name", "")).lower()

    # Tokens named like control tokens are control tokens (llama.cpp does the same).
    for i in eog_ids(tokens, None):
        if types[i] == TokenType.NORMAL:
            types[i] = TokenType.CONTROL

    bos, eos = _opt_id(md, "bos_token_id", n), _opt_id(md, "eos_token_id", n)
    eot, eom = _opt_id(md, "eot_token_id", n), _opt_id(md, "eom_token_id", n)
    if model == "gpt2":
        data = _bpe(md, tokens, types, where)
    else:
        data = _spm(md, tokens, types, where)
    data.bos_id, data.eos_id = bos, eos
    data.add_bos = bool(md.get(_P + "add_bos_token", data.add_bos))
    data.add_eos = bool(md.get(_P + "add_eos_token", False))
    if data.add_bos and bos is None:
        data.add_bos = False
    if data.add_eos and eos is None:
        data.add_eos = False
    data.eos_ids = frozenset(eog_ids(tokens, eos, (eot, eom)))
    data.chat_template = md.get("tokenizer.chat_template")
    for tname in md.get("tokenizer.chat_templates", []) or []:
        if not isinstance(tname, str):
            raise ModelFormatError(f"{where}: tokenizer.chat_templates must hold names")
        tpl = md.get(f"tokenizer.chat_template.{tname}")
        if isinstance(tpl, str):
            data.chat_templates[str(tname)] = tpl
    if "phi-3" in name or "phi3" in name:
        # Phi-3's tokenizer.json strips whitespace to the right of its special tokens.
        keep = {"<unk>", "<s>", "<|endoftext|>"}
        data.rstrip = frozenset(
            i for i, t in enumerate(tokens)
            if (types[i] in SPECIAL_TYPES or types[i] == TokenType.USER_DEFINED or t == "</s>")
            and t not in keep
        )  # fmt: skip
    return data


def _bpe(md: dict[str, Any], tokens: list[str], types: list[TokenType], where: str) -> VocabData:
    pre_name = md.get(_P + "pre")
    if pre_name is None:
        raise UnsupportedError(
            f"{where}: the byte-level BPE vocabulary has no {_P}pre (pre-tokenizer type); it "
            f"was converted by an old llama.cpp. Convert the model again with a current "
            f"convert_hf_to_gguf.py. supported pre types: {', '.join(supported_pre_types())}"
        )
    pre = PRE_TOKENIZERS.get(str(pre_name))
    if pre is None:
        raise UnsupportedError(
            f"{where}: pre-tokenizer type {pre_name!r} ({_P}pre) is not supported; "
            f"supported: {', '.join(supported_pre_types())}"
        )
    # The BPE model sees the normal tokens; a duplicated text keeps its last normal id.
    ok = _encodable(tokens)
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if types[i] in (TokenType.NORMAL, TokenType.BYTE) and ok[i]:
            vocab[t] = i
    for i, t in enumerate(tokens):
        if ok[i]:
            vocab.setdefault(t, i)
    merges: list[tuple[str, str]] = []
    for m in md.get(_P + "merges", []) or []:
        pos = m.find(" ", 1)
        if pos < 0:
            raise ModelFormatError(f"{where}: malformed BPE merge {m!r} in {_P}merges")
        a, b = m[:pos], m[pos + 1 :]
        if a in vocab and b in vocab and a + b in vocab:
            merges.append((a, b))
    enc = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges))
    enc.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    pieces = [
        byte_level_bytes(t) if types[i] in (TokenType.NORMAL, TokenType.BYTE)
        else t.encode("utf-8", "surrogateescape")
        for i, t in enumerate(tokens)
    ]
    return VocabData(
        tokens=tokens, types=types, pieces=pieces, fragment_encoder=enc, kind="bpe",
        source=where, pre=str(pre_name), add_bos=pre.add_bos,
    )  # fmt: skip


def _spm(md: dict[str, Any], tokens: list[str], types: list[TokenType], where: str) -> VocabData:
    n = len(tokens)
    scores = md.get(_P + "scores")
    if scores is None or len(scores) != n:
        raise ModelFormatError(
            f"{where}: a SentencePiece vocabulary needs {_P}scores with one score per token"
        )
    ok = _encodable(tokens)
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        if ok[i]:
            vocab[t] = i
    # Every way to build a token from two tokens, best score first. Control, unknown and
    # byte tokens are never the result of a merge (they cannot appear in plain text).
    ranked: list[tuple[float, int, int, str, str]] = []
    for i, t in enumerate(tokens):
        if types[i] not in (TokenType.NORMAL, TokenType.USER_DEFINED) or len(t) < 2:
            continue
        if vocab.get(t) != i:
            continue
        s = -float(scores[i])
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in vocab and b in vocab:
                ranked.append((s, i, k, a, b))
    ranked.sort()
    merges = [(a, b) for _s, _i, _k, a, b in ranked]
    has_bytes = all(f"<0x{b:02X}>" in vocab for b in range(256))
    unk = next((t for i, t in enumerate(tokens) if types[i] == TokenType.UNKNOWN and ok[i]), None)
    enc = HFTokenizer(
        models.BPE(vocab=vocab, merges=merges, byte_fallback=has_bytes, unk_token=unk)
    )
    pieces: list[bytes] = []
    for i, t in enumerate(tokens):
        bv = byte_token_value(t) if types[i] == TokenType.BYTE else None
        if bv is not None:
            pieces.append(bytes([bv]))
        elif types[i] == TokenType.NORMAL:
            pieces.append(t.replace("\u2581", " ").encode("utf-8", "surrogateescape"))
        else:
            pieces.append(t.encode("utf-8", "surrogateescape"))
    space_prefix = bool(md.get(_P + "add_space_prefix", True))
    return VocabData(
        tokens=tokens, types=types, pieces=pieces, fragment_encoder=enc, kind="spm",
        source=where, pre=md.get(_P + "pre"), add_bos=True, add_space_prefix=space_prefix,
        escape_whitespace=True, strip_leading_space=space_prefix,
    )  # fmt: skip
