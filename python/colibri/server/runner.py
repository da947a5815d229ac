"""Running a Plan in a ticket: a whole sample collected (non-streamed answers), the
OpenAI log-probability shapes, and the small records every route fills in."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ColibriError
from ..generate.logprobs import Logprob
from ..tokenizers import Tokenizer
from .errors import ApiError, from_colibri
from .options import Plan
from .scheduler import Ticket

# JSON has no -inf; OpenAI reports -9999.0 for tokens that could not be drawn.
_FLOOR = -9999.0


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


@dataclass
class Sample:
    """One generation, collected."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    logprobs: list[Logprob] = field(default_factory=list)


async def run_sample(ticket: Ticket, plan: Plan, i: int) -> Sample:
    s = Sample()
    pieces = []
    async for chunk in ticket.stream(plan.prompt_ids, plan.sample_options(i)):
        pieces.append(chunk.text)
        if chunk.token_id is not None:
            s.token_ids.append(chunk.token_id)
        if chunk.logprobs is not None:
            s.logprobs.append(chunk.logprobs)
        if chunk.finish_reason is not None:
            s.finish_reason = chunk.finish_reason
    s.text = "".join(pieces)
    return s


async def answer(work: Awaitable[dict[str, Any]], anthropic: bool = False,
                 ) -> tuple[int, Any, dict[str, str]]:
    """(status, body, headers) of a non-streamed answer: the body `work` builds, or the
    error it raised in the API's shape."""
    try:
        return 200, await work, {}
    except (ApiError, ColibriError) as exc:
        err = from_colibri(exc)
        return err.status, err.anthropic_body() if anthropic else err.openai_body(), err.headers


def error_frame(exc: BaseException) -> dict[str, Any]:
    return from_colibri(exc).openai_body()


def _lp(value: float) -> float:
    return value if math.isfinite(value) else _FLOOR


def chat_logprob(lp: Logprob, tok: Tokenizer) -> dict[str, Any]:
    """OpenAI chat's ``{"token", "logprob", "bytes", "top_logprobs": [...]}``."""
    def one(x: Logprob) -> dict[str, Any]:
        return {"token": x.text, "logprob": _lp(x.logprob),
                "bytes": list(tok.token_bytes(x.token_id)) if x.token_id < tok.vocab_size
                else []}
    d = one(lp)
    d["top_logprobs"] = [one(t) for t in lp.top]
    return d


def legacy_logprobs(lps: list[Logprob], offset0: int = 0) -> dict[str, Any]:
    """The legacy completions shape: parallel lists of tokens, their logprobs, the top
    alternatives as ``{text: logprob}`` and each token's character offset in the text."""
    offsets, at = [], offset0
    for lp in lps:
        offsets.append(at)
        at += len(lp.text)
    return {"tokens": [lp.text for lp in lps],
            "token_logprobs": [_lp(lp.logprob) for lp in lps],
            "top_logprobs": [{t.text: _lp(t.logprob) for t in lp.top} for lp in lps],
            "text_offset": offsets}


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}

