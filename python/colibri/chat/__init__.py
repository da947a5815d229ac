"""Chat templates: sandboxed Jinja rendering (template), its resource limits (limits,
budget, prechecks, deadline), conversations as messages (messages) and fitting a prompt
into the context under truncate=True (fit)."""

from .fit import FittedPrompt
from .template import CHATML_TEMPLATE, ChatTemplate, apply_chat_template, validate_messages

__all__ = ["CHATML_TEMPLATE", "ChatTemplate", "FittedPrompt", "apply_chat_template",
           "validate_messages"]
