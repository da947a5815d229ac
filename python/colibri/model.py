"""Model: the facade over a loaded model's floors.

``Model.load`` resolves a name or path (colibri.models.resolve) and loads the engine
(colibri.engine.handle); generations run on it through a Runner (colibri.generate.runner);
chat templates render through colibri.chat. A ``Session`` owns one KV cache; many sessions
can share a model.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from . import _core
from .chat.fit import FittedPrompt, fit_conversation, fit_tokens
from .chat.messages import Messages, Tools, as_messages, render_conversation
from .chat.plain_content import chat_text, encode_chat
from .chat.reasoning import asplit_chunks, reasoning_mode, split_chunks, split_result
from .chat.template import ChatTemplate
from .display import Displayable, model_rows
from .engine.gpu_offload import gpu_stats
from .engine.handle import EngineHandle, load_engine
from .engine.streaming import (
    expert_stats,
    io_name,
    memory_stats,
    phase_times,
    prefetch_state_name,
    wait_policy_name,
)
from .errors import InvalidRequestError
from .generate.aio import agenerate_ids, apump_ids, astream_ids
from .generate.generation import Chunk, Generation, collect
from .generate.prompt_cache import PromptCache
from .generate.request import Request, parse_request
from .generate.runner import Runner
from .generate.samples import check_sample_count, generate_n
from .generate.session import ProgressOption, Session, prefill_progress, with_bar
from .generate.totals import ModelStats
from .models.resolve import resolve_model_spec
from .progress import delayed_bar
from .sampling import Sampling
from .settings.config import ActivationPrecision, EngineConfig, ThreadConfig
from .sources import Manifest, ModelConfig
from .tokenizers import Tokenizer

if TYPE_CHECKING:
    from typing import Unpack

    from .chat.reasoning import ReasoningMode
    from .generate.request import CallOptions, GenerateOptions

__all__ = ["Model", "ModelStats"]


def _token_ids(prompt: object) -> list[int]:
    """A prompt given as token ids, checked: a flat sequence of integers. A conversation
    passed here instead of to ``messages=`` is named as such."""
    first = prompt[0] if isinstance(prompt, Sequence) and len(prompt) else None
    if isinstance(prompt, Mapping) or isinstance(first, Mapping):
        raise InvalidRequestError(
            "the prompt is a conversation: pass it as messages=[{'role': ..., 'content': "
            "...}] (or use model.chat(...)); prompt= takes a str or a list of token ids")
    if not isinstance(prompt, (Sequence, np.ndarray)) or isinstance(prompt, (bytes, bytearray)):
        raise InvalidRequestError(
            f"prompt must be a str or a list of token ids, not {type(prompt).__name__}")
    ids = np.asarray(prompt)
    if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
        raise InvalidRequestError(
            "prompt token ids must be a flat list of integers; for text pass a str")
    return [int(t) for t in ids]


class Model(Displayable):
    """A loaded model. Use :meth:`load`; close it (or use ``with``) to free its memory."""

    def __init__(self, handle: EngineHandle) -> None:
        self._runner = Runner(handle)
        self._chat_template: ChatTemplate | None = None  # set by the user, else the model's
        self.special_tokens_in_content = False
        """True (trusted callers only): control-token text in messages, tools and template
        variables is matched as control tokens, as the rendered template's own is; False
        (the default): it is encoded as plain text (docs/api.md, "Special tokens in
        messages"). A raw ``prompt`` str always matches special tokens."""

    @property
    def runner(self) -> Runner:
        """What generates on this model (colibri.generate.runner): its sessions, the prompt
        cache, the running totals, and the step batcher a server attaches."""
        return self._runner

    @property
    def _handle(self) -> EngineHandle:
        return self._runner.handle

    @property
    def prompt_cache(self) -> PromptCache:
        """The prompt cache (colibri.generate.prompt_cache): off unless
        ``EngineConfig.prompt_cache`` gives it bytes; ``model.prompt_cache.stats()`` says
        what it holds and saved."""
        return self._runner.prompt_cache

    def load_session(self, path: str | os.PathLike[str]) -> Session:
        """A session restored from a file written by ``Session.save`` (see Session.load)."""
        return Session.load(path, self)

    @property
    def name(self) -> str:
        """The named model or Hugging Face repository id it was loaded as, else the file
        or directory name."""
        return self._handle.name

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
        progress: bool | None = None,
    ) -> Model:
        """Loads a model: a GGUF file, a Hugging Face checkpoint directory, a native
        container, a named model (``"smollm2"``, ``"smollm2-moe-demo"``: the names
        ``colibri run --model`` takes, fetched into ``cache_dir`` on first use) or a
        Hugging Face repository id (``"org/name"``) already in the local Hugging Face cache
        (``filename="*Q4_K_M.gguf"`` picks one GGUF of it; ``download=True`` lets
        huggingface_hub fetch what is missing). See :mod:`colibri.models.resolve`.

        Resident (dense) weights are read now; routed experts are read on demand into the
        expert cache, sized by ``engine.ram_budget`` (see :mod:`colibri.engine.budget`).

        ``progress``: None ("auto") writes what a fetch does to stderr and, where stderr is
        a terminal or in a Jupyter kernel, shows a bar once the load has run a second;
        True shows that bar anywhere; False prints nothing."""
        resolved = resolve_model_spec(
            model, filename=filename, revision=revision, cache_dir=cache_dir,
            hf_cache_dir=hf_cache_dir, download=download,
            log=None if progress is False else sys.stderr,
        )  # fmt: skip
        bar = delayed_bar(progress, f"colibri: loading {resolved.name or resolved.path.name}")
        if bar is None:
            handle = load_engine(resolved.path, engine)
        else:
            with bar:
                handle = load_engine(resolved.path, engine)
        handle.name = resolved.name or resolved.path.name
        return cls(handle)

    @property
    def closed(self) -> bool:
        return self._handle.closed

    def _display_rows(self) -> list[tuple[str, str]]:
        return model_rows(self)

    @property
    def config(self) -> ModelConfig:
        return self._handle.config

    @property
    def manifest(self) -> Manifest:
        return self._handle.manifest

    @property
    def engine_config(self) -> EngineConfig:
        return self._handle.engine_config

    @property
    def context_length(self) -> int:
        return self._handle.context_length

    @property
    def threads(self) -> ThreadConfig:
        return self._handle.engine_config.threads

    def set_threads(self, threads: ThreadConfig) -> None:
        """Changes the team size or wait policy; takes effect from the next call."""
        self._handle.set_threads(threads)

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
        changing nothing, if it no longer fits); existing sessions keep theirs. The prompt
        cache is emptied when the arithmetic or the KV type changes: its entries were
        computed under the old one."""
        handle = self._handle
        before = (handle.engine_config.activation_precision, handle.kv_type)
        handle.set_activation_precision(precision)
        if (handle.engine_config.activation_precision, handle.kv_type) != before:
            self.runner.prompt_cache.invalidate()

    @property
    def kv_cache_type(self) -> str:
        """How new sessions store keys and values: "f32", "f16", "bf16" or "q8_0"
        (``EngineConfig.kv_cache_type`` with "auto" resolved)."""
        return self._handle.kv_type

    def session(self) -> Session:
        """A new conversation state (KV cache) on this model."""
        return self._runner.session()

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (from the GGUF metadata or the checkpoint directory)."""
        return self._runner.tokenizer

    @property
    def chat_template(self) -> ChatTemplate:
        """The chat template the templated calls use: the model's own (ChatML when it ships
        none), or the one assigned here (Jinja source or a ChatTemplate; None restores
        the model's). Conversations with tools use it when it renders tools, else
        colibri's tool template for ChatML (colibri.chat.tool_templates)."""
        if self._chat_template is not None:
            return self._chat_template
        return ChatTemplate.for_tokenizer(self.tokenizer)

    @chat_template.setter
    def chat_template(self, template: ChatTemplate | str | None) -> None:
        if isinstance(template, str):
            tok = self.tokenizer
            template = ChatTemplate(template, bos_token=tok.bos_token, eos_token=tok.eos_token)
        elif template is not None and not isinstance(template, ChatTemplate):
            raise InvalidRequestError(f"chat_template must be a str (Jinja source), a "
                                      f"ChatTemplate or None, not {type(template).__name__}")
        self._chat_template = template

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
            template = self.chat_template
            ids = encode_chat(self.tokenizer, lambda plain: template.render(
                plain(messages), add_generation_prompt=True),
                special_tokens_in_content=self.special_tokens_in_content)
        elif isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("the prompt is empty; give some text or messages")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True, special=True)
        else:
            ids = _token_ids(prompt)
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
        progress: ProgressOption = None,
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
        ``truncate``: fit a prompt longer than the context instead of raising
        :class:`~colibri.errors.ContextOverflowError`: a raw one keeps its end, a
        conversation its system message and last turn (:meth:`fit_prompt`). Further options
        (:class:`~colibri.generate.request.GenerateOptions`): ``stop_token_ids``, ``min_tokens``,
        ``logits_processors`` (callables ``(token_ids, logits) -> logits``, in order, before
        sampling) and ``response_format`` (a JSON schema, regex, choice list or grammar:
        :mod:`colibri.generate.structured`). ``progress``: None ("auto") shows a bar on stderr
        (Jupyter's widget in a notebook) once the prefill has run a second, where stderr is
        a terminal or in a Jupyter kernel, never in a pipe or a log; True anywhere; False
        never; a callable ``progress(done, total)`` is called after each prefill chunk
        instead (Session.forward).

        Returns a :class:`Generation`: ``text``, ``token_ids``, ``finish_reason`` ("stop":
        EOS, a stop string or token, or a complete structured text; "length"),
        ``stats`` (this generation's own figures, also under concurrent use) and the
        logprobs asked for. Safe to call from several threads at once (docs/api.md).
        """
        request, ids = self._prepare(prompt, messages, {
            "max_tokens": max_tokens, "sampling": sampling, "stop": stop, "truncate": truncate,
            **options}, "generate")  # fmt: skip
        callback, bar = prefill_progress(progress, len(ids))
        result: dict[str, Any] = {}
        return split_result(collect(with_bar(self._runner.start(ids, request, result,
                                                                callback)[1], bar),
                                    result, ids), self._reasoning(ids, messages))

    def stream(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Messages | None = None,
        max_tokens: int = 256,
        sampling: Sampling | Mapping[str, Any] | None = None,
        stop: str | Sequence[str] = (),
        truncate: bool = False,
        progress: ProgressOption = None,
        **options: Unpack[GenerateOptions],
    ) -> Generator[Chunk, None, None]:
        """Like :meth:`generate` (same arguments, same rule for raw and templated
        prompts), yielding a :class:`Chunk` per token as it arrives: the text it made
        visible (may be empty), its id, its logprobs when asked for, and on the last chunk
        the finish reason. Closing the generator early stops the generation."""
        request, ids = self._prepare(prompt, messages, {
            "max_tokens": max_tokens, "sampling": sampling, "stop": stop, "truncate": truncate,
            **options}, "stream")  # fmt: skip
        callback, bar = prefill_progress(progress, len(ids))
        return split_chunks(with_bar(self._runner.start(ids, request, {}, callback)[1], bar),
                            self._reasoning(ids, messages))  # type: ignore[return-value]

    def _prepare(self, prompt: str | Sequence[int] | None, messages: Messages | None,
                 options: Mapping[str, Any], where: str) -> tuple[Request, list[int]]:
        """The call's options validated, and its prompt's ids fitted to the context."""
        request = parse_request(options, where=where)
        ids = self.encode_prompt(prompt, messages=messages)
        if request.truncate and len(ids) >= self.context_length:
            ids = self.fit_prompt(prompt, messages=messages, max_tokens=request.max_tokens).ids
        return request, self._runner.fit(ids, request)

    def fit_prompt(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: str | Messages | None = None,
        tools: Tools | None = None,
        max_tokens: int = 256,
    ) -> FittedPrompt:
        """The token ids a call with ``truncate=True`` prefills, and what was cut to fit
        them (a :class:`~colibri.chat.fit.FittedPrompt`). A prompt shorter than the context
        is whole; a longer one is cut to leave room for ``max_tokens`` (for at most half
        the context): a raw prompt (a str or ids) keeps its end; a conversation
        (``messages``, rendered with the chat template and ``tools``) keeps its system
        message and its last user message, drops whole turns before that, oldest first,
        then cuts the middle of the last user message, and keeps the end of the rendered
        prompt only when its fixed part alone is too long (docs/api.md)."""
        room = self._runner.truncated_length(parse_request({"max_tokens": max_tokens}).max_tokens)
        context = self.context_length
        if messages is None:
            ids = self.encode_prompt(prompt)
            return FittedPrompt(ids) if len(ids) < context else fit_tokens(ids, room)
        if prompt is not None:
            raise InvalidRequestError("pass exactly one of prompt= or messages=")

        def render(msgs: list[dict[str, Any]]) -> list[int]:
            return self.apply_chat_template(msgs, tools=tools, tokenize=True)

        conversation = as_messages(messages)
        ids = render(conversation)
        if not ids:
            raise InvalidRequestError("the prompt encodes to no tokens")
        if len(ids) < context:
            return FittedPrompt(ids)
        return fit_conversation(conversation, render, self.tokenizer, room,
                                special_tokens_in_content=self.special_tokens_in_content)

    async def agenerate(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Messages | None = None,
        **options: Unpack[CallOptions],
    ) -> Generation:
        """:meth:`generate` for asyncio (same arguments and result); the forwards run on a
        worker thread. Cancelling the awaiting task stops between tokens (see
        :mod:`colibri.generate.aio`)."""
        request, ids = self._prepare(prompt, messages, options, "agenerate")
        return split_result(await agenerate_ids(self._runner, ids, request),
                            self._reasoning(ids, messages))

    def astream(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Messages | None = None,
        **options: Unpack[CallOptions],
    ) -> AsyncGenerator[Chunk, None]:
        """:meth:`stream` for asyncio: ``async for chunk in model.astream(...)``."""
        request, ids = self._prepare(prompt, messages, options, "astream")
        return asplit_chunks(astream_ids(self._runner, ids, request),  # type: ignore[return-value]
                             self._reasoning(ids, messages))

    def _apump(self, prompt_ids: Sequence[int], options: Mapping[str, Any],
               ) -> AsyncGenerator[Chunk, None]:
        """:meth:`astream` of `prompt_ids` with the generation running ahead of its
        consumer (colibri.generate.aio.pump_stream): the server's path."""
        request, ids = self._prepare(list(prompt_ids), None, options, "astream")
        return apump_ids(self._runner, ids, request)

    def generate_n(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        n: int,
        messages: Messages | None = None,
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
        check_sample_count(n)
        request, ids = self._prepare(prompt, messages, options, "generate_n")
        mode = self._reasoning(ids, messages)
        return [split_result(g, mode) for g in generate_n(self._runner, ids, request, n)]

    @overload
    def apply_chat_template(self, messages: str | Messages, *, tools: Tools | None = ...,
                            add_generation_prompt: bool = ..., tokenize: Literal[False] = ...,
                            **variables: Any) -> str: ...
    @overload
    def apply_chat_template(self, messages: str | Messages, *, tools: Tools | None = ...,
                            add_generation_prompt: bool = ..., tokenize: Literal[True],
                            **variables: Any) -> list[int]: ...

    def apply_chat_template(
        self,
        messages: str | Messages,
        *,
        tools: Tools | None = None,
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **variables: Any,
    ) -> str | list[int]:
        """The model's chat template applied to ``messages`` (a str is one user message):
        the prompt text, or with ``tokenize=True`` its token ids (the template's control
        tokens matched, the caller's text plain unless :attr:`special_tokens_in_content`;
        no BOS added: the template writes what the model wants), exactly what
        ``generate(messages=...)`` and :meth:`chat` prefill.

        ``tools``: tool definitions (OpenAI's ``[{"type": "function", "function": {...}}]``)
        for templates that render them; a template that ignores them raises
        InvalidRequestError rather than silently dropping them. ``add_generation_prompt``
        (default True) ends with the assistant's turn header. ``variables`` are further
        template variables (``enable_thinking=False``, ``documents=[...]``...)."""
        template = self.chat_template
        return (encode_chat if tokenize else chat_text)(
            self.tokenizer, lambda plain: render_conversation(
                template, plain(messages), tools=plain(tools),
                add_generation_prompt=add_generation_prompt, **plain(variables)),
            special_tokens_in_content=self.special_tokens_in_content)

    def count_tokens(
        self,
        prompt: str | None = None,
        *,
        messages: str | Messages | None = None,
        tools: Tools | None = None,
        add_generation_prompt: bool = True,
    ) -> int:
        """Tokens the prompt takes in the context: a raw ``prompt`` as ``generate(prompt)``
        encodes it (BOS included when the model adds one), or ``messages`` through the chat
        template as ``generate(messages=...)`` does."""
        if (prompt is None) == (messages is None):
            raise InvalidRequestError("pass exactly one of prompt= or messages=")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise InvalidRequestError(f"prompt must be a str, not {type(prompt).__name__}")
            return len(self.tokenizer.encode(prompt, add_special_tokens=True, special=True))
        assert messages is not None
        return len(self.apply_chat_template(messages, tools=tools, tokenize=True,
                                            add_generation_prompt=add_generation_prompt))

    def chat(
        self,
        messages: str | Messages,
        *,
        system: str | None = None,
        tools: Tools | None = None,
        **options: Unpack[CallOptions],
    ) -> Generation:
        """Answers a conversation as the assistant, through the model's chat template
        (a str is one user message; ``system`` adds a system message first; ``tools`` are
        passed to the template). Same options as :meth:`generate`. The templated form of
        ``generate(prompt)``, which is a raw completion."""
        ids = self._chat_ids(messages, system, tools, options)
        return split_result(self.generate(ids, **options), self._reasoning(ids, True))

    def stream_chat(
        self,
        messages: str | Messages,
        *,
        system: str | None = None,
        tools: Tools | None = None,
        **options: Unpack[CallOptions],
    ) -> Generator[Chunk, None, None]:
        """:meth:`chat`, yielding chunks as :meth:`stream` does."""
        ids = self._chat_ids(messages, system, tools, options)
        return split_chunks(self.stream(ids, **options),  # type: ignore[return-value]
                            self._reasoning(ids, True))

    def _reasoning(self, ids: list[int], templated: object) -> ReasoningMode | None:
        """colibri.chat.reasoning's mode for a templated generation of `ids`."""
        return reasoning_mode(self.chat_template, self.tokenizer, ids) if templated else None

    def _chat_ids(self, messages: str | Messages, system: str | None, tools: Tools | None,
                  options: Mapping[str, Any]) -> list[int]:
        """:meth:`chat`'s prompt ids: the conversation fitted by its turns under
        ``truncate=True`` (the ids then fit, so generate's own truncation does nothing)."""
        conversation = as_messages(messages, system)
        if options.get("truncate") is True:
            return self.fit_prompt(messages=conversation, tools=tools,
                                   max_tokens=options.get("max_tokens", 256)).ids
        return self.apply_chat_template(conversation, tools=tools, tokenize=True)

    def stats(self) -> ModelStats:
        """The model's figures now: generations, tokens and time since load, the streaming
        tier's expert-cache and I/O counters and time per phase since load (or
        :meth:`reset_stats`), the GPU's (``gpu``, None on the CPU: the adapter, dispatches,
        transfers, which matrices run where and why), the RAM budget split, the wait policy
        in effect, and the
        last generation to finish (``last``; from any thread: a generation's own record is
        its ``Generation.stats``). Cheap: safe to call during generation."""
        core = self._require_core()
        handle = self._handle
        return self._runner.totals.model_stats(
            memory=(memory_stats(handle.plan, core, handle.kv_type)
                    if handle.plan is not None else None),
            experts=expert_stats(core), phases=phase_times(core),
            wait_policy=wait_policy_name(core),
            prefetch=prefetch_state_name(core, handle.engine_config.io.prefetch),
            io=io_name(core) if int(core.streamed_experts) else "",
            gpu=gpu_stats(core),
        )  # fmt: skip

    def reset_spec_memory(self) -> None:
        """Forgets the verify cost that ``SpecConfig(drafter="auto")`` measured in this
        model's earlier generations (kept so a later generation drafts from its first step
        at the measured cost; docs/speculative.md): the next one starts from the prior."""
        self._runner.spec_memory.reset()

    def reset_stats(self) -> None:
        """Zeroes the cumulative expert, I/O, phase and GPU counters (not the cache)."""
        self._require_core().reset_store_stats()

    def save_routing_history(self) -> None:
        """Adds this run's routing counts to the model's history file (atomically). Called
        by :meth:`close`; CacheConfig(history=False) turns it off."""
        self._handle.save_routing_history()

    def set_io_fault(self, fault: str) -> None:
        """Test hook: make expert reads fail ("eio", "einval_direct_read") or slow
        ("slow_read": each read first sleeps 3 ms), or behave again ("none")."""
        self._require_core().set_io_fault(fault)

    def close(self) -> None:
        """Saves the routing history (if kept) and frees the model's memory: the weights, the
        expert cache and every session's KV cache. Its sessions stop working (their calls
        raise InvalidRequestError); a forward running meanwhile in another thread is
        stopped at its next layer. Idempotent."""
        self._runner.close()

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
        return self._handle.core
