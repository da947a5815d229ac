"""Building a tokenizer from a Hugging Face ``tokenizer.json`` (+ ``tokenizer_config.json``).

Encoding is delegated to the ``tokenizers`` library (the reference implementation of the
format): its normalizer, pre-tokenizer, model, added tokens and post-processor. Decoding
uses a per-token byte table derived from the file's decoder (byte-level or SentencePiece
``▁`` + byte fallback), so that :class:`~colibri.tokenizers.StreamDecoder` can work one
token at a time; other decoders (WordPiece...) are refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from ..errors import ModelFormatError, ModelNotFoundError, UnsupportedError
from ..sources.paths import ModelDir, shown
from .vocab import TokenType, VocabData, byte_level_bytes, byte_token_value, eog_ids


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelFormatError(f"{path}: cannot be read as JSON: not UTF-8") from exc
    except (OSError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelFormatError(f"{path}: cannot be read as JSON: {shown(exc)}") from exc


def _decoder_kinds(dec: Any) -> list[dict[str, Any]]:
    if not isinstance(dec, dict):
        return []
    if dec.get("type") == "Sequence":
        out: list[dict[str, Any]] = []
        for d in dec.get("decoders", []):
            out.extend(_decoder_kinds(d))
        return out
    return [dec]


def _token_text(v: Any) -> str | None:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _chat_templates(root: ModelDir, config: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    named: dict[str, str] = {}
    default: str | None = None
    tpl = config.get("chat_template")
    if isinstance(tpl, str):
        default = tpl
    elif isinstance(tpl, list):
        for item in tpl:
            if isinstance(item, dict) and isinstance(item.get("template"), str):
                named[str(item.get("name", "default"))] = item["template"]
        default = named.pop("default", None)
    jinja = root.optional("chat_template.jinja", "chat template") if default is None else None
    if jinja is not None:
        try:
            default = jinja.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFormatError(f"{jinja}: the chat template is not UTF-8 text") from exc
    tpl_json = root.optional("chat_template.json", "chat template") if default is None else None
    if tpl_json is not None:
        value = _read_json(tpl_json)
        if isinstance(value, dict) and isinstance(value.get("chat_template"), str):
            default = value["chat_template"]
    return default, named


def _decoding(spec: dict[str, Any], file: Path) -> tuple[Callable[[str], bytes], bool]:
    """How a normal token's text becomes bytes (byte-level or SentencePiece), and whether
    decoding strips one leading space. The structure was parsed by ``tokenizers``
    already; a value of an unexpected type is reported as a malformed file."""
    try:
        decoders = _decoder_kinds(spec.get("decoder"))
        kinds = {d.get("type") for d in decoders}
        strip = False
        if "ByteLevel" in kinds:
            normal = byte_level_bytes
        elif "Metaspace" in kinds or any(
            d.get("type") == "Replace" and (d.get("pattern") or {}).get("String") == "\u2581"
            for d in decoders
        ):
            for d in decoders:
                if d.get("type") == "Strip" and d.get("content") == " " and int(d.get("start", 0)):
                    strip = True
                if d.get("type") == "Metaspace":
                    scheme = d.get(
                        "prepend_scheme", "always" if d.get("add_prefix_space", True) else "never"
                    )
                    strip = strip or scheme != "never"

            def normal(text: str) -> bytes:
                return text.replace("\u2581", " ").encode("utf-8")
        else:
            raise UnsupportedError(
                f"{file}: decoder {sorted(k for k in kinds if k) or None} is not supported; "
                f"colibri "
                f"decodes byte-level BPE (ByteLevel) and SentencePiece-style (Metaspace, or "
                f"Replace '\u2581' + ByteFallback) tokenizers"
            )
    except (AttributeError, TypeError, ValueError) as exc:
        raise ModelFormatError(
            f"{file}: malformed decoder in tokenizer.json ({shown(exc)})"
        ) from exc
    return normal, strip


def vocab_from_hf(path: Path) -> VocabData:
    """A VocabData from a directory holding ``tokenizer.json`` or from that file."""
    # Every file is read from the tokenizer's directory, symlinks resolving inside it.
    root = ModelDir(path if path.is_dir() else path.parent)
    found = root.optional("tokenizer.json" if path.is_dir() else path.name, "tokenizer file")
    file = path / "tokenizer.json" if path.is_dir() else path
    if found is None:
        hint = ""
        if path.is_dir() and (path / "tokenizer.model").is_file():
            hint = (
                " (the directory has a SentencePiece tokenizer.model only; save the tokenizer "
                "with transformers' save_pretrained() to get a tokenizer.json)"
            )
        raise ModelNotFoundError(f"{file}: no tokenizer.json{hint}")
    file = found
    try:
        tk = HFTokenizer.from_file(str(file))
    except Exception as exc:  # the library raises plain Exception for malformed files
        raise ModelFormatError(f"{file}: not a valid tokenizer.json: {str(exc)[:200]}") from exc
    tk.no_truncation()
    tk.no_padding()
    spec = _read_json(file)
    if not isinstance(spec, dict):
        raise ModelFormatError(f"{file}: expected a JSON object")
    cfg_file = root.optional("tokenizer_config.json", "tokenizer file")
    config = _read_json(cfg_file) if cfg_file is not None else {}
    if not isinstance(config, dict):
        raise ModelFormatError(f"{cfg_file}: expected a JSON object")

    full_vocab: dict[str, int] = tk.get_vocab(with_added_tokens=True)
    n = max(full_vocab.values()) + 1 if full_vocab else 0
    if n > 2 * len(full_vocab) + 65536:  # ids index lists below: they must be dense-ish
        raise ModelFormatError(
            f"{file}: token ids go up to {n - 1} for {len(full_vocab)} tokens; the file is corrupt"
        )
    tokens = [""] * n
    for text, i in full_vocab.items():
        tokens[i] = text
    added = tk.get_added_tokens_decoder()
    model = spec.get("model") or {}
    byte_fallback = isinstance(model, dict) and bool(model.get("byte_fallback", False))
    present = set(full_vocab.values())
    types = [TokenType.NORMAL] * n
    for i in range(n):
        if i in added:
            types[i] = TokenType.CONTROL if added[i].special else TokenType.USER_DEFINED
        elif i not in present:
            types[i] = TokenType.UNUSED
        elif byte_fallback and byte_token_value(tokens[i]) is not None:
            types[i] = TokenType.BYTE

    normal, strip = _decoding(spec, file)
    pieces: list[bytes] = []
    for i, t in enumerate(tokens):
        if types[i] == TokenType.BYTE:
            pieces.append(bytes([byte_token_value(t) or 0]))
        elif types[i] == TokenType.NORMAL:
            pieces.append(normal(t))
        else:
            pieces.append(t.encode("utf-8"))

    def special_id(key: str) -> int | None:
        text = _token_text(config.get(key))
        return full_vocab.get(text) if text is not None else None

    bos, eos = special_id("bos_token"), special_id("eos_token")
    # What the post-processor adds around a text decides add_bos / add_eos.
    try:
        plain = tk.encode("a", add_special_tokens=False).ids
        wrapped = tk.encode("a", add_special_tokens=True).ids
    except Exception as exc:  # the library raises plain Exception
        raise ModelFormatError(f"{file}: the tokenizer cannot encode text: {shown(exc)}") from exc
    head: list[int] = []
    tail: list[int] = []
    for k in range(len(wrapped) - len(plain) + 1):
        if wrapped[k : k + len(plain)] == plain:
            head, tail = wrapped[:k], wrapped[k + len(plain) :]
            break
    extra: list[int | None] = []
    gen_file = root.optional("generation_config.json", "generation config")
    if gen_file is not None:
        gen = _read_json(gen_file)
        value = gen.get("eos_token_id") if isinstance(gen, dict) else None
        extra.extend(value if isinstance(value, list) else [value])
    eos_ids = eog_ids(tokens, eos, tuple(
        int(x) for x in extra if isinstance(x, int) and not isinstance(x, bool)
    ))  # fmt: skip
    template, named = _chat_templates(root, config)

    plain_tk = HFTokenizer.from_str(tk.to_str())
    plain_tk.encode_special_tokens = True
    return VocabData(
        tokens=tokens, types=types, pieces=pieces, fragment_encoder=tk, kind="hf",
        source=str(file), bos_id=bos, eos_id=eos,
        add_bos=bos is not None and bos in head, add_eos=eos is not None and eos in tail,
        eos_ids=frozenset(i for i in eos_ids if 0 <= i < n), strip_leading_space=strip,
        chat_template=template, chat_templates=named, hf_full=tk, hf_plain=plain_tk,
        token_to_id=dict(full_vocab),
    )  # fmt: skip
