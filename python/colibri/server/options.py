"""From a request body to what the engine runs: the prompt's token ids, the call options
of ``Model.astream`` (validated before the request is queued, so a bad value is a 400,
never a broken stream), the number of samples and their seeds.

Defaults follow OpenAI's: ``temperature`` 1, ``top_p`` 1, ``max_tokens`` up to the end of
the context. Sample ``i`` of ``n > 1`` draws with ``colibri.generate.samples.sample_seeds(seed,
n)[i]`` (what ``Model.generate_n`` does); ``n == 1`` uses ``seed`` itself, so a seeded
request gives what ``Model.generate`` gives with ``Sampling(seed=seed)``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..chat.plain_content import encode_chat
from ..chat.reasoning import ReasoningMode
from ..chat.template import ChatTemplate
from ..chat.tool_templates import has_tool_turns
from ..errors import ColibriError
from ..generate.grammar_limits import GrammarLimits, check_tools
from ..generate.request import parse_request
from ..generate.samples import sample_seeds
from ..generate.structured import compile_format
from ..generate.structured import response_format as as_format
from ..sampling import Sampling
from .errors import ApiError, from_colibri
from .prompt_size import PromptLimits, check_conversation
from .reasoning import reasoning_mode
from .tools import FORCED_FORMATS, forced_call_grammar, template_format
from .wire import ChatCompletionRequest, ChatMessage, SamplingFields

if TYPE_CHECKING:
    from ..model import Model

MAX_N = 16
"""Most samples one request may ask for (they run one after the other)."""


@dataclass
class Plan:
    """One request, ready to run: ``n`` generations of ``prompt_ids`` with ``options``
    (sample i with ``seeds[i]``)."""

    prompt_ids: list[int]
    options: dict[str, Any]
    n: int = 1
    seeds: list[int | None] = field(default_factory=lambda: [None])
    logprobs: int | None = None  # alternatives per token when logprobs are asked for
    tool_format: str | None = None  # a tool_formats.FORMATS name: parse calls out of the text
    stop: tuple[str, ...] = ()
    tools: list[dict[str, Any]] | None = None  # the request's (argument types for parsing)
    # None: the output is not split into reasoning and answer (server/reasoning.py); else
    # whether the prompt opened the reasoning block.
    reasoning: ReasoningMode | None = None  # colibri.chat.reasoning.reasoning_mode

    @property
    def positions(self) -> int:
        """KV positions a sample may fill: the prompt and max_tokens (the scheduler caps
        it at the context)."""
        return len(self.prompt_ids) + int(self.options["max_tokens"])

    def sample_options(self, i: int) -> dict[str, Any]:
        opts = dict(self.options)
        opts["sampling"] = opts["sampling"].replace(seed=self.seeds[i])
        return opts


def _refuse(name: str, why: str) -> ApiError:
    return ApiError(400, f"{name} is not supported by colibri's server: {why}", param=name)


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(not s for s in stops):
        raise ApiError(400, "stop strings must not be empty", param="stop")
    return stops


def sampling(req: SamplingFields, *, logprobs: bool = False, top_logprobs: int = 0,
             default_temperature: float = 1.0) -> Sampling:
    fields: dict[str, Any] = {
        "temperature": default_temperature if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "seed": req.seed, "logprobs": logprobs, "top_logprobs": top_logprobs,
    }
    for name in ("top_k", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty"):
        value = getattr(req, name, None)
        if value is not None:
            fields[name] = value
    if req.logit_bias:
        try:
            fields["logit_bias"] = {int(k): float(v) for k, v in req.logit_bias.items()}
        except ValueError:
            raise ApiError(400, "logit_bias keys must be token ids (decimal strings)",
                           param="logit_bias") from None
    try:
        return Sampling(**fields)
    except ColibriError as exc:
        raise from_colibri(exc) from exc


def plan(model: Model, req: SamplingFields, prompt_ids: list[int], sampling_: Sampling, *,
         max_tokens: int | None, response_format: Any = None,
         logprobs: int | None = None, tool_format: str | None = None,
         tools: list[dict[str, Any]] | None = None,
         limits: GrammarLimits | None = None,
         reasoning_budget: int | None = None) -> Plan:
    """The Plan of a request whose prompt is `prompt_ids`; every option validated, and
    `response_format` compiled within `limits` (None: the defaults), so a grammar that
    cannot be used is a 400 before a stream's 200."""
    if req.n > MAX_N:
        raise ApiError(400, f"n must be at most {MAX_N} (got {req.n})", param="n")
    room = model.context_length - len(prompt_ids)
    if room < 1:
        raise ApiError(400, f"the prompt has {len(prompt_ids)} tokens but the context holds "
                            f"{model.context_length} (and at least one more is needed to "
                            "answer); shorten it, or start the server with a larger "
                            "--context-length", param="messages",
                       code="context_length_exceeded")
    vocab = model.config.vocab_size
    if any(not 0 <= t < vocab for t in prompt_ids):
        raise ApiError(400, f"the prompt holds token ids outside the vocabulary (0..{vocab - 1})",
                       param="prompt")
    stops = _stops(req.stop)
    options: dict[str, Any] = {"max_tokens": room if max_tokens is None else max_tokens,
                               "sampling": sampling_, "stop": stops}
    if req.min_tokens:
        options["min_tokens"] = req.min_tokens
    if reasoning_budget is not None:
        options["reasoning_budget"] = reasoning_budget
    if req.max_time is not None:
        options["max_time"] = req.max_time
    try:
        if response_format is not None:
            options["response_format"] = compile_format(
                as_format(response_format, limits), model.tokenizer, model.config.vocab_size)
        parse_request(options, where="serve")
    except ColibriError as exc:
        raise from_colibri(exc) from exc
    seeds = [req.seed] if req.n == 1 else sample_seeds(req.seed, req.n)
    return Plan(prompt_ids, options, req.n, seeds, logprobs, tool_format, stops, tools)


