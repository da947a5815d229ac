"""Chat templates: a conversation -> the prompt text the model was trained on.

A model ships its own Jinja template (Hugging Face ``tokenizer_config.json`` ``chat_template``,
or GGUF ``tokenizer.chat_template``). :class:`ChatTemplate` renders it the way
``transformers``' ``apply_chat_template`` does: a sandboxed Jinja environment
(``ImmutableSandboxedEnvironment``, ``trim_blocks``, ``lstrip_blocks``, loop controls) with
limits on time, size, loops and call depth (:mod:`colibri.chat.limits`: a template comes
from the model file, i.e. from a stranger), the
variables ``messages``, ``add_generation_prompt``, ``bos_token``, ``eos_token``, ``tools``,
``documents`` and the helpers templates use: ``raise_exception``, ``strftime_now``, a
``tojson`` filter that does not HTML-escape, ``{% generation %}`` blocks.

A model without a template gets :data:`CHATML_TEMPLATE` (``<|im_start|>role ... <|im_end|>``),
and :attr:`ChatTemplate.is_fallback` says so: the prompt is then only right for models that
were trained on ChatML.

>>> tpl = ChatTemplate(CHATML_TEMPLATE)
>>> tpl.render([{"role": "user", "content": "Hi"}])
'<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, overload

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import numpy as np

from ..errors import InvalidRequestError, ModelFormatError
from .deadline import Deadline, DeadlinePassed
from .limits import DEFAULT_LIMITS, LimitedEnvironment, LimitExceeded, TemplateLimits, check_text
from .limits import render as render_limited
from .plain_content import chat_text, encode_chat

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The fallback template (ChatML), used when a model ships none."""


class _TemplateRefused(Exception):
    """raise_exception() was called by the template."""


def _raise_exception(message: object) -> None:
    check_text(message, "raise_exception's message")
    raise _TemplateRefused(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; chat templates want plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationBlocks(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (marks assistant text for training masks in
    transformers): rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's API)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore attributes (no way to reach internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates may not store underscore attributes on a namespace ({name!r})"
            )


def _short(exc: BaseException, limit: int = 300) -> str:
    """An exception's message, cut to `limit` characters (it may quote template data)."""
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text):,} characters)"


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = _environment()
    tree = env.parse(source)
    _check_loop_controls(tree, in_loop=False)
    _check_repeated_keywords(tree)
    # Jinja compiles a template to Python source; odd template code (``x[0]`` on a literal)
    # makes Python's compiler warn, which tells a user nothing: ignore it while compiling.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return env.from_string(tree)


def _compile_within(source: str, cpu_seconds: float) -> jinja2.Template:
    """_compile, stopped by DeadlinePassed after `cpu_seconds` of this thread's CPU time (a
    cached template returns at once). DeadlinePassed can come from the ``with`` statement's
    exit too, so callers catch it around this call."""
    # The cyclic garbage collector is off while compiling: a full collection triggered by
    # the compiler's allocations walks the whole process's heap in this thread and would
    # be charged to the template (a real 17 KB template was refused after a long test run).
    # Compiling is bounded by the deadline, and its cycles are collected afterwards.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with Deadline.cpu(cpu_seconds):
            return _compile(source)
    finally:
        if was_enabled:
            gc.enable()


def _check_loop_controls(node: jinja2.nodes.Node, in_loop: bool) -> None:
    """A ``{% break %}`` / ``{% continue %}`` outside a loop is refused here, before Python
    compiles Jinja's output: Python's compiler reports that SyntaxError by opening the
    "file" it names ('<template>' in the working directory) to quote the line, a read
    outside the model (found by the template fuzzer)."""
    if isinstance(node, (jinja2.nodes.Break, jinja2.nodes.Continue)) and not in_loop:
        kind = "break" if isinstance(node, jinja2.nodes.Break) else "continue"
        raise jinja2.TemplateSyntaxError(f"'{kind}' outside a loop", node.lineno)
    if isinstance(node, jinja2.nodes.For):
        for child in node.body:
            _check_loop_controls(child, True)
        for part in (node.target, node.iter, node.test, *node.else_):
            if part is not None:
                _check_loop_controls(part, in_loop)
        return
    if isinstance(node, (jinja2.nodes.Macro, jinja2.nodes.CallBlock)):
        in_loop = False  # compiled as a function of its own
    for child in node.iter_child_nodes():
        _check_loop_controls(child, in_loop)


