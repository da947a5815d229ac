"""What the ingress hands Ray's router for one HTTP request (no Ray import).

Ray Serve's PrefixCacheAffinityRouter routes on the text of the request's first argument
that has a ``prompt`` (or ``messages``) attribute: it keeps a prefix tree of the texts
each replica was sent and sends a request whose text extends one of them (by at least
``match_rate_threshold`` of its length) back to that replica. A chat's next turn repeats
the earlier messages, so its text extends the previous turn's and it returns to the
replica holding that conversation's KV state (``--prompt-cache``).

``routing_text`` is that text: the system prompt and the messages' text contents joined
in order (the role names are left out: every chat would otherwise share a prefix and
look alike), the prompt of a completion. It is never empty (Ray's router divides by its
length)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any


@dataclasses.dataclass
class ForwardedRequest:
    """One HTTP request as the ingress passes it to a replica through its
    DeploymentHandle (picklable); ``prompt`` is the routing text."""

    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    prompt: str


def _text(value: Any) -> str:
    """The text of a message ``content``: a string, a list of parts / blocks (their
    ``text`` fields, a tool result's content), anything else contributes nothing."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(part) for part in value)
    if isinstance(value, dict):
        if isinstance(value.get("text"), str):
            return str(value["text"])
        if "content" in value:
            return _text(value["content"])
        if value.get("type") == "tool_use":
            return json.dumps(value.get("input"), sort_keys=True)
    return ""


def _messages_text(body: dict[str, Any]) -> str:
    parts = [_text(body.get("system"))]
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                parts.append(_text(m.get("content")))
                for call in m.get("tool_calls") or ():
                    if isinstance(call, dict) and isinstance(call.get("function"), dict):
                        parts.append(str(call["function"].get("arguments", "")))
    return "".join(parts)


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        if all(isinstance(t, int) for t in prompt):  # token ids
            return " ".join(str(t) for t in prompt)
        if len(prompt) == 1:
            return _prompt_text(prompt[0])
    return ""


def routing_text(method: str, path: str, body: bytes) -> str:
    """The text Ray's prefix router matches for this request (see the module doc)."""
    text = ""
    if method == "POST" and body:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            data = None
        if isinstance(data, dict):
            if "messages" in data:
                text = _messages_text(data)
            elif "prompt" in data:
                text = _prompt_text(data["prompt"])
    # Requests without text (GET /v1/models, /health, a bad body) still need one: a
    # marker no prompt starts with, so they never pull a chat towards a replica.
    return text or f"\x00{method} {path}"
