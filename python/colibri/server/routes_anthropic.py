"""Anthropic's Messages API: ``POST /v1/messages``, streamed or not (docs/serving.md).

The conversation (``system``, text blocks, ``tool_use`` / ``tool_result`` blocks) is
turned into the chat-template conversation OpenAI's route uses, and goes through the same
scheduler. Stop reasons: ``end_turn`` (the model's end-of-turn token), ``stop_sequence``
(with the sequence that matched), ``max_tokens``, ``tool_use``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..errors import ColibriError
from .errors import ApiError, from_colibri
from .options import Plan, checked_tools, pick_template, plan, render_chat, sampling
from .prompt_size import check_conversation
from .reasoning import (
    reasoning_mode,
    reasoning_splitter,
    split_output,
    thinking_budget,
    thinking_variables,
)
from .runner import answer, new_id, run_sample
from .scheduler import Ticket
from .sse import DeferredJSON, EventStream, event
from .state import ServerState, state
from .tools import (
    FORCED_FORMATS,
    CallSplitter,
    ToolCall,
    forced_call_grammar,
    split_answer,
    template_format,
)
from .wire import CountTokensRequest, MessagesRequest, SamplingFields

router = APIRouter()


def _text(blocks: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    out = []
    for b in blocks:
        if b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise ApiError(400, f"{where}: expected text blocks, got {b.get('type')!r}")
        out.append(b["text"])
    return "".join(out)


def _conversation(req: CountTokensRequest) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if req.system:
        msgs.append({"role": "system", "content": _text(req.system, "system")})
    for i, m in enumerate(req.messages):
        if isinstance(m.content, str):
            msgs.append({"role": m.role, "content": m.content})
            continue
        texts, calls, thoughts = [], [], []
        for b in m.content:
            kind = b.get("type")
            if kind == "text":
                texts.append(str(b.get("text", "")))
            elif kind == "thinking" and m.role == "assistant":
                # Sent back as the message's reasoning_content: the templates that keep
                # past reasoning (Qwen3, GLM, MiniMax...) read it there, the others drop it.
                thoughts.append(str(b.get("thinking", "")))
            elif kind == "redacted_thinking" and m.role == "assistant":
                continue  # colibri never writes these; there is no text to render
            elif kind == "tool_use" and m.role == "assistant":
                calls.append({"id": b.get("id"), "type": "function",
                              "function": {"name": b.get("name"),
                                           "arguments": b.get("input", {})}})
            elif kind == "tool_result" and m.role == "user":
                content = b.get("content", "")
                msgs.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                             "content": content if isinstance(content, str)
                             else _text(content, f"messages[{i}] tool_result")})
            else:
                raise ApiError(400, f"messages[{i}]: content blocks of type {kind!r} are not "
                                    "supported (text, tool_use, tool_result, and thinking "
                                    "in an assistant's message are)", param="messages")
        if texts or calls or thoughts:
            msg: dict[str, Any] = {"role": m.role, "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            if thoughts:
                msg["reasoning_content"] = "".join(thoughts)
            msgs.append(msg)
    return msgs


def _tools(req: CountTokensRequest) -> list[dict[str, Any]] | None:
    """The tools as OpenAI's function definitions (what the chat templates take); None
    when there are none or tool_choice is "none"."""
    if not req.tools or (req.tool_choice or {}).get("type") == "none":
        return None
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.input_schema}}
            for t in req.tools]


def _plan(st: ServerState, req: MessagesRequest) -> Plan:
    tools = checked_tools(_tools(req), st.grammar_limits)
    choice = (req.tool_choice or {}).get("type", "auto")
    messages = _conversation(req)
    check_conversation(st.model, st.prompt_limits, messages, tools)
    template = pick_template(st.template, st.tool_template, messages, tools)
    fmt = template_format(template.source) if tools is not None else None
    forced = None
    if tools is not None and choice in ("any", "tool"):
        if fmt not in FORCED_FORMATS:
            raise ApiError(400, "tool_choice 'any' or 'tool' needs a chat template whose "
                                "tool-call format colibri parses (docs/serving.md, Tool "
                                "calls); this one's is not")
        forced = forced_call_grammar(tools, (req.tool_choice or {}).get("name")
                                     if choice == "tool" else None, fmt, st.grammar_limits)
    ids = render_chat(st.model, template, messages, tools, thinking_variables(req.thinking))
    fields = SamplingFields(model=req.model, temperature=req.temperature, top_p=req.top_p,
                            top_k=req.top_k, stop=req.stop_sequences, max_tokens=req.max_tokens,
                            max_time=req.max_time)
    p = plan(st.model, fields, ids, sampling(fields), max_tokens=req.max_tokens,
             response_format=forced, tool_format=fmt, tools=tools, limits=st.grammar_limits,
             reasoning_budget=thinking_budget(req.thinking, req.max_tokens))
    p.reasoning = reasoning_mode(st.model, template, ids)
    return p


def _stop(st: ServerState, p: Plan, token_ids: list[int], text: str,
          finish: str) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence)."""
    if finish == "length":
        return "max_tokens", None
    tok = st.model.tokenizer
    if token_ids and token_ids[-1] in tok.eos_ids:
        return "end_turn", None
    full = tok.decode(token_ids)
    found = [(full.find(s, max(0, len(text) - len(s))), s) for s in p.stop]
    found = [(at, s) for at, s in found if at >= 0]
    if found:
        return "stop_sequence", min(found)[1]
    return "end_turn", None  # a complete constrained text