def _check_repeated_keywords(tree: jinja2.nodes.Node) -> None:
    """A call that names one keyword argument twice (``f(role=1, role=2)``) is refused here
    for the same reason as a stray ``break``: Python's compiler would report it by opening
    '<template>' in the working directory (template fuzzer, mutant 16687 of seed 1)."""
    for call in tree.find_all(jinja2.nodes.Call):
        seen: set[str] = set()
        for kw in call.kwargs:
            if kw.key in seen:
                raise jinja2.TemplateSyntaxError(f"keyword argument repeated: {kw.key}",
                                                 call.lineno)
            seen.add(kw.key)


def _environment() -> LimitedEnvironment:
    env = LimitedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlocks, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.limit_filters()
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env


def _plain(value: Any, where: str) -> Any:
    """A copy of value made of JSON types only (what a template may see)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, np.generic):
        return _plain(value.item(), where)
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value), where)
    raise InvalidRequestError(
        f"{where}: a {type(value).__name__} cannot be passed to a chat template "
        f"(use str, int, float, bool, None, lists and dicts)"
    )


def validate_messages(messages: object) -> list[dict[str, Any]]:
    """Check a conversation and return a plain copy of it.

    ``messages`` must be a non-empty list of dicts, each with a ``role`` (a non-empty str) and
    a ``content`` (a str); other keys (``name``, ``tool_calls``...) are passed to the
    template as they are. Keys whose value is None are dropped, as transformers does.
    Raises InvalidRequestError naming the first bad message.
    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise InvalidRequestError(
            f"messages must be a list of dicts like {{'role': 'user', 'content': 'Hi'}}, "
            f"not {type(messages).__name__}"
        )
    if len(messages) == 0:
        raise InvalidRequestError("messages is empty: a conversation needs at least one message")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise InvalidRequestError(
                f"messages[{i}] must be a dict with 'role' and 'content', not {type(msg).__name__}"
            )
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise InvalidRequestError(
                f"messages[{i}]['role'] must be a non-empty str ('system', 'user', 'assistant'...)"
                f", got {role!r}"
            )
        if "content" not in msg:
            raise InvalidRequestError(f"messages[{i}] ({role}) has no 'content'")
        if not isinstance(msg["content"], str):
            raise InvalidRequestError(
                f"messages[{i}]['content'] must be a str, not {type(msg['content']).__name__}"
            )
        out.append(
            {str(k): _plain(v, f"messages[{i}][{k!r}]") for k, v in msg.items() if v is not None}
        )
    return out


