"""Model: the Python face of a loaded model (sessions are in session.py).

``Model.load`` turns a path into a manifest (sources/), builds the core's spec from it and
loads the weights through their extents. A ``Session`` owns one KV cache; many sessions can
share a model.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from . import _core
from .chat.messages import TemplateMethods
from .chat.template import ChatTemplate
from .display import Displayable, model_rows, model_stats_rows
from .engine.budget import BudgetPlan
from .engine.core_spec import (
    ACT_PRECISION,
    model_spec,
    resolved_context_length,
    tensor_specs,
    thread_settings,
)
from .engine.stats import ExpertStats, MemoryStats, PhaseTimes
from .engine.streaming import (
    RoutingHistory,
    check_resident_fits,
    expert_blobs,
    expert_stats,
    io_name,
    memory_stats,
    phase_times,
    pin_order,
    plan_store,
    prefetch_state_name,
    session_kv_type,
    store_settings,
    wait_policy_name,
)
from .errors import ContextOverflowError, InvalidRequestError
from .generate.aio import AsyncMethods
from .generate.decoding import Decoder
from .generate.generation import (
    Chunk,
    FinishReason,
    Generation,
    GenerationStats,
    collect,
    rate,
    stream_tokens,
)
from .generate.prompt_cache import PromptCache
from .generate.request import GenerateOptions, Request, parse_request
from .generate.samples import SampleMethods
from .generate.session import Progress, Session
from .models.resolve import resolve_model_spec
from .sampling import Sampling
from .settings.config import ActivationPrecision, CachePolicy, EngineConfig, ThreadConfig
from .sources import Manifest, ModelConfig, open_model_source
from .speculative import SpecStats
from .speculative.auto import CostMemory
from .speculative.choose import speculator_for
from .tokenizers import Tokenizer

if TYPE_CHECKING:
    from typing import Unpack

    from .generate.batching import StepBatcher
    from .generate.prefix_share import Running

Messages = Sequence[Mapping[str, Any]]


@dataclass(frozen=True, repr=False)
class ModelStats(Displayable):
    """Cumulative counters of a model since load, and the last generation's record.

    ``generations``, ``prompt_tokens``, ``generated_tokens`` and the seconds count every
    generation since load; ``experts`` and ``phases`` the streaming tier since load or
    :meth:`Model.reset_stats`; ``memory`` is the RAM split now; ``last`` is the most recent
    generation to finish, from any thread (a generation's own record is
    ``Generation.stats``)."""

    generations: int
    prompt_tokens: int
    generated_tokens: int
    prefill_seconds: float
    decode_seconds: float
    decode_tokens: int
    last: GenerationStats | None
    # The streaming tier, cumulative since load (reset_stats() zeroes them).
    memory: MemoryStats | None = None
    experts: ExpertStats = field(default_factory=ExpertStats)
    phases: PhaseTimes = field(default_factory=PhaseTimes)
    wait_policy: str = ""  # in effect now: "spin", "passive", "hybrid" or "auto (passive)"...
    prefetch: str = ""  # the lookahead now: "off", "on (accuracy 74%)", "paused (...)"
    io: str = ""  # expert-read workers, and the measured depth curve under workers="auto"
    # Speculative decoding summed over every generation that drafted (None: none did).
    spec: SpecStats | None = None

    @property
    def prefill_tok_s(self) -> float:
        return rate(self.prompt_tokens, self.prefill_seconds)

    @property
    def decode_tok_s(self) -> float:
        return rate(self.decode_tokens, self.decode_seconds)

    def _display_rows(self) -> list[tuple[str, str]]:
        return model_stats_rows(self)


class Model(TemplateMethods, SampleMethods, AsyncMethods, Displayable):
    """A loaded model. Use :meth:`load`; close it (or use ``with``) to free its memory."""

    def __init__(self, manifest: Manifest, engine: EngineConfig, core: _core.Engine,
                 plan: BudgetPlan | None = None, history: RoutingHistory | None = None,
                 history_base: npt.NDArray[np.uint64] | None = None) -> None:
        self._manifest = manifest
        self._engine_config = engine
        self._core: _core.Engine | None = core
        self._context_length = resolved_context_length(manifest.config, engine)
        self._tokenizer: Tokenizer | None = None
        self._lock = threading.Lock()
        self._totals = [0, 0, 0, 0.0, 0.0, 0]  # generations, prompt, generated, s, s, decodes
        self._last: GenerationStats | None = None
        self._spec_total: SpecStats | None = None
        # What "auto" drafting measured of the verify cost, for the next generations.
        self._spec_memory = CostMemory()
        self._plan = plan
        self._history = history
        self._history_base = history_base
        self._name = manifest.path.name
        self._prompt_cache = PromptCache(self, engine.prompt_cache)
        self._sessions: weakref.WeakSet[Session] = weakref.WeakSet()  # closed with the model
        # Set while a StepBatcher runs this model's forwards as batched steps (the server).
        self._batcher: StepBatcher | None = None
        self._kv_type = session_kv_type(manifest, engine)

    @property
    def prompt_cache(self) -> PromptCache:
        """The prompt cache (colibri.generate.prompt_cache): off unless
        ``EngineConfig.prompt_cache`` gives it bytes; ``model.prompt_cache.stats()`` says what
        it holds and saved."""
        return self._prompt_cache

    def load_session(self, path: str | os.PathLike[str]) -> Session:
        """A session restored from a file written by ``Session.save`` (see Session.load)."""
        return Session.load(path, self)

    @property
    def name(self) -> str:
        """The named model or Hugging Face repository id it was loaded as, else the file
        or directory name."""
        return self._name

    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str],
        engine: EngineConfig | None = None,
        *,
        filename: str | None = None,
        revision: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        hf_cache_dir: str | os.PathLike[str] | None = None,
        download: bool = False,
        progress: bool = True,
    ) -> Model:
        """Loads a model: a GGUF file, a Hugging Face checkpoint directory, a native
        container, a named model (``"smollm2"``, ``"smollm2-moe-demo"``: the names
        ``colibri run --model`` takes, fetched into ``cache_dir`` on first use) or a
        Hugging Face repository id (``"org/name"``) already in the local Hugging Face cache
        (``filename="*Q4_K_M.gguf"`` picks one GGUF of it; ``download=True`` lets
        huggingface_hub fetch what is missing). See :mod:`colibri.models.resolve`.

        Resident (dense) weights are read now; routed experts are read on demand into the
        expert cache, sized by ``engine.ram_budget`` (see :mod:`colibri.engine.budget`). Fetch
        progress goes to stderr unless ``progress=False``."""
        resolved = resolve_model_spec(
            model, filename=filename, revision=revision, cache_dir=cache_dir,
            hf_cache_dir=hf_cache_dir, download=download, log=sys.stderr if progress else None,
        )  # fmt: skip
        loaded = cls._load_path(resolved.path, engine)
        loaded._name = resolved.name or resolved.path.name
        return loaded

    @classmethod
    def _load_path(cls, path: Path, engine: EngineConfig | None) -> Model:
        engine = engine if engine is not None else EngineConfig()
        manifest = open_model_source(path)
        context_length = resolved_context_length(manifest.config, engine)
        check_resident_fits(manifest, engine, context_length)  # before reading any weight
        spec = model_spec(manifest, context_length)
        core = _core.Engine(
            spec,
            tensor_specs(manifest, engine.io.checksums != "off"),
            [str(f) for f in manifest.files],
            thread_settings(engine.threads),
            expert_blobs(manifest),
        )
        core.activation_precision = ACT_PRECISION[engine.activation_precision]
        plan = plan_store(manifest, engine, core, context_length)
        core.configure_store(store_settings(engine, plan.cache_bytes))
        history = RoutingHistory.for_model(manifest, engine)
        base = history.load() if history is not None else None
        if base is not None and engine.cache.policy is CachePolicy.PINNED:
            core.set_expert_pins(pin_order(base))
        if engine.cache.preload and plan.cache_slots >= int(core.streamed_experts):
            core.preload_experts()
        return cls(manifest, engine, core, plan, history, base)

    @property
    def closed(self) -> bool:
        return self._core is None

    def _display_rows(self) -> list[tuple[str, str]]:
        return model_rows(self)

    @property
    def config(self) -> ModelConfig:
        return self._manifest.config

    @property
    def manifest(self) -> Manifest:
        return self._manifest

    @property
    def engine_config(self) -> EngineConfig:
        return self._engine_config

    @property
    def context_length(self) -> int:
        return self._context_length

    @property
    def threads(self) -> ThreadConfig:
        return self._engine_config.threads

    def set_threads(self, threads: ThreadConfig) -> None:
        """Changes the team size or wait policy; takes effect from the next call."""
        self._require_core().configure_threads(thread_settings(threads))
        self._engine_config = self._engine_config.replace(threads=threads)

    def thread_stats(self) -> _core.ThreadPoolStats:
        """Counters of the compute team (regions, sleeps, starved waits) since load or
        :meth:`reset_thread_stats`."""
        return self._require_core().thread_stats()

    def reset_thread_stats(self) -> None:
        self._require_core().reset_thread_stats()

    def set_activation_precision(self, precision: ActivationPrecision | str) -> None:
        """Switches between int8 and float32 activations; takes effect from the next call.
        Under ``kv_cache_type="auto"`` sessions opened from now on get the KV type of the
        new precision (f32 for float32), and the budget is re-split for it (ConfigError,
        changing nothing, if it no longer fits); existing sessions keep theirs."""
        cfg = self._engine_config.replace(activation_precision=precision)
        core = self._require_core()
        kv_type = session_kv_type(self._manifest, cfg)
        if kv_type != self._kv_type and self._plan is not None:
            plan = plan_store(self._manifest, cfg, core, self._context_length)
            if plan.cache_bytes != self._plan.cache_bytes:
                core.configure_store(store_settings(cfg, plan.cache_bytes))
            self._plan = plan
        core.activation_precision = ACT_PRECISION[cfg.activation_precision]
        self._engine_config = cfg
        self._kv_type = kv_type

    @property
    def kv_cache_type(self) -> str:
        """How new sessions store keys and values: "f32", "f16", "bf16" or "q8_0"
        (``EngineConfig.kv_cache_type`` with "auto" resolved)."""
        return self._kv_type

    def session(self) -> Session:
        """A new conversation state (KV cache) on this model."""
        with self._lock:
            session = Session(self, _core.Session(self._require_core(), self._context_length,
                                                  self._kv_type))
            self._sessions.add(session)
        return session

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (from the GGUF metadata or the checkpoint directory)."""
        if self._tokenizer is None:
            m = self._manifest
            if m.source == "gguf":
                self._tokenizer = Tokenizer.from_gguf_metadata(m.metadata, str(m.files[0]))
            else:
                self._tokenizer = Tokenizer.from_hf(m.path)
        return self._tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        return ChatTemplate.for_tokenizer(self.tokenizer)

    def encode_prompt(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Messages | None = None,
    ) -> list[int]:
        """Token ids for a raw prompt (bos added as the model asks), a list of ids (as
        given), or a conversation rendered with the model's chat template."""
        if (prompt is None) == (messages is None):
            raise InvalidRequestError("pass exactly one of prompt= or messages=")
        if messages is not None:
            text = self.chat_template.render(messages, add_generation_prompt=True)
            ids = self.tokenizer.encode(text, add_special_tokens=False, special=True)
        elif isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("the prompt is empty; give some text or messages")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True, special=True)
        else:
            ids = [int(t) for t in np.asarray(prompt, dtype=np.int64).reshape(-1)]
        if not ids:
            raise InvalidRequestError("the prompt encodes to no tokens")
        return ids

    def generate(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Messages | None = None,
        max_tokens: int = 256,
        sampling: Sampling | Mapping[str, Any] | None = None,
        stop: str | Sequence[str] = (),
        truncate: bool = False,
        progress: Progress | None = None,
        **options: Unpack[GenerateOptions],
    ) -> Generation:
        """Generates text in a fresh session and returns it whole.

        Raw or templated, one rule: a ``prompt`` (str) is a raw completion: the text is
        continued as it is (BOS added as the model asks), with no chat template; a list of
        ids is used as given. ``messages=[{"role": "user", "content": ...}, ...]`` (or
        :meth:`chat`) renders the conversation with the model's chat template and answers
        as the assistant. ``colibri run`` uses the template unless ``--raw``.

        ``max_tokens``: most tokens to generate, EOS included (0: none, finish "length").
        ``sampling``: a :class:`Sampling` (or a mapping of its fields); the default is
        greedy; ``Sampling(logprobs=True, top_logprobs=k, prompt_logprobs=k)`` adds
        log-probabilities. ``stop``: strings that end the text (not included).
        ``truncate``: keep the end of a prompt longer than the context instead of raising
        :class:`~colibri.errors.ContextOverflowError`. Further options
        (:class:`~colibri.generate.request.GenerateOptions`): ``stop_token_ids``, ``min_tokens``,
        ``logits_processors`` (callables ``(token_ids, logits) -> logits``, in order, before
        sampling) and ``response_format`` (a JSON schema, regex, choice list or grammar:
        :mod:`colibri.generate.structured`). ``progress(done, total)`` is called after each prefill
        chunk of the prompt (Session.forward).

        Returns a :class:`Generation`: ``text``, ``token_ids``, ``finish_reason`` ("stop":
        EOS, a stop string or token, or a complete structured text; "length"),
        ``stats`` (this generation's own figures, also under concurrent use) and the
        logprobs asked for. Safe to call from several threads at once (docs/api.md).
        """
        request = self._request(max_tokens, sampling, stop, truncate, options, "generate")
        ids = self._fit(self.encode_prompt(prompt, messages=messages), request)
        result: dict[str, Any] = {}
        return collect(self._start(ids, request, result, progress)[1], result, ids)

    def stream(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Messages | None = None,
        max_tokens: int = 256,
        sampling: Sampling | Mapping[str, Any] | None = None,
        stop: str | Sequence[str] = (),
        truncate: bool = False,
        progress: Progress | None = None,
        **options: Unpack[GenerateOptions],
    ) -> Generator[Chunk, None, None]:
        """Like :meth:`generate` (same arguments, same rule for raw and templated
        prompts), yielding a :class:`Chunk` per token as it arrives: the text it made
        visible (may be empty), its id, its logprobs when asked for, and on the last chunk
        the finish reason. Closing the generator early stops the generation."""
        request = self._request(max_tokens, sampling, stop, truncate, options, "stream")
        ids = self._fit(self.encode_prompt(prompt, messages=messages), request)
        return self._start(ids, request, {}, progress)[1]

    def _start(self, ids: list[int], request: Request, result: dict[str, Any],
               progress: Progress | None = None,
               ) -> tuple[Session, Generator[Chunk, None, None]]:
        """A generation of `ids` in a new session, or in one of the prompt cache holding
        a prefix of them (which is then not prefilled again); the session goes to the
        cache when the generation ends."""
        cache = self._prompt_cache
        if cache.enabled:
            session, m = cache.take(ids)
        else:
            session, m = self.session(), 0
        batcher = self._batcher
        if batcher is None or not cache.sharing:
            return session, self._stream(session, ids[m:], request, result,
                                         history=ids[:m], to_cache=True, progress=progress)
        # Under continuous batching: share a prefix with a generation running now
        # (colibri.generate.prefix_share), and be one others can share with.
        entry = cache.running.add(ids, session)
        lead = cache.running.leader(entry, m)
        if lead is None:
            gen = self._stream(session, ids[m:], request, result, history=ids[:m],
                               to_cache=True, progress=progress)
        else:
            gen = self._follow(session, ids, m, lead, batcher, request, result, progress)
        return session, cache.running.tracked(entry, gen, on_end=batcher.wake)

    def _follow(self, session: Session, ids: list[int], m: int, lead: tuple[Running, int],
                batcher: StepBatcher, request: Request, result: dict[str, Any],
                progress: Progress | None) -> Generator[Chunk, None, None]:
        """The generation of `ids` after copying the first ``lead[1]`` tokens' KV state
        from the running leader ``lead[0]`` once it holds them (or, if it ends first,
        from what the prompt cache holds then, at least the `m` tokens it gave)."""
        leader, n = lead
        if batcher.copy_prefix(session, leader.session, ids[:n], lambda: leader.ended):
            k = n
            self._prompt_cache.count_share(n - m)
        else:  # the leader ended first: its session may be in the cache by now
            k = self._prompt_cache.fill(session, ids, m)
        yield from self._stream(session, ids[k:], request, result, history=ids[:k],
                                to_cache=True, progress=progress)

    @staticmethod
    def _request(max_tokens: int, sampling: Sampling | Mapping[str, Any] | None,
                 stop: str | Sequence[str], truncate: bool, options: Mapping[str, Any],
                 where: str) -> Request:
        return parse_request({"max_tokens": max_tokens, "sampling": sampling, "stop": stop,
                              "truncate": truncate, **options}, where=where)

    def stats(self) -> ModelStats:
        """The model's figures now: generations, tokens and time since load, the streaming
        tier's expert-cache and I/O counters and time per phase since load (or
        :meth:`reset_stats`), the RAM budget split, the wait policy in effect, and the
        last generation to finish (``last``; from any thread: a generation's own record is
        its ``Generation.stats``). Cheap: safe to call during generation."""
        g, p, n, ps, ds, nd = self._totals
        core = self._require_core()
        return ModelStats(
            int(g), int(p), int(n), float(ps), float(ds), int(nd), self._last,
            memory=(memory_stats(self._plan, core, self._kv_type)
                    if self._plan is not None else None),
            experts=expert_stats(core), phases=phase_times(core),
            wait_policy=wait_policy_name(core), spec=self._spec_total,
            prefetch=prefetch_state_name(core, self._engine_config.io.prefetch),
            io=io_name(core) if int(core.streamed_experts) else "",
        )  # fmt: skip

    def reset_spec_memory(self) -> None:
        """Forgets the verify cost that ``SpecConfig(drafter="auto")`` measured in this
        model's earlier generations (kept so a later generation drafts from its first step
        at the measured cost; docs/speculative.md): the next one starts from the prior."""
        self._spec_memory.reset()

    def reset_stats(self) -> None:
        """Zeroes the cumulative expert, I/O and phase counters (not the cache)."""
        self._require_core().reset_store_stats()

    def save_routing_history(self) -> None:
        """Adds this run's routing counts to the model's history file (atomically). Called
        by :meth:`close`; CacheConfig(history=False) turns it off."""
        core, history, base = self._core, self._history, self._history_base
        if core is None or history is None or base is None:
            return
        history.save(base + core.route_counts())

    def set_io_fault(self, fault: str) -> None:
        """Test hook: make expert reads fail ("eio", "einval_direct_read") or slow
        ("slow_read": each read first sleeps 3 ms), or behave again ("none")."""
        self._require_core().set_io_fault(fault)

    def _fit(self, ids: list[int], request: Request) -> list[int]:
        max_tokens, truncate = request.max_tokens, request.truncate
        if len(ids) < self._context_length:
            return ids
        if not truncate:
            raise ContextOverflowError(
                f"the prompt has {len(ids)} tokens but the context holds "
                f"{self._context_length} (and at least one more is needed to answer); "
                "shorten it, pass truncate=True to keep its end, or raise "
                "EngineConfig.context_length"
            )
        keep = self._context_length - max(1, min(max_tokens, self._context_length // 2))
        return ids[-keep:]

    def _stream(
        self,
        session: Session,
        ids: Sequence[int],
        request: Request,
        result: dict[str, Any],
        history: Sequence[int] = (),
        to_cache: bool = False,
        progress: Progress | None = None,
    ) -> Generator[Chunk, None, None]:
        decoder = None if request.plain else Decoder(request, self.tokenizer,
                                                     self.config.vocab_size)
        core = self._require_core()
        # The session's own counters, not the engine's: another thread's generation on
        # this model must not mix into this one's figures (docs/api.md, threads).
        experts0, phases0 = session.forward_stats()

        def done(stats: GenerationStats, generated: list[int], finish: FinishReason | None) -> None:
            experts1, phases1 = session.forward_stats()
            stats = replace(
                stats, experts=experts1.minus(experts0), phases=phases1.minus(phases0),
                wait_policy=wait_policy_name(core), cached_tokens=len(history),
            )  # fmt: skip
            # Not an interrupted call (finish None): async cancellation rolls its session
            # back after this, which would leave a cache entry that no longer holds its
            # tokens.
            if to_cache and finish is not None and self._prompt_cache.enabled:
                self._prompt_cache.put(session)
            result.update(stats=stats, generated=generated, finish=finish)
            if decoder is not None:
                result.update(logprobs=decoder.logprobs, prompt_logprobs=decoder.prompt_logprobs)
            with self._lock:
                t = self._totals
                t[0] += 1
                t[1] += stats.prompt_tokens
                t[2] += stats.generated_tokens
                t[3] += stats.prefill_seconds
                t[4] += stats.decode_seconds
                t[5] += stats.decode_tokens if stats.spec is None else stats.spec.decode_tokens
                self._last = stats
                if stats.spec is not None:
                    self._spec_total = (stats.spec if self._spec_total is None
                                        else self._spec_total + stats.spec)

        spec = request.spec if request.spec is not None else self.engine_config.spec
        return stream_tokens(
            session, self.tokenizer, ids, max_tokens=request.max_tokens,
            sampling=request.sampling, stop=request.stop, history=history, on_done=done,
            decoder=decoder, progress=progress,
            speculator=speculator_for(spec, session._core, self.config.n_mtp_layers, self.name,
                                       self._spec_memory),
        )  # fmt: skip

    def close(self) -> None:
        """Saves the routing history (if kept) and frees the model's memory: the weights, the
        expert cache and every session's KV cache. Its sessions stop working (their calls
        raise InvalidRequestError); a forward running meanwhile in another thread is
        stopped at its next layer. Idempotent."""
        try:
            self.save_routing_history()
        finally:
            if self._batcher is not None:
                self._batcher.detach()  # its waiting forwards served, its thread stopped
            self._prompt_cache.clear()
            with self._lock:
                sessions = list(self._sessions)
                self._sessions.clear()
            for session in sessions:
                session._close()  # drops its KV cache and its hold on the engine
            self._core = None  # the last reference: the engine frees its memory now

    def __enter__(self) -> Model:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _require_core(self) -> _core.Engine:
        if self._core is None:
            raise InvalidRequestError("the model is closed; load it again to use it")
        return self._core
