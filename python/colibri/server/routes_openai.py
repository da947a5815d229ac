"""OpenAI's API: ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``
(docs/serving.md lists every parameter served and not)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..errors import ColibriError
from .errors import ApiError
from .options import Plan, chat_plan, plan, sampling
from .prompt_size import check_chars
from .reasoning import reasoning_splitter, split_output
from .runner import (
    answer,
    chat_logprob,
    error_frame,
    legacy_logprobs,
    new_id,
    now,
    run_sample,
    usage,
)
from .scheduler import Ticket
from .sse import DONE, DeferredJSON, EventStream, data
from .state import ServerState, state
from .tool_stream import CallArgs, CallStart, StreamEvent, ToolStream
from .tools import split_answer
from .wire import ChatCompletionRequest, CompletionRequest

router = APIRouter()


def _model_card(st: ServerState) -> dict[str, Any]:
    return {"id": st.model_name, "object": "model", "created": st.created,
            "owned_by": "colibri", "context_length": st.model.context_length}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(state(request))]}


@router.get("/v1/models/{name:path}")
async def get_model(name: str, request: Request) -> dict[str, Any]:
    st = state(request)
    st.check_model(name)
    return _model_card(st)


def _respond(ticket: Ticket, stream: bool, frames: AsyncIterator[str] | None,
             work: Any) -> Response:
    if stream:
        assert frames is not None
        return EventStream(frames, on_close=ticket.release)
    return DeferredJSON(lambda: answer(work()), on_close=ticket.release)


# --- chat -------------------------------------------------------------------------------


@router.post("/v1/chat/completions")
async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
    st = state(request)
    st.check_model(req.model)
    # Off the event loop: rendering, tokenizing and compiling a grammar cost time that
    # grows with the request (issue 35); /health and other clients keep being answered.
    p = await asyncio.to_thread(chat_plan, st.model, st.template, req, st.tool_template,
                                st.grammar_limits, st.prompt_limits)
    ticket = st.scheduler.admit(positions=p.positions)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    frames = _chat_frames(st, p, ticket, include_usage) if req.stream else None
    return _respond(ticket, req.stream, frames, lambda: _chat_body(st, p, ticket))


def _message(p: Plan, text: str, finish: str) -> tuple[dict[str, Any], str]:
    """The assistant's message and finish reason: reasoning goes to ``reasoning_content``
    (server/reasoning.py); calls parsed out of the answer to ``tool_calls`` (finish
    "tool_calls"); a call max_tokens cut is dropped, and the finish stays "length"
    (tools.split_answer)."""
    reasoning, text = split_output(p, text)
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if p.tool_format is not None:
        content, calls, dropped = split_answer(text, p.tool_format, p.tools, "call_",
                                               cut=finish == "length")
        if calls or dropped:
            msg["content"] = content or None
        if calls:
            msg["tool_calls"] = [c.openai() for c in calls]
            finish = "length" if dropped else "tool_calls"
    return msg, finish


async def _chat_body(st: ServerState, p: Plan, ticket: Ticket) -> dict[str, Any]:
    choices, completion = [], 0
    tok = st.model.tokenizer
    async with ticket:
        for i in range(p.n):
            s = await run_sample(ticket, p, i)
            completion += len(s.token_ids)
            msg, finish = _message(p, s.text, s.finish_reason)
            lps = ({"content": [chat_logprob(lp, tok) for lp in s.logprobs]}
                   if p.logprobs is not None else None)
            choices.append({"index": i, "message": msg, "logprobs": lps,
                            "finish_reason": finish})
    return {"id": new_id("chatcmpl-"), "object": "chat.completion", "created": now(),
            "model": st.model_name, "choices": choices, "system_fingerprint": None,
            "usage": usage(len(p.prompt_ids), completion)}


def _event_frames(events: list[StreamEvent], lps: Any,
                  ) -> list[tuple[dict[str, Any], None, Any]]:
    """A chunk's deltas (delta, finish, logprobs): its text (with the logprobs, sent even
    without text), then its tool-call deltas: a call's first carries its index, id, type
    and name, the next ones fragments of its arguments (colibri.server.tool_stream)."""
    text = "".join(e for e in events if isinstance(e, str))
    out: list[tuple[dict[str, Any], None, Any]] = []
    if text or lps is not None:
        out.append(({"content": text}, None, lps))
    for e in events:
        if isinstance(e, CallStart):
            out.append(({"tool_calls": [{"index": e.index, "id": e.id, "type": "function",
                                         "function": {"name": e.name, "arguments": ""}}]},
                        None, None))
        elif isinstance(e, CallArgs):
            out.append(({"tool_calls": [{"index": e.index, "function": {"arguments": e.text}}]},
                        None, None))
    return out


async def _chat_frames(st: ServerState, p: Plan, ticket: Ticket,
                       include_usage: bool) -> AsyncIterator[str]:
    cid, created, tok = new_id("chatcmpl-"), now(), st.model.tokenizer
    base = {"id": cid, "object": "chat.completion.chunk", "created": created,
            "model": st.model_name, "system_fingerprint": None}

    def frame(i: int, delta: dict[str, Any], finish: str | None = None,
              logprobs: Any = None) -> str:
        return data({**base, "choices": [{"index": i, "delta": delta, "logprobs": logprobs,
                                          "finish_reason": finish}]})

    completion = 0
    try:
        async with ticket:
            for i in range(p.n):
                yield frame(i, {"role": "assistant", "content": ""})
                calls = (ToolStream(p.tool_format, p.tools) if p.tool_format is not None
                         else None)
                thinking = reasoning_splitter(p)
                finish = "length"
                async for chunk in ticket.stream(p.prompt_ids, p.sample_options(i)):
                    if chunk.token_id is not None:
                        completion += 1
                    reasoning, text = (thinking.feed(chunk.text) if thinking is not None
                                       else ("", chunk.text))
                    events: list[StreamEvent] = (calls.feed(text) if calls is not None
                                                 else [text])
                    lps = ({"content": [chat_logprob(chunk.logprobs, tok)]}
                           if chunk.logprobs is not None else None)
                    if reasoning:
                        yield frame(i, {"reasoning_content": reasoning})
                    for f in _event_frames(events, lps):
                        yield frame(i, *f)
                    if chunk.finish_reason is not None:
                        finish = chunk.finish_reason
                held = thinking.finish() if thinking is not None else ("", "")
                if held[0]:
                    yield frame(i, {"reasoning_content": held[0]})
                if calls is None:
                    if held[1]:
                        yield frame(i, {"content": held[1]})
                else:
                    events = calls.feed(held[1]) + calls.finish(cut=finish == "length",
                                                                raw_without_calls=True)
                    for f in _event_frames(events, None):
                        yield frame(i, *f)
                    if calls.calls:
                        finish = "length" if calls.dropped else "tool_calls"
                yield frame(i, {}, finish)
    except (ApiError, ColibriError) as exc:
        yield data(error_frame(exc))
        yield DONE
        return
    if include_usage:
        yield data({**base, "choices": [], "usage": usage(len(p.prompt_ids), completion)})
    yield DONE


# --- legacy completions ---------------------------------------------------------------


def _prompt_ids(st: ServerState, req: CompletionRequest) -> list[int]:
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise ApiError(400, "one prompt per request: a list of several prompts is not "
                                "supported (send them as separate requests)", param="prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        check_chars(st.model, len(prompt), "prompt")
    try:
        return st.model.encode_prompt(prompt)  # type: ignore[arg-type]
    except ColibriError as exc:
        raise ApiError(400, str(exc), param="prompt") from exc


def _completion_plan(st: ServerState, req: CompletionRequest) -> Plan:
    if req.echo:
        raise ApiError(400, "echo is not supported by colibri's server", param="echo")
    if req.best_of is not None and req.best_of > 1:
        raise ApiError(400, "best_of > 1 is not supported by colibri's server (use n)",
                       param="best_of")
    if req.suffix:
        raise ApiError(400, "suffix (fill-in-the-middle) is not supported", param="suffix")
    ids = _prompt_ids(st, req)
    k = req.logprobs
    s = sampling(req, logprobs=k is not None, top_logprobs=k or 0)
    return plan(st.model, req, ids, s, max_tokens=16 if req.max_tokens is None
                else req.max_tokens, logprobs=k, limits=st.grammar_limits)


@router.post("/v1/completions")
async def completions(req: CompletionRequest, request: Request) -> Response:
    st = state(request)
    st.check_model(req.model)
    p = await asyncio.to_thread(_completion_plan, st, req)  # off the loop, as for chat
    ticket = st.scheduler.admit(positions=p.positions)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    frames = _completion_frames(st, p, ticket, include_usage) if req.stream else None
    return _respond(ticket, req.stream, frames, lambda: _completion_body(st, p, ticket))


async def _completion_body(st: ServerState, p: Plan, ticket: Ticket) -> dict[str, Any]:
    choices, completion = [], 0
    async with ticket:
        for i in range(p.n):
            s = await run_sample(ticket, p, i)
            completion += len(s.token_ids)
            choices.append({"index": i, "text": s.text, "finish_reason": s.finish_reason,
                            "logprobs": legacy_logprobs(s.logprobs)
                            if p.logprobs is not None else None})
    return {"id": new_id("cmpl-"), "object": "text_completion", "created": now(),
            "model": st.model_name, "choices": choices,
            "usage": usage(len(p.prompt_ids), completion)}


async def _completion_frames(st: ServerState, p: Plan, ticket: Ticket,
                             include_usage: bool) -> AsyncIterator[str]:
    base = {"id": new_id("cmpl-"), "object": "text_completion", "created": now(),
            "model": st.model_name}
    completion = 0
    try:
        async with ticket:
            for i in range(p.n):
                offset = 0
                async for chunk in ticket.stream(p.prompt_ids, p.sample_options(i)):
                    if chunk.token_id is not None:
                        completion += 1
                    lps = None
                    if chunk.logprobs is not None:
                        lps = legacy_logprobs([chunk.logprobs], offset)
                        offset += len(chunk.logprobs.text)
                    if chunk.text or lps is not None or chunk.finish_reason is not None:
                        yield data({**base, "choices": [{
                            "index": i, "text": chunk.text, "logprobs": lps,
                            "finish_reason": chunk.finish_reason}]})
    except (ApiError, ColibriError) as exc:
        yield data(error_frame(exc))
        yield DONE
        return
    if include_usage:
        yield data({**base, "choices": [], "usage": usage(len(p.prompt_ids), completion)})
    yield DONE
