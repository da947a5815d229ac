"""Structured output: constrain generation to a JSON schema, a regular expression, a list
of choices or a Lark/GBNF grammar (``response_format=`` of the generation calls).

The constraint is enforced by `llguidance <https://github.com/guidance-ai/llguidance>`_
(MIT, a Rust library with Python bindings, one wheel and no dependencies): at every step
it gives the set of tokens that keep the text a valid prefix of the language, and every
other token's logit becomes ``-inf`` before sampling. Why llguidance (docs/api.md has
the comparison): of the three libraries made for this, it is the one that takes all four
kinds (JSON schema, regex, choice, Lark/GBNF grammar) through one engine with a small,
dependency-free wheel. xgrammar 0.2.9 declares torch, transformers, triton and
apache-tvm-ffi as install requirements; outlines-core 0.2.14 compiles regular languages
(regex, and JSON schemas through regex) but no context-free grammars. llguidance takes the
vocabulary as bytes, so colibri's own tokenizers (GGUF-embedded or tokenizer.json) plug
in offline, and its mask computation releases the GIL.

Off the hot path: the mask for the next token is computed on a worker thread while the
model's forward pass for that token runs (both release the GIL), so a constrained
decode step costs about one forward, not a forward plus a mask. The first mask is
computed during the prefill.

The text always parses when the generation ends with finish reason ``"stop"``: the
constraint only lets EOS through when the text is complete, and generation ends by itself
once nothing more may follow. With ``"length"`` (max_tokens reached first) it is a
prefix of a valid text.

Bounded (issue 35, item 4): every format is held to its
:class:`~colibri.generate.grammar_limits.GrammarLimits` before llguidance sees it, and
:func:`compile_format` compiles it and computes its first mask within a wall-clock limit,
so whatever a grammar can show before its first token is an InvalidRequestError then
(the server compiles while it plans a request, before a stream's 200). A matcher that
fails later (llguidance's lexer out of states) is the request's error too.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from ..errors import InternalError, InvalidRequestError, UnsupportedError
from .grammar_limits import (
    GrammarLimits,
    check_choices,
    check_grammar_text,
    check_regex,
    schema_text,
)

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer

__all__ = [
    "Choice",
    "Compiled",
    "Constraint",
    "Grammar",
    "GrammarLimits",
    "JsonSchema",
    "Regex",
    "ResponseFormat",
    "compile_format",
    "response_format",
]


def _llg() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # pragma: no cover - a dependency of colibri
        raise UnsupportedError(
            "structured output needs the llguidance package: pip install llguidance"
        ) from exc
    return llguidance


def _parser_limits() -> Any:
    """llguidance's own limits (its defaults bound the fuel of each lexer and parser step),
    with short errors: a verbose one dumps the grammar and the parser state."""
    return _llg().LLParserLimits(verbose_errors=False)


def _first_line(err: str) -> str:
    return (err.strip().splitlines() or [""])[0][:500]


def _validated(grammar: str, what: str) -> str:
    err = _llg().LLMatcher.validate_grammar(grammar, None, limits=_parser_limits())
    if err and not err.startswith("WARNING"):
        raise InvalidRequestError(f"response_format: the {what} is not valid: "
                                  f"{_first_line(err)}")
    return grammar


def _limits(limits: GrammarLimits | None) -> GrammarLimits:
    return GrammarLimits() if limits is None else limits


@dataclass(frozen=True)
class JsonSchema:
    """Output a JSON value matching ``schema`` (a JSON Schema as a dict or JSON text;
    None: any JSON object). ``whitespace="compact"`` (default) writes ``{"a": 1, "b": [2,
    3]}``; ``"flexible"`` lets the model put newlines and indentation between tokens.
    ``limits``: what the schema may hold (:class:`GrammarLimits`; None: the defaults)."""

    schema: Mapping[str, Any] | str | None = None
    whitespace: Literal["compact", "flexible"] = "compact"
    limits: GrammarLimits | None = None

    def grammar(self) -> str:
        schema: Any = {"type": "object"} if self.schema is None else self.schema
        text = schema_text(schema, _limits(self.limits))
        opts: dict[str, Any] = (
            {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
            if self.whitespace == "compact" else {"whitespace_flexible": True}
        )  # fmt: skip
        try:
            g = _llg().LLMatcher.grammar_from_json_schema(text, overrides=opts)
        except ValueError as exc:
            raise InvalidRequestError(f"response_format: the JSON schema is not valid: "
                                      f"{_first_line(str(exc))}") from exc
        return _validated(g, "JSON schema")


@dataclass(frozen=True)
class Regex:
    """Output text that matches the regular expression ``pattern`` in full (Rust ``regex``
    syntax: no look-around or back-references)."""

    pattern: str
    limits: GrammarLimits | None = None

    def grammar(self) -> str:
        if not isinstance(self.pattern, str):
            raise InvalidRequestError("response_format: a regex pattern must be a string")
        check_regex(self.pattern, _limits(self.limits))
        return _validated(_llg().LLMatcher.grammar_from_regex(self.pattern), "regular expression")


@dataclass(frozen=True)
class Choice:
    """Output exactly one of ``options``."""

    options: Sequence[str]
    limits: GrammarLimits | None = None

    def grammar(self) -> str:
        opts = list(self.options)
        if not opts or not all(isinstance(o, str) and o for o in opts):
            raise InvalidRequestError("response_format: a choice needs non-empty strings")
        check_choices(opts, _limits(self.limits))
        lark = "start: " + " | ".join(json.dumps(o) for o in opts)
        return _validated(_llg().LLMatcher.grammar_from_lark(lark), "choice list")


@dataclass(frozen=True)
class Grammar:
    """Output text of the context-free grammar ``text``: Lark syntax (``syntax="lark"``,
    llguidance's dialect, start rule ``start``) or llama.cpp's GBNF (``syntax="gbnf"``,
    start rule ``root``)."""

    text: str
    syntax: Literal["lark", "gbnf"] = "lark"
    limits: GrammarLimits | None = None

    def check_limits(self) -> None:
        """The text within ``limits.max_grammar_bytes`` (before it is converted or read)."""
        check_grammar_text(self.text, _limits(self.limits))

    def grammar(self) -> str:
        llg = _llg()
        if not isinstance(self.text, str):
            raise InvalidRequestError("response_format: a grammar must be a string")
        self.check_limits()
        text = self.text
        if self.syntax == "gbnf":
            try:
                from llguidance.gbnf_to_lark import gbnf_to_lark

                text = gbnf_to_lark(text)
            except RecursionError:
                raise InvalidRequestError("response_format: the GBNF grammar is nested too "
                                          "deep to convert") from None
            except Exception as exc:  # the converter raises plain Exceptions
                raise InvalidRequestError(f"response_format: the GBNF grammar is not valid: "
                                          f"{exc}") from exc
        return _validated(llg.LLMatcher.grammar_from_lark(text), f"{self.syntax} grammar")


@dataclass(frozen=True, eq=False)
class Compiled:
    """A format compiled for one tokenizer (:func:`compile_format`): the matcher after its
    first mask, copied by each generation that uses it, so a server compiles a request's
    grammar once, before it answers, and the generations start from it."""

    source: JsonSchema | Regex | Choice | Grammar
    tokenizer: Tokenizer
    n_vocab: int
    text: str  # llguidance's grammar
    matcher: Any = field(repr=False)  # never advanced: each generation takes a deep_copy
    first_mask: bytes = field(repr=False)

    def grammar(self) -> str:
        return self.text


ResponseFormat = JsonSchema | Regex | Choice | Grammar | Compiled


def response_format(value: object, limits: GrammarLimits | None = None) -> ResponseFormat:
    """A :data:`ResponseFormat` from one, or from an OpenAI-style mapping:
    ``{"type": "json_object"}``, ``{"type": "json_schema", "json_schema": {"schema":
    {...}}}`` (``{"type": "json_object", "schema": {...}}`` as llama-cpp-python writes it),
    ``{"type": "regex", "pattern": ...}``, ``{"type": "choice", "choices": [...]}``,
    ``{"type": "grammar", "grammar": ..., "syntax": "lark" | "gbnf"}``. `limits`: those
    of a format made from a mapping (None: the defaults)."""
    if isinstance(value, (JsonSchema, Regex, Choice, Grammar, Compiled)):
        return value
    if not isinstance(value, Mapping):
        raise InvalidRequestError(
            "response_format must be a colibri.generate.structured JsonSchema, Regex, Choice or "
            "Grammar, "
            f"or a mapping with a 'type'; got {type(value).__name__}"
        )
    kind = value.get("type")
    if kind == "json_object":
        return JsonSchema(value.get("schema"), limits=limits)
    if kind == "json_schema":
        spec = value.get("json_schema", {})
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if schema is None:
            raise InvalidRequestError("response_format: json_schema needs {'schema': {...}}")
        return JsonSchema(schema, limits=limits)
    if kind == "regex":
        pattern = value.get("pattern", value.get("regex"))
        if not isinstance(pattern, str):
            raise InvalidRequestError("response_format: regex needs a 'pattern' string")
        return Regex(pattern, limits)
    if kind == "choice":
        choices = value.get("choices", ())
        if not isinstance(choices, list | tuple):
            raise InvalidRequestError("response_format: choice needs a 'choices' list")
        return Choice(tuple(choices), limits)
    if kind in ("grammar", "lark", "gbnf"):
        text = value.get("grammar")
        if not isinstance(text, str):
            raise InvalidRequestError("response_format: grammar needs a 'grammar' string")
        syntax = "gbnf" if kind == "gbnf" else value.get("syntax", "lark")
        if syntax == "lark":
            return Grammar(text, "lark", limits)
        if syntax == "gbnf":
            return Grammar(text, "gbnf", limits)
        raise InvalidRequestError(f"response_format: syntax {syntax!r}: use 'lark' or 'gbnf'")
    raise InvalidRequestError(
        f"response_format: unknown type {kind!r}; use 'json_object', 'json_schema', 'regex', "
        "'choice' or 'grammar'"
    )


# --- the tokenizer in llguidance's terms ------------------------------------------------------

_TOKENIZERS: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()


class _Vocabulary:
    """colibri's Tokenizer as llguidance's TokenizerWrapper expects it: every token's bytes
    (special tokens marked with a leading 0xFF byte, llguidance's convention), the EOS and
    BOS ids, and an encoder."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int) -> None:
        self._tok = tokenizer
        n = tokenizer.vocab_size
        self.tokens = [
            (b"\xff" + tokenizer.token_bytes(i)) if tokenizer.is_special(i)
            else tokenizer.token_bytes(i)
            for i in range(n)
        ] + [b""] * max(0, n_vocab - n)  # fmt: skip
        eos = sorted(tokenizer.eos_ids)
        self.eos_token_id = eos[0] if eos else 0
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = [i for i in range(n) if tokenizer.is_special(i)]

    def __call__(self, text: bytes | str) -> list[int]:
        s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        return self._tok.encode(s, add_special_tokens=False, special=False)


def prepare(tokenizer: Tokenizer, n_vocab: int) -> None:
    """Builds llguidance's tokenizer for `tokenizer` now, not at the first request with a
    grammar: the build holds the GIL for 0.2-0.6 s (llguidance calls back into Python for
    every token), so a server's event loop stalled that long even with the build on a
    worker thread. A no-op without llguidance."""
    try:
        _lltokenizer(tokenizer, n_vocab)
    except UnsupportedError:
        pass


def _lltokenizer(tokenizer: Tokenizer, n_vocab: int) -> Any:
    """llguidance's tokenizer for `tokenizer` (built once per tokenizer: ~0.4 s for a 49k
    vocabulary)."""
    with _TOKENIZERS_LOCK:
        hit = _TOKENIZERS.get(tokenizer)
        if hit is not None and hit[0] == n_vocab:
            return hit[1]
        llg = _llg()
        vocab = _Vocabulary(tokenizer, n_vocab)
        llt = llg.LLTokenizer(llg.TokenizerWrapper(vocab), n_vocab=n_vocab,
                              eos_token=sorted(tokenizer.eos_ids) or None)
        _TOKENIZERS[tokenizer] = (n_vocab, llt)
        return llt


_MASKS = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="colibri-mask")
# Compiles run here, so a caller can stop waiting at GrammarLimits.compile_seconds.
# llguidance cannot be interrupted: a compile past the limit runs on (its fuel limits end
# it) and holds one of these threads meanwhile, so a flood of them waits, not piles up.
_COMPILES = concurrent.futures.ThreadPoolExecutor(max_workers=2,
                                                  thread_name_prefix="colibri-grammar")


def _compile(fmt: JsonSchema | Regex | Choice | Grammar, tokenizer: Tokenizer,
             n_vocab: int) -> Compiled:
    text = fmt.grammar()
    llg = _llg()
    matcher = llg.LLMatcher(_lltokenizer(tokenizer, n_vocab), text, log_level=0,
                            limits=_parser_limits())
    first = matcher.compute_bitmask()
    if matcher.is_error():
        err = _first_line(matcher.get_error())
        why = ("a JSON schema that only refers to itself does this"
               if "NoExtensionBias" in err else "simplify it")
        raise InvalidRequestError(
            f"response_format: the grammar cannot start any output (llguidance: {err}); "
            f"{why}")
    return Compiled(fmt, tokenizer, n_vocab, text, matcher, first)


def compile_format(fmt: ResponseFormat, tokenizer: Tokenizer, n_vocab: int) -> Compiled:
    """`fmt` compiled for `tokenizer` and its first mask computed, within its
    :class:`GrammarLimits` (checked before llguidance sees anything; the compile and the
    first mask within ``compile_seconds`` of wall-clock time): every error a grammar can
    show before its first token, as :class:`~colibri.errors.InvalidRequestError`."""
    if isinstance(fmt, Compiled):
        if fmt.tokenizer is tokenizer and fmt.n_vocab == n_vocab:
            return fmt
        fmt = fmt.source
    limits = _limits(fmt.limits)
    job = _COMPILES.submit(_compile, fmt, tokenizer, n_vocab)
    try:
        return job.result(timeout=limits.compile_seconds)
    except concurrent.futures.TimeoutError:
        raise InvalidRequestError(
            f"response_format: compiling the grammar took longer than "
            f"{limits.compile_seconds:g} s; simplify it, or raise "
            f"GrammarLimits.compile_seconds (colibri serve --grammar-limits "
            f"compile_seconds=S)") from None
    except RecursionError:
        raise InvalidRequestError("response_format: the grammar is nested too deep to "
                                  "compile") from None


class Constraint:
    """One generation's matcher: the allowed-token mask for the next step, computed ahead on
    a worker thread (:meth:`advance` starts it, :meth:`allowed` waits for it)."""

    def __init__(self, fmt: ResponseFormat, tokenizer: Tokenizer, n_vocab: int) -> None:
        self._n = n_vocab
        # Compiled (and its first mask computed) now unless the caller did, so a grammar
        # that validates but cannot start (a schema that is only a $ref to itself) fails
        # here, as the request's error.
        compiled = compile_format(fmt, tokenizer, n_vocab)
        self._matcher = compiled.matcher.deep_copy()
        first: concurrent.futures.Future[bytes] = concurrent.futures.Future()
        first.set_result(compiled.first_mask)
        # The matcher may not be touched while a mask is computed: compute_bitmask holds
        # it (mutably borrowed, the GIL released) on the mask thread, and any other call
        # meanwhile raises "Already mutably borrowed". So whether it has stopped is read
        # once per token, before the next mask starts, and remembered.
        self._stopped = bool(self._matcher.is_stopped())
        self._pending = first

    def _check(self) -> None:
        # Past the first mask, an error is the grammar's: llguidance's fuel or lexer-state
        # limits (a regex whose states multiply as the text grows), not the model's.
        if self._matcher.is_error():
            raise InvalidRequestError(
                f"response_format: the grammar went past llguidance's limits during "
                f"generation ({_first_line(self._matcher.get_error())}); simplify it")

    @property
    def done(self) -> bool:
        """Nothing may follow the text any more (only EOS): the generation ends."""
        return self._stopped

    def allowed(self) -> npt.NDArray[np.bool_]:
        """Which token ids keep the text valid ([vocab] bools), waiting for the mask."""
        bits = self._pending.result()
        self._check()
        mask = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), bitorder="little")[: self._n]
        return mask.astype(bool)

    def apply(self, logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.floating[Any]]:
        allowed = self.allowed()
        if not allowed.any():
            raise InternalError("structured output: no token is allowed (the grammar is stuck)")
        out: npt.NDArray[np.floating[Any]] = np.where(allowed, logits, -np.inf).astype(
            logits.dtype, copy=False)
        return out

    def advance(self, token_id: int) -> None:
        """Feeds the chosen token and starts computing the next mask."""
        if not self._matcher.consume_token(int(token_id)):
            self._check()
            raise InternalError(f"structured output: token {token_id} was refused after the mask "
                                "allowed it")
        self._stopped = bool(self._matcher.is_stopped())
        if not self._stopped:
            self._pending = _MASKS.submit(self._matcher.compute_bitmask)

    def close(self) -> None:
        """Waits for a mask still being computed (the matcher is not shared)."""
        concurrent.futures.wait([self._pending])
