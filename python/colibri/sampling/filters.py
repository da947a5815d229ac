"""Samplers as plain functions over NumPy logits, and the stateful :class:`Sampler`.

Every function takes a 1-D floating-point array of logits (one per token id, usually
``float32`` from ``Session.forward``), never changes it, and returns a new array of the
same dtype (``softmax`` and ``probabilities`` return ``float64``). Filters mark removed
tokens with ``-inf``. Logits must not contain NaN or ``+inf``; ``probabilities`` and
``sample`` check and raise :class:`colibri.errors.InvalidRequestError`.

:func:`sample` runs the whole chain, in llama.cpp's order::

    logit bias -> penalties -> top-k -> top-p -> min-p -> temperature -> draw

Filtering before the temperature means the temperature only reshapes the distribution
*within* the candidate set: which tokens are eligible depends on the model alone. Greedy
decoding (temperature 0) is the argmax of the biased, penalized logits, ties going to the
lowest id; the filters always keep that token, so they are skipped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from ..errors import InvalidRequestError, TokenOutOfRangeError
from .params import Sampling

__all__ = [
    "Sampler",
    "apply_logit_bias",
    "apply_penalties",
    "apply_temperature",
    "draw",
    "min_p_filter",
    "probabilities",
    "sample",
    "softmax",
    "top_k_filter",
    "top_p_filter",
]

_F = TypeVar("_F", bound=np.floating[Any])
History = Sequence[int] | npt.NDArray[np.integer[Any]]

_BOUNDARY_EPS = 1e-6
"""Relative slack at the top-p and min-p boundaries, so that a value that is on the
boundary in exact arithmetic counts as reaching it despite float rounding: top_p=0.8 over
probabilities (0.5, 0.3, 0.2) keeps two tokens, min_p=0.5 keeps a token with exactly half
the top probability."""


def _logits(logits: npt.NDArray[_F]) -> npt.NDArray[_F]:
    a = np.asarray(logits)
    if a.ndim != 1 or a.size == 0:
        raise InvalidRequestError(
            f"logits: expected a non-empty 1-D array (one value per token), got shape {a.shape}"
        )
    if not np.issubdtype(a.dtype, np.floating):
        raise InvalidRequestError(f"logits: expected a floating-point array, got {a.dtype}")
    return a


def _check_values(a: npt.NDArray[np.floating[Any]]) -> None:
    top = float(a.max())  # one pass: NaN propagates through max, +inf is the max
    if math.isnan(top):
        raise InvalidRequestError("logits contain NaN: the model output is invalid")
    if top == math.inf:
        raise InvalidRequestError("logits contain +inf: the model output is invalid")


def _history(history: History, vocab: int) -> npt.NDArray[np.int64]:
    h = np.asarray(history)
    if h.size == 0:
        return np.zeros(0, dtype=np.int64)
    if h.ndim != 1 or not np.issubdtype(h.dtype, np.integer):
        raise InvalidRequestError(
            f"history: expected a 1-D sequence of integer token ids, got {h.dtype} shape {h.shape}"
        )
    h = h.astype(np.int64, copy=False)
    lo, hi = int(h.min()), int(h.max())
    if lo < 0 or hi >= vocab:
        bad = lo if lo < 0 else hi
        raise TokenOutOfRangeError(
            f"history: token id {bad} is outside the vocabulary (0..{vocab - 1})"
        )
    return h


# --- the stages ---------------------------------------------------------------------------


def apply_logit_bias(logits: npt.NDArray[_F], logit_bias: Mapping[int, float]) -> npt.NDArray[_F]:
    """Adds ``logit_bias[id]`` to the logit of each listed token (``-inf`` bans it).

    A token id outside the vocabulary raises :class:`TokenOutOfRangeError`.
    """
    a = _logits(logits).copy()
    if not logit_bias:
        return a
    ids = np.fromiter(logit_bias.keys(), dtype=np.int64, count=len(logit_bias))
    bias = np.fromiter(logit_bias.values(), dtype=np.float64, count=len(logit_bias))
    if ids.min() < 0 or ids.max() >= a.size:
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise TokenOutOfRangeError(
            f"logit_bias: token id {bad} is outside the vocabulary (0..{a.size - 1})"
        )
    a[ids] = (a[ids].astype(np.float64) + bias).astype(a.dtype)
    return a


def apply_penalties(
    logits: npt.NDArray[_F],
    history: History,
    *,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    last_n: int = 64,
) -> npt.NDArray[_F]:
    """Penalizes the tokens that occur in the last `last_n` ids of `history`.

    `last_n` = -1 uses all of `history`, 0 none. For each distinct token in that window,
    seen ``c`` times, with logit ``x``:

    1. repetition penalty (llama.cpp / transformers): ``x / r`` if ``x > 0`` else ``x * r``;
    2. then ``x - c * frequency_penalty - presence_penalty`` (OpenAI).

    `history` is whatever the caller counts (llama.cpp counts the prompt too; OpenAI
    counts only the generated tokens); ids outside the vocabulary raise.
    """
    a = _logits(logits).copy()
    if repetition_penalty <= 0 or not math.isfinite(repetition_penalty):
        raise InvalidRequestError(
            f"repetition_penalty: {repetition_penalty!r} is not allowed; use a finite number > 0"
        )
    if last_n < -1:
        raise InvalidRequestError(f"last_n: {last_n} is not allowed; use -1 (all), 0 or more")
    h = _history(history, a.size)
    if last_n == 0 or h.size == 0 or (
        repetition_penalty == 1.0 and presence_penalty == 0.0 and frequency_penalty == 0.0
    ):
        return a
    window = h if last_n < 0 else h[-last_n:]
    ids, counts = np.unique(window, return_counts=True)
    x = a[ids].astype(np.float64)
    if repetition_penalty != 1.0:
        x = np.where(x > 0, x / repetition_penalty, x * repetition_penalty)
    x = x - counts * frequency_penalty - presence_penalty
    a[ids] = x.astype(a.dtype)
    return a


# Each filter is an index helper over a 1-D array of logits, returning the positions it
# keeps in ascending order. The public functions scatter those into a -inf array; the chain
# (probabilities) narrows (ids, values) instead, so the stages after top-k touch only the
# survivors. Ascending positions keep "ties to the lowest id" meaningful on narrowed arrays.


def _top_k_keep(a: npt.NDArray[np.floating[Any]], k: int) -> npt.NDArray[np.intp]:
    n = a.size
    threshold = np.partition(a, n - k)[n - k]  # the k-th largest value
    above = a > threshold
    ties = np.flatnonzero(a == threshold)[: k - int(np.count_nonzero(above))]
    return np.union1d(np.flatnonzero(above), ties)


def _top_p_keep(a: npt.NDArray[np.floating[Any]], p: float) -> npt.NDArray[np.intp]:
    finite = a > -np.inf
    n_finite = int(np.count_nonzero(finite))
    a64 = a.astype(np.float64)
    weights = np.exp(a64 - a64.max())  # -inf -> 0
    target = (p - _BOUNDARY_EPS) * float(weights.sum())
    # A full sort of a 150k vocabulary costs milliseconds and the nucleus is usually
    # small: first sort only the 1024 most likely tokens (every tie of the 1024th value
    # included, so the order is a full sort's prefix); sort them all only if those do not
    # hold enough probability.
    m = 1024
    if m < n_finite:
        threshold = np.partition(a, a.size - m)[a.size - m]  # the m-th largest
        candidates = np.flatnonzero(a >= threshold)
        order = candidates[np.argsort(-a[candidates], kind="stable")]  # ties: lowest first
        cum = np.cumsum(weights[order])
    if m >= n_finite or cum[-1] < target:
        candidates = np.flatnonzero(finite)
        order = candidates[np.argsort(-a[candidates], kind="stable")]
        cum = np.cumsum(weights[order])
    n_keep = min(int(np.searchsorted(cum, target, side="left")) + 1, order.size)
    return np.sort(order[:n_keep])


def _min_p_keep(a: npt.NDArray[np.floating[Any]], min_p: float) -> npt.NDArray[np.intp]:
    top = float(a.max())
    return np.flatnonzero((a.astype(np.float64) - top) >= math.log(min_p) - _BOUNDARY_EPS)


def _scatter(a: npt.NDArray[_F], keep: npt.NDArray[np.intp]) -> npt.NDArray[_F]:
    out = np.full_like(a, -np.inf)
    out[keep] = a[keep]
    return out


def top_k_filter(logits: npt.NDArray[_F], k: int) -> npt.NDArray[_F]:
    """Keeps the `k` largest logits (ties at the boundary go to the lowest ids); the others
    become ``-inf``. ``k <= 0`` or ``k >= len(logits)`` keeps everything."""
    a = _logits(logits)
    if k <= 0 or k >= a.size:
        return a.copy()
    return _scatter(a, _top_k_keep(a, k))


def top_p_filter(logits: npt.NDArray[_F], p: float) -> npt.NDArray[_F]:
    """Nucleus filter: keeps the smallest set of most likely tokens whose softmax
    probability reaches `p` (at least one token; ties in order of id); the others become
    ``-inf``. ``p >= 1`` keeps everything."""
    a = _logits(logits)
    if not p > 0:
        raise InvalidRequestError(f"top_p: {p!r} is not allowed; use a number in (0, 1]")
    if p >= 1.0 or float(a.max()) == -math.inf:
        return a.copy()
    return _scatter(a, _top_p_keep(a, p))


def min_p_filter(logits: npt.NDArray[_F], min_p: float) -> npt.NDArray[_F]:
    """Keeps the tokens whose probability is at least `min_p` times the most likely
    token's, i.e. ``logit >= max_logit + log(min_p)``; the others become ``-inf``.
    ``min_p <= 0`` keeps everything."""
    a = _logits(logits)
    if min_p > 1.0 or math.isnan(min_p):
        raise InvalidRequestError(f"min_p: {min_p!r} is not allowed; use a number in [0, 1]")
    if min_p <= 0.0 or float(a.max()) == -math.inf:
        return a.copy()
    return _scatter(a, _min_p_keep(a, min_p))


def apply_temperature(logits: npt.NDArray[_F], temperature: float) -> npt.NDArray[_F]:
    """``logits / temperature``. The temperature must be a finite number > 0 (temperature
    0 means greedy, which :func:`sample` handles without dividing)."""
    a = _logits(logits)
    if not (temperature > 0 and math.isfinite(temperature)):
        raise InvalidRequestError(
            f"temperature: {temperature!r} is not allowed here; use a finite number > 0 "
            "(temperature 0 is greedy: use sample() or numpy.argmax)"
        )
    return (a / a.dtype.type(temperature)).astype(a.dtype, copy=False)


def softmax(logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[np.float64]:
    """The probabilities ``exp(x - max) / sum`` in float64 (``-inf`` gives 0). Raises
    :class:`InvalidRequestError` when every logit is ``-inf``."""
    a = _logits(logits)
    top = float(a.max())
    if top == -math.inf:
        raise InvalidRequestError(
            "every logit is -inf: no token can be chosen (all banned by logit_bias or filters)"
        )
    e = np.exp(a.astype(np.float64) - top)
    out: npt.NDArray[np.float64] = e / e.sum()
    return out


def draw(probs: npt.NDArray[np.floating[Any]], u: float) -> int:
    """Inverse-CDF draw: the token whose interval of the cumulative distribution holds
    ``u * sum(probs)``, for a uniform ``u`` in [0, 1). Tokens with probability 0 are never
    returned, whatever `u` and the rounding."""
    p = np.asarray(probs, dtype=np.float64)
    if not 0.0 <= u < 1.0:
        raise InvalidRequestError(f"u: {u!r} is not in [0, 1)")
    if p.ndim != 1 or p.size == 0 or not np.all(p >= 0):  # also rejects NaN
        raise InvalidRequestError("probabilities: expected a 1-D array of values >= 0")
    cum = np.cumsum(p)
    if not cum[-1] > 0:
        raise InvalidRequestError("probabilities: every token has probability 0")
    # The first i with cum[i] > u * total. A zero-probability token j has cum[j] ==
    # cum[j - 1] (or 0 when j = 0, and u * total >= 0), so the search stops before it.
    i = int(np.searchsorted(cum, u * cum[-1], side="right"))
    if i == p.size:  # u * total rounded up to total: the last token with p > 0
        i = int(np.flatnonzero(p)[-1])
    return i


# --- the chain ----------------------------------------------------------------------------


def _prepared(
    logits: npt.NDArray[np.floating[Any]], sampling: Sampling, history: History
) -> npt.NDArray[np.floating[Any]]:
    """Logits after bias and penalties; checks the values and that one token is left."""
    a = _logits(logits)
    _check_values(a)
    # Stages that are off are skipped; `a` may still be the caller's array, which the
    # later stages only read.
    if sampling.logit_bias:
        a = apply_logit_bias(a, sampling.logit_bias)
    if sampling.penalties_active:
        a = apply_penalties(
            a,
            history,
            repetition_penalty=sampling.repetition_penalty,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            last_n=sampling.penalty_last_n,
        )
    if float(a.max()) == -math.inf:
        raise InvalidRequestError(
            "every logit is -inf: no token can be chosen (all banned by logit_bias?)"
        )
    return a


def probabilities(
    logits: npt.NDArray[np.floating[Any]],
    sampling: Sampling | None = None,
    history: History = (),
) -> npt.NDArray[np.float64]:
    """The distribution :func:`sample` draws from (float64, one entry per token): the
    whole chain without the draw. Greedy settings give a one-hot vector at the argmax.
    Useful for speculative decoding (rejection sampling needs the target distribution)."""
    s = Sampling() if sampling is None else sampling
    a = _prepared(logits, s, history)
    if s.greedy:
        p = np.zeros(a.size, dtype=np.float64)
        p[int(np.argmax(a))] = 1.0
        return p
    # Narrow (ids, values) to the survivors of each filter; ids stay ascending.
    ids: npt.NDArray[np.intp] | None = None
    vals: npt.NDArray[np.floating[Any]] = a
    if 0 < s.top_k < vals.size:
        ids = _top_k_keep(vals, s.top_k)
        vals = vals[ids]
    if s.top_p < 1.0:
        keep = _top_p_keep(vals, s.top_p)
        ids = keep if ids is None else ids[keep]
        vals = vals[keep]
    if s.min_p > 0.0:
        keep = _min_p_keep(vals, s.min_p)
        ids = keep if ids is None else ids[keep]
        vals = vals[keep]
    e = np.exp((vals.astype(np.float64) - float(vals.max())) / s.temperature)
    e /= e.sum()
    if ids is None:
        return e
    out = np.zeros(a.size, dtype=np.float64)
    out[ids] = e
    return out


def sample(
    logits: npt.NDArray[np.floating[Any]],
    sampling: Sampling | None = None,
    history: History = (),
    rng: np.random.Generator | None = None,
) -> int:
    """Chooses the next token id. `history` holds the ids the penalties count (the window
    is its last ``sampling.penalty_last_n``). Greedy settings use no randomness;
    otherwise one ``rng.random()`` is drawn. Without `rng`, a generator seeded with
    ``sampling.seed`` is made for this one call (so the same seed picks the same token
    every call: use :class:`Sampler` for a sequence)."""
    s = Sampling() if sampling is None else sampling
    if s.greedy:
        return int(np.argmax(_prepared(logits, s, history)))
    p = probabilities(logits, s, history)
    if rng is None:
        rng = np.random.default_rng(s.seed)
    return draw(p, float(rng.random()))


class Sampler:
    """:func:`sample` with its own random generator, for a sequence of tokens.

    ``Sampler(Sampling(temperature=0.8, seed=1))`` draws the same tokens every run for the
    same logits; :meth:`reset` starts the sequence over (a new entropy seed when
    ``seed`` is None).
    """

    def __init__(self, sampling: Sampling | None = None) -> None:
        if sampling is None:
            sampling = Sampling()
        if not isinstance(sampling, Sampling):
            raise InvalidRequestError(
                f"Sampler: expected a Sampling, got {type(sampling).__name__}"
            )
        self._sampling = sampling
        self._rng = np.random.default_rng(sampling.seed)

    @property
    def sampling(self) -> Sampling:
        return self._sampling

    @property
    def rng(self) -> np.random.Generator:
        """The generator the draws come from (numpy PCG64 seeded with ``sampling.seed``)."""
        return self._rng

    def __call__(self, logits: npt.NDArray[np.floating[Any]], history: History = ()) -> int:
        """The next token id for these logits (see :func:`sample`)."""
        return sample(logits, self._sampling, history, self._rng)

    def probabilities(
        self, logits: npt.NDArray[np.floating[Any]], history: History = ()
    ) -> npt.NDArray[np.float64]:
        """The distribution the next call would draw from (see :func:`probabilities`)."""
        return probabilities(logits, self._sampling, history)

    def reset(self) -> None:
        """Re-seeds the generator from ``sampling.seed``: the draws start over."""
        self._rng = np.random.default_rng(self._sampling.seed)

    def __repr__(self) -> str:
        return f"Sampler({self._sampling!r})"
