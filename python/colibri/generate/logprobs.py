"""Log-probabilities of generated and prompt tokens (``Sampling(logprobs=True,
top_logprobs=k, prompt_logprobs=k)``).

By default (``logprobs_mode="raw"``) a token's log-probability is the log-softmax of the
model's logits at that step, computed in float64: what OpenAI and vLLM report, the same at
temperature 0, unaffected by the sampling settings. ``"processed"`` reports the
distribution the token was drawn from instead (after logits processors, structured-output
masks, logit bias, penalties, filters and temperature; ``-inf`` for tokens the filters
removed). Alternatives are the ``k`` most likely tokens, most likely first, ties to the
lower id; in ``"processed"`` mode only tokens that could have been drawn are listed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..display import Displayable, sig3

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer
    from .session import Session

__all__ = ["Logprob", "LogprobMaker", "log_softmax", "prompt_logprobs"]

# Positions per all-logits forward when scoring a prompt: bounds the [n, vocab] float32
# block to about 64 MiB whatever the vocabulary.
_SCORE_BYTES = 64 << 20


@dataclass(frozen=True, repr=False)
class Logprob(Displayable):
    """One token and its log-probability; ``top``: the most likely alternatives at that
    step (each a Logprob with no ``top`` of its own)."""

    token_id: int
    text: str  # the token's bytes decoded as UTF-8 (a partial character shows as U+FFFD)
    logprob: float
    top: tuple[Logprob, ...] = ()

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's shape: ``{"token", "token_id", "logprob", "top_logprobs": [...]}``."""
        d: dict[str, Any] = {"token": self.text, "token_id": self.token_id,
                             "logprob": self.logprob}
        if self.top:
            d["top_logprobs"] = [t.to_dict() for t in self.top]
        return d

    def _display_rows(self) -> list[tuple[str, str]]:
        rows = [("token", f"{self.token_id} {self.text!r}"), ("logprob", sig3(self.logprob))]
        if self.top:
            rows.append(("top", ", ".join(f"{t.text!r} {sig3(t.logprob)}" for t in self.top)))
        return rows


def log_softmax(logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.float64]:
    """``x - logsumexp(x)`` in float64 along the last axis (``-inf`` stays ``-inf``)."""
    x = np.asarray(logits, dtype=np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    out: npt.NDArray[np.float64] = x - top - np.log(np.sum(np.exp(x - top), axis=-1,
                                                             keepdims=True))
    return out


def _top_ids(lp: npt.NDArray[np.float64], k: int) -> npt.NDArray[np.intp]:
    """The `k` largest entries' ids, largest first, ties to the lower id, finite only."""
    k = min(k, lp.size)
    if k <= 0:
        return np.zeros(0, dtype=np.intp)
    cand = np.argpartition(-lp, k - 1)[:k] if k < lp.size else np.arange(lp.size)
    # Every entry equal to the k-th value competes for the last places (ties by id).
    kth = lp[cand].min()
    cand = np.union1d(cand, np.flatnonzero(lp == kth))
    order = cand[np.lexsort((cand, -lp[cand]))][:k]
    return order[np.isfinite(lp[order])]


class LogprobMaker:
    """Builds :class:`Logprob` records for one tokenizer (token texts cached)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._texts: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        t = self._texts.get(token_id)
        if t is None:
            if token_id < self._tok.vocab_size:
                t = self._tok.token_bytes(token_id).decode("utf-8", errors="replace")
            else:
                t = ""  # padding rows of the output matrix beyond the vocabulary
            self._texts[token_id] = t
        return t

    def make(self, lp: npt.NDArray[np.float64], chosen: int, k: int) -> Logprob:
        """The record of `chosen` given log-probabilities `lp` [vocab] and k alternatives."""
        top = tuple(Logprob(int(i), self.text(int(i)), float(lp[i])) for i in _top_ids(lp, k))
        return Logprob(int(chosen), self.text(int(chosen)), float(lp[chosen]), top)


def prompt_logprobs(
    session: Session, ids: Sequence[int], k: int, maker: LogprobMaker, vocab: int
) -> tuple[npt.NDArray[np.float32], list[Logprob | None]]:
    """Forwards `ids` into `session` with every position's logits (in blocks of bounded
    size) and scores them: entry i is the log-probability of ``ids[i]`` given what came
    before; the first is None unless the session already held tokens (then its last logits
    score it). Returns the logits after the last token, as a plain forward does."""
    out: list[Logprob | None] = []
    prev: npt.NDArray[np.float32] | None = session.last_logits() if session.n_tokens else None
    step = max(1, _SCORE_BYTES // (4 * vocab))
    for start in range(0, len(ids), step):
        block = list(ids[start:start + step])
        logits = session.forward(block, all_logits=True)
        for j, t in enumerate(block):
            out.append(None if prev is None else maker.make(log_softmax(prev), t, k))
            prev = logits[j]
    assert prev is not None
    return prev, out
