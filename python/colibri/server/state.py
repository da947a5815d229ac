"""What the routes share: the model, its scheduler, the chat templates in use (plain and
with tools), the served name and the API key (``request.app.state.colibri``)."""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field

from fastapi import Request

from ..chat.template import ChatTemplate
from ..generate.grammar_limits import GrammarLimits
from ..model import Model
from .errors import ApiError
from .metrics import Metrics
from .prompt_size import PromptLimits
from .scheduler import Scheduler


@dataclass
class ServerState:
    model: Model
    scheduler: Scheduler
    template: ChatTemplate
    model_name: str
    api_key: str | None = None
    metrics: Metrics = field(default_factory=Metrics)
    created: int = field(default_factory=lambda: int(time.time()))
    aliases: frozenset[str] = frozenset()  # other names clients may send (not listed)
    # What conversations with tools are rendered with (options.pick_template): `template`
    # when it renders tools, else colibri's shipped one for its family, else None.
    tool_template: ChatTemplate | None = None
    prompt_limits: PromptLimits = field(default_factory=PromptLimits)
    # What a request's structured output and tools may hold (docs/serving.md, Limits).
    grammar_limits: GrammarLimits = field(default_factory=GrammarLimits)

    def check_model(self, name: str) -> None:
        """404 for a model this server does not serve."""
        if name != self.model_name and name not in self.aliases:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves "
                                f"{self.model_name!r} (GET /v1/models)", param="model",
                           code="model_not_found")

    def check_key(self, request: Request) -> None:
        """401 unless the request carries the API key (``Authorization: Bearer KEY``, as
        OpenAI's clients send it, or ``x-api-key: KEY``, as Anthropic's do)."""
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else \
            request.headers.get("x-api-key", "")
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise ApiError(401, "invalid or missing API key: send 'Authorization: Bearer KEY' "
                                "or 'x-api-key: KEY'", code="invalid_api_key")


def state(request: Request) -> ServerState:
    st: ServerState = request.app.state.colibri
    return st
