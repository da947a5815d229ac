"""Chat templates on a Model: ``chat``, ``apply_chat_template`` and ``count_tokens``
(mixed into :class:`colibri.Model`).

The rule for prompts (docs/api.md, "Raw or templated"): a ``str`` prompt given to
``generate``/``stream`` is a raw completion; ``messages=`` and :meth:`chat` go through
the model's chat template. ``apply_chat_template`` shows (or tokenizes) exactly what the
templated calls prefill.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from ..errors import InvalidRequestError

if TYPE_CHECKING:
    from typing import Unpack

    from ..generate.generation import Chunk, Generation
    from ..generate.request import CallOptions
    from ..tokenizers import Tokenizer
    from .template import ChatTemplate

__all__ = ["Messages", "TemplateMethods", "as_messages"]

Messages = Sequence[Mapping[str, Any]]
Tools = Sequence[Mapping[str, Any]]


def as_messages(messages: str | Messages, system: str | None = None) -> list[dict[str, Any]]:
    """A conversation from a str (one user message) or a list of messages, with an
    optional system message first."""
    if isinstance(messages, str):
        msgs: list[dict[str, Any]] = [{"role": "user", "content": messages}]
    elif isinstance(messages, Sequence):
        msgs = [dict(m) if isinstance(m, Mapping) else m for m in messages]  # type: ignore[misc]
    else:
        raise InvalidRequestError(
            f"messages must be a str or a list of {{'role': ..., 'content': ...}} mappings, "
            f"not {type(messages).__name__}"
        )
    if system is not None:
        msgs.insert(0, {"role": "system", "content": system})
    return msgs


class TemplateMethods:
    """The chat-template methods of a Model."""

    if TYPE_CHECKING:

        @property
        def tokenizer(self) -> Tokenizer: ...
        @property
        def chat_template(self) -> ChatTemplate: ...
        def generate(self, prompt: str | Sequence[int] | None = None, *,
                     messages: Messages | None = None,
                     **options: Unpack[CallOptions]) -> Generation: ...
        def stream(self, prompt: str | Sequence[int] | None = None, *,
                   messages: Messages | None = None,
                   **options: Unpack[CallOptions]) -> Generator[Chunk, None, None]: ...

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
        the prompt text, or with ``tokenize=True`` its token ids (special tokens matched, no
        BOS added: the template writes what the model wants), exactly what
        ``generate(messages=...)`` and :meth:`chat` prefill.

        ``tools``: tool definitions (OpenAI's ``[{"type": "function", "function": {...}}]``)
        for templates that render them; a template that ignores them raises
        InvalidRequestError rather than silently dropping them. ``add_generation_prompt``
        (default True) ends with the assistant's turn header. ``variables`` are further
        template variables (``enable_thinking=False``, ``documents=[...]``...)."""
        tpl = self.chat_template
        if tools is not None and "tools" not in tpl.source:
            raise InvalidRequestError(
                f"the model's {tpl.name} does not render tools; describe them in a system "
                "message instead, or pass a model whose template supports tool use"
            )
        text = tpl.render(as_messages(messages), add_generation_prompt=add_generation_prompt,
                          tools=tools, **variables)
        if tokenize:
            return self.tokenizer.encode(text, add_special_tokens=False, special=True)
        return text

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
        ids = self.apply_chat_template(as_messages(messages, system), tools=tools,
                                       tokenize=True)
        return self.generate(ids, **options)

    def stream_chat(
        self,
        messages: str | Messages,
        *,
        system: str | None = None,
        tools: Tools | None = None,
        **options: Unpack[CallOptions],
    ) -> Generator[Chunk, None, None]:
        """:meth:`chat`, yielding chunks as :meth:`stream` does."""
        ids = self.apply_chat_template(as_messages(messages, system), tools=tools,
                                       tokenize=True)
        return self.stream(ids, **options)
