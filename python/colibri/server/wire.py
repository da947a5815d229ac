"""The request bodies the server accepts, as pydantic models (the wire types).

Fields the APIs define and that colibri serves are typed and range-checked here, so a bad
value is a 400 naming the field before any work starts. Fields the APIs define that do
not change what is generated (``user``, ``metadata``, ``store``, ``service_tier``...)
are accepted and ignored (``extra="ignore"``); the few that would change the result and
are not served (``echo``, ``best_of`` > 1, ``suffix``, ``audio``...) are refused in
:mod:`colibri.server.options` with a message naming them. docs/serving.md lists both.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from .wire_checks import check_anthropic_blocks, check_body, check_tool_calls

MAX_LOGIT_BIAS = 4096
"""Most ``logit_bias`` entries one request may send (a banned-token list of hundreds fits)."""

MAX_TEMPLATE_KWARGS_CHARS = 4096
"""Most characters ``chat_template_kwargs`` may take as JSON (``{"enable_thinking": false}``
and the like are a few dozen)."""

# Names the server itself gives the template: a request's kwargs may not replace them.
_RESERVED_TEMPLATE_NAMES = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                                      "bos_token", "eos_token"})


def check_template_kwargs(v: dict[str, Any] | None) -> dict[str, Any] | None:
    """``chat_template_kwargs``: a JSON object of at most MAX_TEMPLATE_KWARGS_CHARS whose
    keys are not the server's own template variables."""
    if v is None:
        return v
    if len(json.dumps(v, ensure_ascii=False)) > MAX_TEMPLATE_KWARGS_CHARS:
        raise ValueError(f"chat_template_kwargs: at most {MAX_TEMPLATE_KWARGS_CHARS} "
                         "characters of JSON")
    clash = sorted(_RESERVED_TEMPLATE_NAMES & v.keys())
    if clash:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(clash)} (the server "
                         "passes those itself)")
    return v

class Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# --- OpenAI -----------------------------------------------------------------------------


class StreamOptions(Wire):
    include_usage: bool = False


class FunctionDef(Wire):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Wire):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(Wire):
    name: str


class NamedToolChoice(Wire):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatMessage(Wire):
    # Tool calls, names and tool_call_id pass through to the chat template as they are.
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("tool_calls")
    @classmethod
    def _tool_calls(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return check_tool_calls(v)


class JsonSchemaSpec(Wire):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Wire):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class SamplingFields(Wire):
    """What chat and legacy completions share. Counts are strict integers (``true`` is
    not 1)."""

    model: str
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = Field(default=None, ge=0, strict=True)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, strict=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=0, strict=True)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=MAX_LOGIT_BIAS)
    # Not OpenAI's, but vLLM's and llama.cpp's names for colibri's other Sampling fields.
    top_k: int | None = Field(default=None, ge=0, strict=True)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, ge=1e-3, le=1e3)
    min_tokens: int | None = Field(default=None, ge=0, strict=True)
    # transformers' name: seconds after which no further token is generated (finish
    # "length"); the request's own limit below --request-timeout's (docs/serving.md).
    max_time: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _body(cls, data: Any) -> Any:
        return check_body(data)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0, strict=True)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's name: further variables for the chat template ({"enable_thinking": false}).
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's reasoning control, passed to the template as the variable gpt-oss's reads
    # (other templates ignore it); colibri's cap on reasoning tokens (docs/serving.md).
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    reasoning_budget: int | None = Field(default=None, ge=0, strict=True)
    # Refused when set (options.refuse_unsupported): they would change the answer.
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_template_kwargs(v)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20, strict=True)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, strict=True)
    suffix: str | None = None

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _token_ids(cls, v: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # A token-id prompt is returned as it is: the union would give the same list (as
        # `list[int]`), but it tries each member first and `list[str]` builds an error per
        # item (2.7 million ids, an 8 MiB body, held the event loop 0.5-2 s). A list whose
        # first item is an int holds only ints here: check_body, which runs before the
        # fields, refuses it otherwise.
        if type(v) is list and v and type(v[0]) is int:
            return v
        return handler(v)


# --- Anthropic --------------------------------------------------------------------------


class AnthropicMessage(Wire):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]

    @field_validator("content")
    @classmethod
    def _blocks(cls, v: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        return check_anthropic_blocks(v)  # type: ignore[no-any-return]


class AnthropicTool(Wire):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class AnthropicThinking(Wire):
    """``thinking``: reasoning on or off (the template's ``enable_thinking``), and when on
    at most ``budget_tokens`` of it (colibri.generate.reasoning_budget; docs/serving.md,
    Reasoning)."""

    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=1, strict=True)


class CountTokensRequest(Wire):
    """``POST /v1/messages/count_tokens``: what the prompt of a message request takes."""

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: AnthropicThinking | None = None

    @model_validator(mode="before")
    @classmethod
    def _body(cls, data: Any) -> Any:
        return check_body(data)

    @field_validator("system")
    @classmethod
    def _system(cls, v: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        return check_anthropic_blocks(v, "system")  # type: ignore[no-any-return]


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, strict=True)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    max_time: float | None = Field(default=None, gt=0, allow_inf_nan=False)  # as on OpenAI's
