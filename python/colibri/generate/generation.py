"""Text generation on a session: the decode loop behind ``Model.generate``/``stream`` and
``Session.generate``, and the typed records it returns.

The loop is plain Python over the public pieces (``Session.forward``, a
:class:`~colibri.sampling.Sampler`, a :class:`~colibri.tokenizers.StreamDecoder`, a
:class:`~colibri.sampling.StopChecker`), so a custom loop can do everything it does.

A KeyboardInterrupt during a forward stops it within one layer and leaves the session as
it was before that forward (see colibri.generate.session), so an interrupted generation leaves the
session consistent: every token it holds has its KV entries. The exception propagates to
the caller; the model stays usable.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from ..display import Displayable, duration, sig3
from ..engine.stats import ExpertStats, PhaseTimes
from ..errors import ContextOverflowError, InvalidRequestError, NumericalError
from ..sampling import Sampler, Sampling, StopChecker, StopStatus
from .logprobs import Logprob

if TYPE_CHECKING:
    from ..speculative import SpecStats, Speculator
    from ..tokenizers import Tokenizer
    from .decoding import Decoder
    from .session import Session

FinishReason = Literal["stop", "length"]


def rate(count: int, seconds: float) -> float:
    """count / seconds, 0 when nothing was timed (tok/s of a phase that did not run)."""
    return count / seconds if seconds > 0 else 0.0


@dataclass(frozen=True, repr=False)
class GenerationStats(Displayable):
    """Timing of one generation (seconds are wall-clock)."""

    prompt_tokens: int  # tokens prefilled for this generation
    generated_tokens: int  # tokens sampled (EOS included)
    prefill_seconds: float  # forward of the prompt
    decode_seconds: float  # forwards of the generated tokens
    sampling_seconds: float  # sampler, detokenizer and stop checks
    # Decode forwards run: the first sampled token comes from the prefill's logits, so n
    # generated tokens need n - 1 of them.
    decode_tokens: int = 0
    # The streaming tier during this generation (Model fills them in; None for a session's
    # own generate, which has no model-wide counters to difference).
    experts: ExpertStats | None = None
    phases: PhaseTimes | None = None
    wait_policy: str = ""  # the wait policy in effect at the end
    # Prompt tokens already in the session (the prompt cache, or a session continuing):
    # not prefilled, not in prompt_tokens.
    cached_tokens: int = 0
    # Speculative decoding's figures (None when it was off): with drafting, a forward
    # produces one token or more.
    spec: SpecStats | None = None

    @property
    def prefill_tok_s(self) -> float:
        return rate(self.prompt_tokens, self.prefill_seconds)

    @property
    def decode_tok_s(self) -> float:
        """Tokens produced by the decode forwards per second of them."""
        produced = self.decode_tokens if self.spec is None else self.spec.decode_tokens
        return rate(produced, self.decode_seconds)

    def _display_rows(self) -> list[tuple[str, str]]:
        rows = [
            ("prompt", f"{self.prompt_tokens} tokens in {duration(self.prefill_seconds)} "
                       f"({sig3(self.prefill_tok_s)} tok/s)"
                       + (f", {self.cached_tokens} cached" if self.cached_tokens else "")),
            ("generated", f"{self.generated_tokens} tokens, decode {sig3(self.decode_tok_s)} "
                          f"tok/s ({self.decode_tokens} forwards in "
                          f"{duration(self.decode_seconds)})"),
            ("sampling", duration(self.sampling_seconds)),
        ]
        if self.spec is not None:
            rows.append(("speculative", f"{self.spec.accepted}/{self.spec.drafted} drafts "
                                        f"accepted, {sig3(self.spec.tokens_per_forward)} "
                                        "tokens per forward"))
        if self.experts is not None and self.experts.lookups:
            rows.append(("experts", self.experts.summary()))
        if self.wait_policy:
            rows.append(("wait policy", self.wait_policy))
        return rows

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "prefill_seconds": self.prefill_seconds,
            "decode_seconds": self.decode_seconds,
            "sampling_seconds": self.sampling_seconds,
            "cached_tokens": self.cached_tokens,
            "prefill_tok_s": self.prefill_tok_s,
            "decode_tok_s": self.decode_tok_s,
            **({"experts": self.experts.to_dict()} if self.experts is not None else {}),
            **({"phases": self.phases.to_dict()} if self.phases is not None else {}),
            **({"wait_policy": self.wait_policy} if self.wait_policy else {}),
            **({"spec": self.spec.to_dict()} if self.spec is not None else {}),
        }


# Called when a stream ends: (stats, generated ids, finish reason); the reason is None
# when the stream was abandoned or interrupted before it finished.
OnDone = Callable[[GenerationStats, list[int], "FinishReason | None"], None]


@dataclass(frozen=True)
class Chunk:
    """One step of a stream: the text a token made visible (may be empty while a UTF-8
    sequence or a possible stop string is incomplete)."""

    text: str
    token_id: int | None  # None for the final chunk that only flushes held text
    finish_reason: FinishReason | None = None  # set on the last chunk
    logprobs: Logprob | None = None  # with Sampling(logprobs=True): this token's record
    # A templated generation whose template writes <think> blocks: the reasoning this step
    # made visible (``text`` is then the answer's part; colibri.chat.reasoning).
    reasoning: str = ""


@dataclass(frozen=True, repr=False)
class Generation(Displayable):
    """What a generation produced: the text, its tokens, why it ended, and its figures."""

    text: str
    token_ids: list[int]  # generated ids (an EOS that ended the text included)
    finish_reason: FinishReason
    stats: GenerationStats
    prompt_ids: list[int] = field(default_factory=list)
    # With Sampling(logprobs=True): one record per generated token.
    logprobs: list[Logprob] | None = None
    # With Sampling(prompt_logprobs=k): one per prompt token (None: nothing before it).
    prompt_logprobs: list[Logprob | None] | None = None
    # A templated generation whose template writes <think> blocks: the reasoning, and
    # ``text`` the answer after it (colibri.chat.reasoning); "" otherwise.
    reasoning: str = ""

    def _display_rows(self) -> list[tuple[str, str]]:
        text = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        thought = [("reasoning", f"{len(self.reasoning)} chars")] if self.reasoning else []
        return [
            *thought,
            ("text", repr(text)),
            ("tokens", f"{len(self.token_ids)} generated after {len(self.prompt_ids)} prompt"),
            ("finish", str(self.finish_reason)),
            ("decode", f"{sig3(self.stats.decode_tok_s)} tok/s"),
        ]


def _check_finite(logits: npt.NDArray[np.float32], position: int) -> None:
    """NaN or infinite logits are the model's fault (broken weights, a value that passed
    the load checks), never the request's: NumericalError, not the sampler's
    InvalidRequestError. Two passes over one row of logits, per token."""
    if not (math.isfinite(float(logits.max())) and math.isfinite(float(logits.min()))):
        raise NumericalError(
            f"the model computed non-finite logits (NaN or infinity) at position {position}; "
            f"its weights are corrupt or a config value is out of range. Check the file "
            f"(for a native container: colibri verify) or convert the model again."
        )


def stream_tokens(
    session: Session,
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    sampling: Sampling,
    stop: Sequence[str],
    history: Sequence[int] = (),
    on_done: OnDone | None = None,
    decoder: Decoder | None = None,
    progress: Callable[[int, int], object] | None = None,
    speculator: Speculator | None = None,
    max_time: float | None = None,
) -> Generator[Chunk, None, None]:
    """Prefill ``prompt_ids`` (may be empty when the session already holds tokens and
    its last logits) and decode. Yields chunks; calls ``on_done(stats)`` at the end.
    ``decoder`` adds the optional stages (colibri.generate.decoding: logits processors, logprobs,
    structured output, stop token ids, min_tokens); ``speculator`` drafts tokens to verify
    in batches (colibri.speculative), which never changes the tokens chosen. ``max_time``:
    seconds after which no further token is computed (finish "length", as at max_tokens);
    checked between tokens, so the prefill and the token under way finish first."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise InvalidRequestError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
    room = session.context_length - session.n_tokens
    if len(prompt_ids) > room:
        raise ContextOverflowError(
            f"the prompt has {len(prompt_ids)} tokens but the session has room for {room} "
            f"(context length {session.context_length}, {session.n_tokens} in use); shorten "
            "it, pass truncate=True, or raise EngineConfig.context_length"
        )
    sampler = Sampler(sampling)
    checker = StopChecker(list(stop), tokenizer.eos_ids, max_tokens)
    detok = tokenizer.stream(strip_leading_space=False)
    hist = list(history) + list(prompt_ids)
    t0 = time.perf_counter()
    logits: npt.NDArray[np.float32]
    if prompt_ids:
        logits = (decoder.prefill(session, prompt_ids, progress) if decoder is not None
                  else session.forward(list(prompt_ids), progress=progress))
    else:
        logits = session.last_logits()
    prefill = time.perf_counter() - t0
    decode = sampling_time = 0.0
    generated: list[int] = []
    n_decode = 0
    finish: FinishReason | None = None
    # Speculative decoding (colibri.speculative.verify): drafts forwarded past the last
    # chosen token, and the logits after each, consumed one position at a time. The
    # session holds them until they are decided; `drafts[0]` is the next one to check.
    drafts: list[int] = []
    rows: list[npt.NDArray[np.float32]] = []
    position = 0  # index of drafts[0] in its verify
    try:
        while not checker.done:
            if rows:  # the last token was an accepted draft: its logits are computed
                drafts.pop(0)
                logits = rows.pop(0)
                position += 1
                if not drafts:  # every draft accepted: this is the verify's bonus row
                    assert speculator is not None
                    speculator.on_verify_done()
            elif generated:
                if session.n_tokens >= session.context_length:
                    finish = "length"  # the context is full: stop as at max_tokens
                    break
                if max_time is not None and time.perf_counter() - t0 >= max_time:
                    finish = "length"  # out of time: stop as at max_tokens
                    break
                room = min(session.context_length - session.n_tokens - 1,
                           max_tokens - len(generated) - 1)
                drafts = speculator.draft(hist, room) if speculator is not None else []
                t = time.perf_counter()
                if drafts:
                    out = session.forward([generated[-1], *drafts], all_logits=True)
                    logits, rows, position = out[0], list(out[1:]), 0
                else:
                    logits = session.forward([generated[-1]])
                spent = time.perf_counter() - t
                decode += spent
                n_decode += 1
                if speculator is not None:
                    if drafts:
                        speculator.on_verify(len(drafts), spent)
                    else:
                        speculator.on_plain(spent)
            t = time.perf_counter()
            _check_finite(logits, session.n_tokens - len(drafts))
            lp = None
            if decoder is None:
                tok = sampler(logits, hist)
            else:
                tok, lp = decoder.choose(sampler, logits, hist, len(generated))
            if drafts:
                assert speculator is not None
                tok = speculator.accept(tok, drafts[0])
                if tok == drafts[0]:
                    speculator.on_accept(position)
            generated.append(tok)
            hist.append(tok)
            status = checker.feed(tok, detok.add(tok))
            if not status.done and decoder is not None and decoder.ends_with(tok):
                # A stop token id (its text kept, as vLLM does, unless it is special), or a
                # complete constrained text: nothing may follow.
                status = StopStatus(status.text + checker.flush(), "stop")
            if drafts and (tok != drafts[0] or status.done):
                _drop_drafts(session, drafts, rows, logits, speculator)
            sampling_time += time.perf_counter() - t
            if status.done:
                finish = status.finish_reason
                yield Chunk(status.text, tok, finish, lp)
                break
            yield Chunk(status.text, tok, None, lp)
        else:
            finish = checker.finish_reason or "length"
        if finish == "length" and (not checker.done or not generated):
            # The context filled up, or max_tokens was 0: no token carried the reason.
            yield Chunk(checker.flush(), None, "length")
    finally:
        if drafts:
            # Abandoned, interrupted or failed with drafts in the session: back to the
            # tokens chosen so far, as the plain loop would leave it.
            with contextlib.suppress(Exception):
                _drop_drafts(session, drafts, rows, logits, speculator)
        if speculator is not None:
            speculator.finish()  # "auto" leaves its measured cost to the next generation
        if decoder is not None:
            decoder.close()
        if on_done is not None:
            on_done(
                GenerationStats(len(prompt_ids), len(generated), prefill, decode, sampling_time,
                                n_decode,
                                spec=(speculator.stats(max(len(generated) - 1, 0))
                                      if speculator is not None else None)),
                generated,
                finish,
            )


def _drop_drafts(session: Session, drafts: list[int], rows: list[npt.NDArray[np.float32]],
                 logits: npt.NDArray[np.float32], speculator: Speculator | None) -> None:
    """Rolls the session back over the undecided drafts (the one that equals the last
    chosen token included: the plain loop has not forwarded that one yet), keeping the
    logits that chose it."""
    session._rollback_keeping(len(drafts), logits)
    drafts.clear()
    rows.clear()
    if speculator is not None:
        speculator.on_verify_done()


def collect(chunks: Iterable[Chunk], result: Mapping[str, Any],
            prompt_ids: list[int]) -> Generation:
    """Runs a stream to its end and builds the Generation (``result`` is filled by the
    stream's on_done: stats, generated ids, finish reason, logprobs)."""
    text = "".join(c.text for c in chunks)
    return Generation(text, result["generated"], result["finish"], result["stats"], prompt_ids,
                      result.get("logprobs"), result.get("prompt_logprobs"))
