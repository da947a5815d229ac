"""The optional stages of the decode loop, applied around the sampler of
:func:`colibri.generate.generation.stream_tokens`: user logits processors, the ``min_tokens`` ban,
the structured-output mask, log-probabilities and prompt scoring, ``stop_token_ids`` and
the end of a constrained text. A plain request (none of them) skips this module.

Order at each step: processors (in the order given) -> ``min_tokens`` ban on EOS and
``stop_token_ids`` -> structured-output mask -> the reasoning budget (forced closing
tokens, colibri.generate.reasoning_budget) -> the Sampler (logit bias, penalties,
filters, temperature, draw). Raw log-probabilities are taken from the model's logits
before any of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..errors import InvalidRequestError
from ..sampling import Sampler, probabilities
from .logprobs import Logprob, LogprobMaker, log_softmax, prompt_logprobs
from .request import Request

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer
    from .reasoning_budget import ReasoningBudget
    from .session import Session
    from .structured import Constraint

__all__ = ["Decoder"]


class Decoder:
    """One generation's optional stages (see the module docstring)."""

    def __init__(self, request: Request, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.request = request
        self.vocab_size = vocab_size
        s = request.sampling
        self._maker = (LogprobMaker(tokenizer) if s.logprobs or s.prompt_logprobs is not None
                       else None)  # fmt: skip
        self._banned = np.array(sorted((set(tokenizer.eos_ids) | request.stop_token_ids)
                                       & set(range(vocab_size))), dtype=np.int64)
        for t in request.stop_token_ids:
            if t >= vocab_size:
                raise InvalidRequestError(
                    f"stop_token_ids: {t} is outside the vocabulary [0, {vocab_size})")
        self.constraint: Constraint | None = None
        if request.response_format is not None:
            from .structured import Constraint

            self.constraint = Constraint(request.response_format, tokenizer, vocab_size)
        self.budget: ReasoningBudget | None = None
        if request.reasoning_budget is not None:
            from .reasoning_budget import ReasoningBudget

            self.budget = ReasoningBudget(request.reasoning_budget, tokenizer)
        self.prompt_logprobs: list[Logprob | None] | None = None
        self.logprobs: list[Logprob] | None = [] if s.logprobs else None

    def prefill(self, session: Session, ids: Sequence[int],
                progress: Callable[[int, int], object] | None = None,
                ) -> npt.NDArray[np.float32]:
        """Forwards the prompt; with ``prompt_logprobs`` scores it on the way."""
        k = self.request.sampling.prompt_logprobs
        if k is None or self._maker is None:
            return session.forward(list(ids), progress=progress)
        logits, scored = prompt_logprobs(session, ids, k, self._maker, self.vocab_size)
        self.prompt_logprobs = scored
        return logits

    def choose(self, sampler: Sampler, logits: npt.NDArray[np.float32], history: list[int],
               n_generated: int) -> tuple[int, Logprob | None]:
        """The next token (and its log-probability record when asked for)."""
        r = self.request
        x: npt.NDArray[np.floating[Any]] = logits
        if r.logits_processors:
            ids = np.asarray(history, dtype=np.int32)
            x = logits.copy()
            for proc in r.logits_processors:
                x = np.asarray(proc(ids, x))
                if x.shape != logits.shape or not np.issubdtype(x.dtype, np.floating):
                    raise InvalidRequestError(
                        f"logits processor {getattr(proc, '__name__', proc)!r} returned "
                        f"{x.dtype} {x.shape}; it must return float logits of shape "
                        f"{logits.shape}")
        if n_generated < r.min_tokens and self._banned.size:
            x = x.copy() if x is logits else x
            x[self._banned] = -np.inf
        if self.constraint is not None:
            x = self.constraint.apply(x)
        if self.budget is not None:
            if n_generated == 0:
                self.budget.start(history)
            x = self.budget.apply(x)
        tok = sampler(x, history)
        lp = None
        if self.logprobs is not None and self._maker is not None:
            s = r.sampling
            if s.logprobs_mode == "raw":
                values = log_softmax(logits)
            else:
                with np.errstate(divide="ignore"):
                    values = np.log(probabilities(x, s, history))
            lp = self._maker.make(values, tok, s.top_logprobs)
            self.logprobs.append(lp)
        return tok, lp

    def ends_with(self, token_id: int) -> bool:
        """Records the chosen token; True when it ends the text: a ``stop_token_ids``
        entry, or the last token of a complete constrained text."""
        if self.budget is not None:
            self.budget.advance(token_id)
        if token_id in self.request.stop_token_ids:
            return True
        if self.constraint is None:
            return False
        self.constraint.advance(token_id)
        return self.constraint.done

    def close(self) -> None:
        if self.constraint is not None:
            self.constraint.close()