# --- chat -------------------------------------------------------------------------------


def _text_of(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}: only text content parts are supported, not "
                                f"{part.get('type')!r}", param="messages")
        parts.append(part["text"])
    return "".join(parts)


def _tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's tool calls with their ``arguments`` JSON text parsed: the templates
    (Qwen's, Hermes') write ``arguments | tojson``, which wants the object."""
    out = []
    for c in calls:
        c = dict(c)
        fn = dict(c.get("function") or {})
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                fn["arguments"] = json.loads(args)
            except ValueError:
                pass  # left as the text it is
        c["function"] = fn
        out.append(c)
    return out


def chat_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The conversation as chat templates take it (text parts joined, ``developer`` as
    ``system``, tool-call arguments as objects, None content as "")."""
    out = []
    for i, m in enumerate(messages):
        d: dict[str, Any] = {k: v for k, v in m.model_dump(exclude_none=True).items()
                             if k not in ("role", "content", "tool_calls")}
        d["role"] = "system" if m.role == "developer" else m.role
        d["content"] = _text_of(m.content, f"messages[{i}]")
        if m.tool_calls:
            d["tool_calls"] = _tool_calls(m.tool_calls)
        out.append(d)
    return out


def pick_template(template: ChatTemplate, tool_template: ChatTemplate | None,
                  messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  ) -> ChatTemplate:
    """The template a request is rendered with: `template` (the model's, or
    --chat-template's) for a plain conversation; `tool_template`
    (colibri.chat.tool_templates.template_for_tools: `template` itself when it renders
    tools, else colibri's shipped one for its family) for one with tools, or with tool
    calls or results in it. A 400 when tools are given and there is no such template."""
    if tools is None and not has_tool_turns(messages):
        return template
    if tool_template is not None:
        return tool_template
    if tools is None:
        return template  # tool turns without tools: written as the template can
    raise ApiError(400, f"the {template.name} does not render tools, and colibri ships no "
                        "tool template for its format (it has one for ChatML templates); "
                        "start the server with --chat-template FILE naming a template that "
                        "renders them (docs/serving.md, Tool calls)", param="tools")


