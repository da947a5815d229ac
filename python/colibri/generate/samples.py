"""Several independent samples of one prompt (``Model.generate_n``), sharing the prompt's
KV cache: the prompt is prefilled once, and each sample rolls the session back to it.

The prompt but its last token is prefilled once (with every position's logits when the
prompt is scored); each sample then forwards that last token and decodes, and the session
is rolled back to the shared prefix before the next one. Sample ``i`` draws from its own
random stream, ``numpy.random.SeedSequence(seed).spawn(n)[i]``: a seeded call gives the
same ``n`` texts every time, and sample ``i`` does not depend on how many were asked for.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidRequestError
from .generation import collect

if TYPE_CHECKING:
    from .generation import Generation
    from .logprobs import Logprob
    from .request import Request
    from .runner import Runner

__all__ = ["check_sample_count", "generate_n", "sample_seeds"]

MAX_SAMPLES = 1024


def sample_seeds(seed: int | None, n: int) -> list[int | None]:
    """Seeds of ``n`` independent samples: children of ``seed`` (None stays None: fresh
    entropy for each)."""
    if seed is None:
        return [None] * n
    children = np.random.SeedSequence(seed).spawn(n)
    return [int.from_bytes(c.generate_state(4, dtype=np.uint32).tobytes(), "little")
            for c in children]


def check_sample_count(n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
        raise InvalidRequestError(f"n must be an integer in 1..{MAX_SAMPLES}, got {n!r}")


def generate_n(runner: Runner, ids: list[int], request: Request, n: int) -> list[Generation]:
    """``Model.generate_n`` of prompt `ids` (already fitted to the context): `n` samples
    sharing the prompt's prefill (see the module docstring)."""
    check_sample_count(n)
    session = runner.session()
    prefix, last = ids[:-1], ids[-1:]
    scores: list[Logprob | None] | None = (
        [None] if request.sampling.prompt_logprobs is not None else None)
    if prefix:
        if request.sampling.prompt_logprobs is not None:
            from .decoding import Decoder

            scorer = Decoder(replace(request, response_format=None), runner.tokenizer,
                             runner.handle.config.vocab_size)
            scorer.prefill(session, prefix + last)  # scores every prompt token
            scores = scorer.prompt_logprobs
            session.rollback(1)
        else:
            session.forward(prefix)
    out: list[Generation] = []
    one = replace(request.sampling, prompt_logprobs=None)
    for seed in sample_seeds(request.sampling.seed, n):
        sub = replace(request, sampling=replace(one, seed=seed))
        result: dict[str, Any] = {}
        chunks: Any = runner.stream(session, last, sub, result, history=prefix)
        g = collect(chunks, result, ids)
        out.append(replace(g, prompt_logprobs=scores) if scores is not None else g)
        if session.holds_prefix(len(prefix)):
            session.rollback(session.n_tokens - len(prefix))
        else:  # a sliding window's ring has moved past the prompt: prefill it again
            session.reset()
            if prefix:
                session.forward(prefix)
    return out