class ChatTemplate:
    """A compiled chat template.

    ``source``: the Jinja text. ``bos_token`` / ``eos_token``: the strings the template sees
    under those names. ``limits``: what one render may use (time, size, loops, call depth;
    the defaults are far above what real templates need). Raises ModelFormatError when the
    template does not compile.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        name: str = "chat template",
        is_fallback: bool = False,
        limits: TemplateLimits = DEFAULT_LIMITS,
    ) -> None:
        if not isinstance(source, str):
            raise ModelFormatError(f"{name} must be a str, not {type(source).__name__}")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.name = name
        self.is_fallback = is_fallback
        self.limits = limits
        try:
            self._template = _compile_within(source, limits.compile_seconds)
        except DeadlinePassed:
            raise ModelFormatError(
                f"{name} takes more than {limits.compile_seconds:.2g} s of CPU time to compile "
                "(TemplateLimits.compile_seconds)") from None
        except jinja2.TemplateSyntaxError as exc:
            line = ""
            if exc.lineno and 0 < exc.lineno <= len(source.splitlines()):
                line = f": {source.splitlines()[exc.lineno - 1].strip()[:120]!r}"
            raise ModelFormatError(
                f"{name} has a Jinja syntax error at line {exc.lineno}{line}: {exc.message}"
            ) from exc
        except LimitExceeded as exc:
            raise ModelFormatError(f"{name} cannot be compiled: {exc}") from exc
        except Exception as exc:  # TemplateError, RecursionError (deep nesting), MemoryError...
            raise ModelFormatError(
                f"{name} cannot be compiled ({type(exc).__name__}: {_short(exc)})"
            ) from exc

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer, name: str | None = None) -> ChatTemplate:
        """The model's own template (or one of its named templates, e.g. ``"tool_use"``);
        the ChatML fallback (:attr:`is_fallback` True) when it ships none."""
        bos, eos = tokenizer.bos_token, tokenizer.eos_token
        if name is not None:
            named = tokenizer.chat_templates
            if name not in named:
                raise InvalidRequestError(
                    f"the model has no chat template named {name!r}; it has "
                    f"{sorted(named) or 'none besides the default'}"
                )
            return cls(named[name], bos_token=bos, eos_token=eos, name=f"chat template {name!r}")
        if tokenizer.chat_template:
            return cls(tokenizer.chat_template, bos_token=bos, eos_token=eos)
        return cls(
            CHATML_TEMPLATE, bos_token=bos, eos_token=eos, name="ChatML fallback template",
            is_fallback=True,
        )  # fmt: skip

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **variables: Any,
    ) -> str:
        """The prompt text of a conversation.

        ``add_generation_prompt`` (default True) appends the header of the assistant's turn
        so the model answers. ``tools`` (JSON schemas) and ``documents`` are passed to
        templates that use them; ``variables`` are further template variables
        (``enable_thinking=False``...). Raises InvalidRequestError for a malformed
        conversation or one the template refuses (``raise_exception``), ModelFormatError
        when the template itself fails.
        """
        msgs = validate_messages(messages)
        context: dict[str, Any] = {
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
        }
        context.update({k: _plain(v, k) for k, v in variables.items()})
        context["messages"] = msgs
        context["add_generation_prompt"] = bool(add_generation_prompt)
        context["tools"] = None if tools is None else _plain(list(tools), "tools")
        context["documents"] = None if documents is None else _plain(list(documents), "documents")
        try:
            return render_limited(self._template, context, self.limits)
        except _TemplateRefused as exc:
            raise InvalidRequestError(
                f"the {self.name} refused the conversation: {_short(exc)}"
            ) from exc
        except jinja2.exceptions.SecurityError as exc:
            raise ModelFormatError(f"the {self.name} tried an unsafe operation: {exc}") from exc
        except LimitExceeded as exc:
            raise ModelFormatError(
                f"the {self.name} went over its resource limits: {exc} (a template that does "
                "this is broken or hostile; see ChatTemplate(limits=...))"
            ) from exc
        except Exception as exc:  # the template is a stranger's code: any failure is its own
            raise ModelFormatError(
                f"the {self.name} failed while rendering ({type(exc).__name__}: {_short(exc)})"
            ) from exc

    def __repr__(self) -> str:
        kind = "fallback ChatML" if self.is_fallback else f"{len(self.source)} chars"
        return f"ChatTemplate({self.name!r}, {kind})"


@overload
def apply_chat_template(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = ...,
    tokenize: Literal[False] = ...,
    special_tokens_in_content: bool = ...,
    **variables: Any,
) -> str: ...


@overload
def apply_chat_template(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = ...,
    tokenize: Literal[True],
    special_tokens_in_content: bool = ...,
    **variables: Any,
) -> list[int]: ...


def apply_chat_template(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tokenize: bool = False,
    special_tokens_in_content: bool = False,
    **variables: Any,
) -> str | list[int]:
    """Render ``messages`` with the tokenizer's model template (ChatML when it has none).

    With ``tokenize=True`` the ids of the prompt (no bos added: the template writes the ones
    the model wants): the template's control tokens matched, and the text of the messages
    and variables encoded as plain text (colibri.chat.plain_content), unless
    ``special_tokens_in_content=True`` (trusted input only: control tokens matched in it too).
    """
    template = ChatTemplate.for_tokenizer(tokenizer)
    return (encode_chat if tokenize else chat_text)(tokenizer, lambda plain: template.render(
        plain(messages), add_generation_prompt=add_generation_prompt, **plain(variables)),
        special_tokens_in_content=special_tokens_in_content)


__all__ = [
    "CHATML_TEMPLATE",
    "ChatTemplate",
    "apply_chat_template",
    "validate_messages",
]