def render_chat(model: Model, template: ChatTemplate, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None,
                variables: dict[str, Any] | None = None) -> list[int]:
    """The prompt's ids: `messages` and `tools` through `template` (:func:`pick_template`'s
    choice), with further template `variables` (``chat_template_kwargs``), the caller's text
    encoded as plain text unless the model's ``special_tokens_in_content`` (``colibri serve
    --allow-special-tokens-in-content``)."""
    messages = _reasoning_named_for(template, messages)
    try:
        return encode_chat(model.tokenizer, lambda plain: template.render(
            plain(messages), add_generation_prompt=True, tools=plain(tools),
            **{k: plain(v) for k, v in (variables or {}).items()}),
            special_tokens_in_content=model.special_tokens_in_content)
    except ColibriError as exc:
        raise from_colibri(exc) from exc


def _reasoning_named_for(template: ChatTemplate,
                         messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Past reasoning (``reasoning_content``, vLLM's name) under the name the template reads:
    gpt-oss's and a few others' read an assistant message's ``thinking`` instead."""
    src = template.source
    if "reasoning_content" in src or "thinking" not in src:
        return messages
    return [{**{k: v for k, v in m.items() if k != "reasoning_content"},
             "thinking": m["reasoning_content"]}
            if "reasoning_content" in m and "thinking" not in m else m for m in messages]


def checked_tools(tools: list[dict[str, Any]] | None, limits: GrammarLimits | None,
                  ) -> list[dict[str, Any]] | None:
    """`tools` (OpenAI's function tools) within the tool limits: their count, and each
    one's parameters as a schema (a 400 past them)."""
    if tools:
        try:
            check_tools([(t.get("function") or {}).get("parameters") or {} for t in tools],
                        GrammarLimits() if limits is None else limits)
        except ColibriError as exc:
            raise ApiError(400, str(exc), param="tools") from exc
    return tools


def chat_plan(model: Model, template: ChatTemplate, req: ChatCompletionRequest,
              tool_template: ChatTemplate | None = None,
              limits: GrammarLimits | None = None,
              prompt_limits: PromptLimits | None = None) -> Plan:
    """The Plan of a chat request, rendered with :func:`pick_template`'s choice of
    `template` and `tool_template`: its size within `prompt_limits` (checked before anything
    is rendered), its tools and response format within `limits`."""
    if req.audio is not None or req.modalities not in (None, ["text"]):
        raise _refuse("audio", "colibri generates text only")
    if req.prediction is not None:
        raise _refuse("prediction", "predicted outputs are not implemented")
    tools = checked_tools([t.model_dump(exclude_none=True) for t in req.tools]
                          if req.tools else None, limits)
    choice = req.tool_choice
    if tools is None and choice not in (None, "none", "auto"):
        raise ApiError(400, "tool_choice needs tools", param="tool_choice")
    if choice == "none":
        tools = None  # the template then shows no tools and nothing is parsed
    messages = chat_messages(req.messages)
    check_conversation(model, prompt_limits or PromptLimits(), messages, tools)
    template = pick_template(template, tool_template, messages, tools)
    fmt = template_format(template.source) if tools is not None else None
    response_format: Any = None
    if req.response_format is not None and req.response_format.type != "text":
        response_format = req.response_format.model_dump(by_alias=True, exclude_none=True)
    if tools is not None and choice not in (None, "auto"):
        if fmt not in FORCED_FORMATS:
            raise ApiError(400, "tool_choice 'required' or a named function needs a chat "
                                "template whose tool-call format colibri parses (docs/serving.md, "
                                "Tool calls); this one's is not",
                           param="tool_choice")
        if response_format is not None:
            raise ApiError(400, "response_format cannot be combined with a forced tool_choice",
                           param="response_format")
        only = None if choice == "required" else choice.function.name  # type: ignore[union-attr]
        response_format = forced_call_grammar(tools, only, fmt, limits)
    variables = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort is not None:
        variables["reasoning_effort"] = req.reasoning_effort
    ids = render_chat(model, template, messages, tools, variables)
    k = (req.top_logprobs or 0) if req.logprobs else None
    if req.top_logprobs and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    s = sampling(req, logprobs=req.logprobs, top_logprobs=k or 0)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None \
        else req.max_tokens
    p = plan(model, req, ids, s, max_tokens=max_tokens, response_format=response_format,
             logprobs=k, tool_format=fmt, tools=tools, limits=limits,
             reasoning_budget=req.reasoning_budget)
    p.reasoning = reasoning_mode(model, template, ids)
    return p
