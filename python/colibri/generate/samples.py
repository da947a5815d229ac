"""Several independent samples of one prompt (``Model.generate_n``), sharing the prompt's
KV cache: the prompt is prefilled once, and each sample rolls the session back to it.

The prompt but its last token is prefilled once (with every position's logits when the
prompt is scored); each sample then forwards that last token and decodes, and the session
is rolled back to the shared prefix before the next one. Sample ``i`` draws from its own
random stream, ``numpy.random.SeedSequence(seed).spawn(n)[i]``: a seeded call gives the
same ``n`` texts every time, and sample ``i`` does not depend on how many were asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidRequestError
from .generation import collect

if TYPE_CHECKING:
    from typing import Unpack

    from ..tokenizers import Tokenizer
    from .generation import Generation
    from .logprobs import Logprob
    from .request import CallOptions, Request
    from .session import Session

__all__ = ["SampleMethods", "sample_seeds"]

MAX_SAMPLES = 1024


def sample_seeds(seed: int | None, n: int) -> list[int | None]:
    """Seeds of ``n`` independent samples: children of ``seed`` (None stays None: fresh
    entropy for each)."""
    if seed is None:
        return [None] * n
    children = np.random.SeedSequence(seed).spawn(n)
    return [int.from_bytes(c.generate_state(4, dtype=np.uint32).tobytes(), "little")
            for c in children]


class SampleMethods:
    """``generate_n`` of a Model."""

    if TYPE_CHECKING:
        @property
        def tokenizer(self) -> Tokenizer: ...
        @property
        def config(self) -> Any: ...
        def session(self) -> Session: ...
        def encode_prompt(self, prompt: str | Sequence[int] | None = None, *,
                          messages: Sequence[Mapping[str, Any]] | None = None) -> list[int]: ...
        def _fit(self, ids: list[int], request: Request) -> list[int]: ...
        def _stream(self, session: Session, ids: Sequence[int], request: Request,
                    result: dict[str, Any], history: Sequence[int] = ()) -> Any: ...
        @staticmethod
        def _request(max_tokens: int, sampling: Any, stop: Any, truncate: bool,
                     options: Mapping[str, Any], where: str) -> Request: ...

    def generate_n(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        n: int,
        messages: Sequence[Mapping[str, Any]] | None = None,
        **options: Unpack[CallOptions],
    ) -> list[Generation]:
        """``n`` independent samples of the same prompt (raw or templated as in
        :meth:`generate`, same options), sharing the prompt's prefill. With
        ``Sampling(seed=s)`` the result is reproducible; greedy settings give ``n`` equal
        texts. With ``prompt_logprobs`` every sample carries the same prompt scores.
        Sample ``i`` is the generation ``generate`` makes with ``Sampling(seed=
        sample_seeds(seed, n)[i])``, token for token. Each Generation's stats are its own
        decode: ``prompt_tokens`` is 1 (the last prompt token it forwarded); the shared
        prefill is in no sample's record."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
            raise InvalidRequestError(f"n must be an integer in 1..{MAX_SAMPLES}, got {n!r}")
        request = self._request(
            options.pop("max_tokens", 256), options.pop("sampling", None),
            options.pop("stop", ()), options.pop("truncate", False), options, "generate_n",
        )  # fmt: skip
        ids = self._fit(self.encode_prompt(prompt, messages=messages), request)
        session = self.session()
        prefix, last = ids[:-1], ids[-1:]
        scores: list[Logprob | None] | None = (
            [None] if request.sampling.prompt_logprobs is not None else None)
        if prefix:
            if request.sampling.prompt_logprobs is not None:
                from .decoding import Decoder

                scorer = Decoder(replace(request, response_format=None), self.tokenizer,
                                 self.config.vocab_size)
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
            chunks: Any = self._stream(session, last, sub, result, history=prefix)
            g = collect(chunks, result, ids)
            out.append(replace(g, prompt_logprobs=scores) if scores is not None else g)
            session.rollback(session.n_tokens - len(prefix))
        return out
