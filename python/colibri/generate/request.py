"""The options of a generation call, named once for every method that takes them.

``Model.generate``/``stream``/``chat``/``agenerate``/``astream``/``generate_n`` and
``Session.generate``/``stream`` take the same keyword options (:class:`GenerateOptions`).
They are gathered into one validated, frozen :class:`Request`; an unknown name raises
:class:`~colibri.errors.InvalidRequestError` naming it and the closest valid one.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
import numpy.typing as npt

from ..errors import InvalidRequestError
from ..sampling import Sampling

if TYPE_CHECKING:
    from ..speculative import SpecConfig
    from .structured import ResponseFormat

__all__ = [
    "MAX_STOP_LENGTH",
    "MAX_STOP_STRINGS",
    "CallOptions",
    "GenerateOptions",
    "LogitsProcessor",
    "Request",
    "closest_name",
    "parse_request",
]

MAX_STOP_STRINGS = 64
"""Most stop strings one call may give (OpenAI's API allows 4)."""
MAX_STOP_LENGTH = 1000
"""Most characters in one stop string."""

LogitsProcessor = Callable[[npt.NDArray[np.int32], npt.NDArray[np.float32]],
                           npt.NDArray[np.floating[Any]]]
"""``(token_ids, logits) -> logits``: ``token_ids`` are every token of the sequence so far
(prompt and generated, int32), ``logits`` the model's float32 ``[vocab]`` for the next
token after the processors before it; it returns the logits to use (a new array, or the
same one changed in place). Processors run in order, before logit_bias, penalties and the
filters of :class:`~colibri.sampling.Sampling`."""


class GenerateOptions(TypedDict, total=False):
    """Options beyond ``max_tokens``/``sampling``/``stop``/``truncate`` (see :class:`Request`)."""

    stop_token_ids: Sequence[int]
    min_tokens: int
    logits_processors: Sequence[LogitsProcessor]
    response_format: ResponseFormat | Mapping[str, Any] | None
    spec: SpecConfig | Mapping[str, Any] | str | None
    reasoning_budget: int | None
    max_time: float | None


class CallOptions(GenerateOptions, total=False):
    """Every keyword option of a generation call (what ``chat``/``agenerate``/... forward)."""

    max_tokens: int
    sampling: Sampling | Mapping[str, Any] | None
    stop: str | Sequence[str]
    truncate: bool


# CallOptions' annotations include the inherited GenerateOptions ones: each name once,
# the common ones first.
_CALL_NAMES = tuple(dict.fromkeys(["max_tokens", "sampling", "stop", "truncate",
                                   *CallOptions.__annotations__]))
# The calls that take ``progress=`` beside their options (it is named in their error too).
_WITH_PROGRESS = ("generate", "stream", "Session.stream")


def closest_name(name: str, allowed: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest allowed name, or ``""`` when none is close."""
    near = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


@dataclass(frozen=True)
class Request:
    """A generation's options, validated.

    ``max_tokens``: the most tokens to generate (EOS included), >= 0. ``sampling``: how each
    token is chosen (logprobs too: ``Sampling(logprobs=True, top_logprobs=k)``). ``stop``:
    strings that end the text (not emitted). ``stop_token_ids``: token ids that end it
    (in ``token_ids``; their text is kept unless they are special tokens, as in vLLM).
    ``min_tokens``: EOS and ``stop_token_ids`` are
    banned until this many tokens are generated. ``logits_processors``: user callables (see
    :data:`LogitsProcessor`). ``response_format``: constrained decoding (see
    :mod:`colibri.generate.structured`). ``truncate``: cut a prompt that does not fit the
    context (Model.fit_prompt says how).
    ``spec``: speculative decoding for this call (a :class:`~colibri.SpecConfig`, a mapping
    of its fields or a drafter name; None: the model's ``EngineConfig.spec``).
    ``reasoning_budget``: the most tokens the output may spend inside a ``<think>`` block
    before colibri closes it for the model (colibri.generate.reasoning_budget); None: no
    cap. ``max_time``: seconds after which no further token is computed (finish
    ``"length"``, as at ``max_tokens``; transformers' name); checked between tokens, so the
    prefill and the token under way finish first. None: no limit.
    """

    max_tokens: int = 256
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    min_tokens: int = 0
    logits_processors: tuple[LogitsProcessor, ...] = ()
    response_format: ResponseFormat | None = None
    truncate: bool = False
    spec: SpecConfig | None = None
    reasoning_budget: int | None = None
    max_time: float | None = None

    @property
    def plain(self) -> bool:
        """True when the decode loop needs none of the optional stages."""
        s = self.sampling
        return (not self.stop_token_ids and not self.min_tokens and not self.logits_processors
                and self.response_format is None and not s.logprobs
                and self.reasoning_budget is None
                and s.prompt_logprobs is None)  # fmt: skip


def _sampling(value: object) -> Sampling:
    if value is None:
        return Sampling()
    if isinstance(value, Sampling):
        return value
    if isinstance(value, Mapping):
        return Sampling.from_dict(value)
    raise InvalidRequestError(
        f"sampling must be a colibri.Sampling or a mapping of its fields, "
        f"not {type(value).__name__}"
    )


def _int(name: str, value: object, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise InvalidRequestError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def parse_request(options: Mapping[str, Any], *, where: str = "generate") -> Request:
    """The Request for keyword `options` (names of :class:`CallOptions`)."""
    for name in options:
        if name not in _CALL_NAMES:
            names = _CALL_NAMES + (("progress",) if where in _WITH_PROGRESS else ())
            raise InvalidRequestError(
                f"{where}() got an unknown option {name!r}{closest_name(name, names)}; "
                f"the options are: {', '.join(names)}"
            )
    stop = options.get("stop", ())
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(x, str) and x for x in stops):
        raise InvalidRequestError("stop must be a non-empty string or a list of them")
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequestError(
            f"stop holds {len(stops)} strings; at most {MAX_STOP_STRINGS} are allowed")
    longest = max(stops, key=len, default="")
    if len(longest) > MAX_STOP_LENGTH:
        raise InvalidRequestError(
            f"a stop string has {len(longest)} characters; at most {MAX_STOP_LENGTH} are "
            "allowed")
    ids = options.get("stop_token_ids", ()) or ()
    if isinstance(ids, (int, np.integer)):
        ids = (ids,)
    stop_ids = frozenset(_int("stop_token_ids entries", t, 0) for t in ids)
    procs = tuple(options.get("logits_processors", ()) or ())
    for p in procs:
        if not callable(p):
            raise InvalidRequestError(
                f"logits_processors must be callables (token_ids, logits) -> logits, "
                f"got {type(p).__name__}"
            )
    fmt = options.get("response_format")
    if fmt is not None:
        from .structured import response_format

        fmt = response_format(fmt)
    truncate = options.get("truncate", False)
    from ..settings.spec import as_spec

    if not isinstance(truncate, bool):
        raise InvalidRequestError(f"truncate must be True or False, got {truncate!r}")
    budget = options.get("reasoning_budget")
    max_time = options.get("max_time")
    if max_time is not None and (isinstance(max_time, bool)
                                 or not isinstance(max_time, (int, float, np.integer, np.floating))
                                 or not 0 < max_time < float("inf")):
        raise InvalidRequestError(f"max_time must be a number of seconds > 0, got {max_time!r}")
    return Request(
        max_time=None if max_time is None else float(max_time),
        reasoning_budget=None if budget is None else _int("reasoning_budget", budget, 0),
        max_tokens=_int("max_tokens", options.get("max_tokens", 256), 0),
        sampling=_sampling(options.get("sampling")),
        stop=stops, stop_token_ids=stop_ids,
        min_tokens=_int("min_tokens", options.get("min_tokens", 0), 0),
        logits_processors=procs, response_format=fmt, truncate=truncate,
        spec=as_spec(options.get("spec"), "spec"),
    )  # fmt: skip
