"""``create_app(model, ...)``: the ASGI application (FastAPI) serving one loaded model.

Routes: OpenAI's (routes_openai), Anthropic's (routes_anthropic), ``/health`` and
``/metrics`` (here). Every ``/v1`` route needs the API key when one is set; ``/health``
and ``/metrics`` do not (a load balancer and a scraper can reach them). Errors come back
in the caller's API's shape (errors.py), including FastAPI's own: a body that fails
validation is a 400 naming the field, an unknown route a 404.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..chat.template import ChatTemplate
from ..chat.tool_templates import template_for_tools
from ..generate.grammar_limits import GrammarLimits
from ..generate.structured import prepare as prepare_grammars
from ..model import Model
from . import routes_anthropic, routes_openai
from .body_limit import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_BODY_BYTES, LimitBody
from .errors import ApiError
from .memory import slot_kv_budget
from .metrics import Metrics, render
from .prompt_size import PromptLimits
from .scheduler import Scheduler
from .state import ServerState, state

_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/models",
           "/health", "/metrics")


def _anthropic(request: Request) -> bool:
    return request.url.path.startswith("/v1/messages")


def _error(request: Request, err: ApiError) -> JSONResponse:
    body = err.anthropic_body() if _anthropic(request) else err.openai_body()
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    if not errs:
        return "the request body is not valid", None
    first = errs[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    return (f"{param}: {msg}" if param else f"the request body is not valid: {msg}"), param


class _CountRequests:
    """ASGI middleware: counts each answered request by route and status (a streamed
    answer's status is its first line, 200, whatever happens later)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = next((r for r in _ROUTES if path == r or path.startswith(r + "/")), "other")

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.count_request(route, int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)


def create_app(
    model: Model,
    *,
    model_name: str | None = None,
    aliases: Sequence[str] = (),
    api_key: str | None = None,
    chat_template: str | None = None,
    max_queue: int = 16,
    max_running: int = 4,
    timeout: float | None = 600.0,
    retry_after: int = 1,
    close_model: bool = False,
    drain_timeout: float = 30.0,
    kv_budget: int | None = None,
    prefix_sharing: bool = True,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_timeout: float | None = DEFAULT_BODY_TIMEOUT,
    prompt_limits: PromptLimits | None = None,
    special_tokens_in_content: bool = False,
    grammar_limits: GrammarLimits | None = None,
) -> FastAPI:
    """The server for `model`, served as `model_name` (default ``model.name``; requests
    may also name it by one of `aliases`).

    ``api_key``: required from clients when set. ``chat_template``: Jinja source replacing
    the model's own template (e.g. one that renders tools; a request with tools to a
    ChatML template that renders none is rendered with colibri's own tool template,
    colibri.chat.tool_templates). ``max_running``: requests
    generating at once, batched into shared forwards (continuous batching,
    docs/serving.md); ``max_queue``: requests that may wait for a slot beyond them; more
    get 429 with ``Retry-After: retry_after``. ``kv_budget``: bytes of KV state the
    running requests may reserve (default: what the RAM budget holds beside the expert
    cache; more is taken from the expert cache: colibri.server.memory); a request whose
    reservation does not fit waits in the queue. ``prefix_sharing``: with the prompt cache
    on (``EngineConfig.prompt_cache``), requests running at the same time share their
    common prompt prefix (prefilled once: colibri.generate.prefix_share). ``timeout``:
    seconds a request may take, queue wait included (None: no limit). ``max_body_bytes``:
    larger request bodies get 413 before they are read whole; ``body_timeout``: seconds the
    body may take to arrive, else 408 (None: no limit; server/body_limit.py).
    ``prompt_limits``: the message count and text length checked before a prompt is rendered
    or tokenized (server/prompt_size.py). ``grammar_limits``: what a request's response
    format and tools may hold (default
    :class:`~colibri.generate.grammar_limits.GrammarLimits`'s; past them, a 400).
    ``special_tokens_in_content`` (sets ``model.special_tokens_in_content``; trusted
    clients only): control-token text in messages and tools is matched as control tokens
    instead of encoded as plain text (docs/serving.md). At
    shutdown new
    requests get 503, running
    and queued ones finish (up to ``drain_timeout`` s), and the model is closed if
    ``close_model``."""
    metrics = Metrics()
    scheduler = Scheduler(model, metrics, max_queue=max_queue, max_running=max_running,
                          timeout=timeout, retry_after=retry_after)
    scheduler.kv_budget = slot_kv_budget(model, max_running, kv_budget)
    model.prompt_cache.share_running = prefix_sharing
    model.special_tokens_in_content = special_tokens_in_content
    template = (ChatTemplate(chat_template, bos_token=model.tokenizer.bos_token,
                             eos_token=model.tokenizer.eos_token, name="--chat-template")
                if chat_template is not None else model.chat_template)
    st = ServerState(model, scheduler, template, model_name or model.name, api_key, metrics,
                     aliases=frozenset(aliases), tool_template=template_for_tools(template),
                     prompt_limits=prompt_limits or PromptLimits(),
                     grammar_limits=grammar_limits or GrammarLimits())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Before serving: built at the first request with a grammar, it stalled the loop.
        await asyncio.to_thread(prepare_grammars, model.tokenizer, model.config.vocab_size)
        async with metrics.loop.running():  # the stall monitor (server/loop_monitor.py)
            yield
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(scheduler.drain(), drain_timeout)
        scheduler.close()
        if close_model:
            model.close()

    app = FastAPI(title="colibri", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.colibri = st

    def require_key(request: Request) -> None:
        state(request).check_key(request)

    for router in (routes_openai.router, routes_anthropic.router):
        app.include_router(router, dependencies=[Depends(require_key)])

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "draining" if scheduler.draining else "ok",
                "model": st.model_name, "running": scheduler.running,
                "queued": scheduler.waiting}

    @app.get("/metrics")
    async def prometheus() -> Response:
        # In a thread: the model's counters wait for the engine between two forwards.
        text = await asyncio.to_thread(render, metrics, scheduler, model)
        return PlainTextResponse(text,
                                 media_type="text/plain; version=0.0.4")

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _error(request, exc)

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return _error(request, ApiError(400, message, param=param))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = (f"no route {request.method} {request.url.path}" if exc.status_code == 404
                   else str(exc.detail))
        return _error(request, ApiError(exc.status_code, message))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        return _error(request, ApiError(500, f"internal error ({type(exc).__name__}: {exc})",
                                        code="internal_error"))

    app.add_middleware(LimitBody, max_bytes=max_body_bytes, timeout=body_timeout)
    app.add_middleware(_CountRequests, metrics=metrics)
    return app
