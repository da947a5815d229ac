"""colibri's HTTP server: OpenAI's and Anthropic's APIs over one loaded model
(docs/serving.md). ``colibri serve MODEL`` runs it; ``create_app(model)`` gives the ASGI
application to run under any ASGI server. It runs on FastAPI and uvicorn, which colibri's
install includes."""

from __future__ import annotations

from .app import create_app
from .scheduler import Scheduler, Ticket

__all__ = ["Scheduler", "Ticket", "create_app"]