def _usage(p: Plan, output: int) -> dict[str, int]:
    return {"input_tokens": len(p.prompt_ids), "output_tokens": output}


@router.post("/v1/messages")
async def messages(req: MessagesRequest, request: Request) -> Response:
    st = state(request)
    st.check_model(req.model)
    p = await asyncio.to_thread(_plan, st, req)  # off the loop (routes_openai.chat_completions)
    ticket = st.scheduler.admit(positions=p.positions)
    if req.stream:
        return EventStream(_events(st, p, ticket), on_close=ticket.release)
    return DeferredJSON(lambda: answer(_body(st, p, ticket), anthropic=True),
                        on_close=ticket.release)


@router.post("/v1/messages/count_tokens")
async def count_tokens(req: CountTokensRequest, request: Request) -> dict[str, int]:
    """The prompt's tokens as /v1/messages would prefill them (nothing is generated)."""
    st = state(request)
    st.check_model(req.model)
    def count() -> int:
        messages, tools = _conversation(req), _tools(req)
        check_conversation(st.model, st.prompt_limits, messages, tools)
        template = pick_template(st.template, st.tool_template, messages, tools)
        return len(render_chat(st.model, template, messages, tools,
                               thinking_variables(req.thinking)))

    return {"input_tokens": await asyncio.to_thread(count)}


# Anthropic signs its thinking blocks so they can be checked when sent back; colibri has
# nothing to sign with and checks nothing: the field is there, empty (docs/serving.md).
SIGNATURE = ""


def _blocks(reasoning: str, text: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = ([{"type": "thinking", "thinking": reasoning,
                                      "signature": SIGNATURE}] if reasoning else [])
    if text or not calls:
        blocks.append({"type": "text", "text": text})
    return blocks + [c.anthropic() for c in calls]


async def _body(st: ServerState, p: Plan, ticket: Ticket) -> dict[str, Any]:
    async with ticket:
        s = await run_sample(ticket, p, 0)
    reason, seq = _stop(st, p, s.token_ids, s.text, s.finish_reason)
    reasoning, text = split_output(p, s.text)
    text, calls, dropped = (split_answer(text, p.tool_format, p.tools, "toolu_",
                                         cut=s.finish_reason == "length")
                            if p.tool_format is not None else (text, [], False))
    if calls and not dropped:  # a call max_tokens cut is dropped: stop_reason max_tokens
        reason, seq = "tool_use", None
    return {"id": new_id("msg_"), "type": "message", "role": "assistant",
            "model": st.model_name, "content": _blocks(reasoning, text, calls),
            "stop_reason": reason, "stop_sequence": seq, "usage": _usage(p, len(s.token_ids))}


def _thinking_delta(index: int, reasoning: str, started: bool) -> list[str]:
    """A thinking block's delta, after its start when it is the first."""
    start = [] if started else [event("content_block_start", {
        "type": "content_block_start", "index": index,
        "content_block": {"type": "thinking", "thinking": "", "signature": ""}})]
    return [*start, event("content_block_delta", {
        "type": "content_block_delta", "index": index,
        "delta": {"type": "thinking_delta", "thinking": reasoning}})]


def _thinking_stop(index: int) -> str:
    """A thinking block's end: its (empty, see SIGNATURE) signature, then its stop."""
    return (event("content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "signature_delta",
                                                    "signature": SIGNATURE}})
            + event("content_block_stop", {"type": "content_block_stop", "index": index}))


