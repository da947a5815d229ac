"""Errors as the clients expect them: OpenAI's ``{"error": {"message", "type", "param",
"code"}}`` or Anthropic's ``{"type": "error", "error": {"type", "message"}}`` (for
``/v1/messages``), with the status codes both APIs use.

Status codes (the error type in OpenAI's / Anthropic's shape):

- 400 invalid_request_error: a bad or unsupported parameter, a prompt too long for the
  context;
- 401 authentication_error: a missing or wrong API key;
- 404 not_found_error: an unknown model or route;
- 408 timeout_error: the request ran past its timeout (queue wait included);
- 429 rate_limit_error: the queue is full (``Retry-After`` says when to retry);
- 503 overloaded_error: the server is shutting down (``Retry-After``);
- 500 server_error / api_error: the model failed (a read error, non-finite logits...).
"""

from __future__ import annotations

from typing import Any

from ..errors import (
    ColibriError,
    ConfigError,
    ContextOverflowError,
    InvalidRequestError,
    TokenOutOfRangeError,
    UnsupportedError,
)

_OPENAI_TYPE = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 408: "timeout_error", 413: "invalid_request_error",
                429: "rate_limit_error", 503: "overloaded_error"}
_ANTHROPIC_TYPE = {400: "invalid_request_error", 401: "authentication_error",
                   404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                   429: "rate_limit_error", 503: "overloaded_error"}


def _fallback(status: int, server_type: str) -> str:
    """The type of a status the tables do not name: any other 4xx (405 for a wrong method,
    415...) is the request's fault, never the server's."""
    return "invalid_request_error" if 400 <= status < 500 else server_type


class ApiError(Exception):
    """An error answered to the client: a status, a message, and optionally the parameter
    at fault, a machine-readable code and extra headers (``Retry-After``)."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def openai_body(self) -> dict[str, Any]:
        return {"error": {"message": self.message,
                          "type": _OPENAI_TYPE.get(self.status, _fallback(self.status,
                                                                          "server_error")),
                          "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {
            "type": _ANTHROPIC_TYPE.get(self.status, _fallback(self.status, "api_error")),
            "message": self.message}}


class QueueFull(ApiError):
    def __init__(self, depth: int, retry_after: int) -> None:
        super().__init__(429, f"the server's queue is full ({depth} requests waiting); retry "
                              f"after {retry_after} s", code="queue_full",
                         headers={"Retry-After": str(retry_after)})


class ShuttingDown(ApiError):
    def __init__(self, retry_after: int) -> None:
        super().__init__(503, "the server is shutting down and takes no new requests",
                         code="shutting_down", headers={"Retry-After": str(retry_after)})


class RequestTimeout(ApiError):
    def __init__(self, seconds: float) -> None:
        super().__init__(408, f"the request ran past its timeout of {seconds:g} s (time in "
                              "the queue included); its generation was cancelled",
                         code="timeout")


def from_colibri(exc: BaseException) -> ApiError:
    """The ApiError for an exception raised while preparing or running a generation: the
    request's fault (400) for bad arguments and prompts that do not fit, the model's (500)
    for anything else."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), code="context_length_exceeded")
    if isinstance(exc, (InvalidRequestError, ConfigError, TokenOutOfRangeError,
                        UnsupportedError)):
        return ApiError(400, str(exc))
    if isinstance(exc, ColibriError):
        return ApiError(500, f"the model failed: {exc}", code="model_error")
    return ApiError(500, f"internal error ({type(exc).__name__}: {exc})", code="internal_error")
