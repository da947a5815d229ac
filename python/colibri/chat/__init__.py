"""Chat templates: sandboxed Jinja rendering (template), its resource limits (limits,
budget, prechecks, deadline) and conversations as messages (messages)."""

from .template import CHATML_TEMPLATE, ChatTemplate, apply_chat_template, validate_messages

__all__ = ["CHATML_TEMPLATE", "ChatTemplate", "apply_chat_template", "validate_messages"]