async def _events(st: ServerState, p: Plan, ticket: Ticket) -> AsyncIterator[str]:
    yield event("message_start", {"type": "message_start", "message": {
        "id": new_id("msg_"), "type": "message", "role": "assistant", "model": st.model_name,
        "content": [], "stop_reason": None, "stop_sequence": None, "usage": _usage(p, 0)}})
    pieces: list[str] = []
    token_ids: list[int] = []
    finish = "length"
    splitter = (CallSplitter(p.tool_format, p.tools) if p.tool_format is not None
                else None)
    thinking = reasoning_splitter(p)
    index, open_text, open_thinking = 0, False, False
    try:
        async with ticket:
            async for chunk in ticket.stream(p.prompt_ids, p.sample_options(0)):
                if chunk.token_id is not None:
                    token_ids.append(chunk.token_id)
                if chunk.finish_reason is not None:
                    finish = chunk.finish_reason
                pieces.append(chunk.text)
                reasoning, text = (thinking.feed(chunk.text) if thinking is not None
                                   else ("", chunk.text))
                if reasoning:
                    for e in _thinking_delta(index, reasoning, open_thinking):
                        yield e
                    open_thinking = True
                text = splitter.feed(text) if splitter is not None else text
                if text and open_thinking:
                    yield _thinking_stop(index)
                    index, open_thinking = index + 1, False
                if text:
                    if not open_text:
                        yield event("content_block_start", {
                            "type": "content_block_start", "index": index,
                            "content_block": {"type": "text", "text": ""}})
                        open_text = True
                    yield event("content_block_delta", {
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "text_delta", "text": text}})
    except (ApiError, ColibriError) as exc:
        yield event("error", from_colibri(exc).anthropic_body())
        return
    held_reasoning, held = thinking.finish() if thinking is not None else ("", "")
    if held_reasoning:
        for e in _thinking_delta(index, held_reasoning, open_thinking):
            yield e
        open_thinking = True
    if open_thinking:
        yield _thinking_stop(index)
        index += 1
    held = splitter.feed(held) if splitter is not None else held
    rest, calls = (splitter.finish("toolu_", cut=finish == "length") if splitter is not None
                   else ("", []))
    rest = held + rest
    if rest or (not open_text and not calls):
        if not open_text:
            yield event("content_block_start", {"type": "content_block_start", "index": index,
                                                "content_block": {"type": "text", "text": ""}})
            open_text = True
        if rest:
            yield event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": "text_delta", "text": rest}})
    if open_text:
        yield event("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    for c in calls:
        yield event("content_block_start", {"type": "content_block_start", "index": index,
                                            "content_block": {"type": "tool_use", "id": c.id,
                                                              "name": c.name, "input": {}}})
        yield event("content_block_delta", {
            "type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": json.dumps(c.arguments)}})
        yield event("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    reason, seq = _stop(st, p, token_ids, "".join(pieces), finish)
    if calls and not (splitter is not None and splitter.dropped):
        reason, seq = "tool_use", None
    yield event("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": reason, "stop_sequence": seq},
                                  "usage": {"output_tokens": len(token_ids)}})
    yield event("message_stop", {"type": "message_stop"})
