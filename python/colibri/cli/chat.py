"""``colibri chat``: an interactive conversation on stdin/stdout.

Each turn renders the whole conversation with the model's chat template and reuses the
session's KV cache for the longest prefix it already holds (rolling back the rest), so a
turn only prefills what is new. When the conversation no longer fits the context, the
oldest exchanges are dropped (the system message stays).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..errors import ColibriError
from ..generate.prefix_share import common_prefix
from ..generate.session import Session
from ..model import Model
from ..progress import delayed_bar
from .common import Loaded, load_model
from .parser import sampling_from_args, spec_from_args, stops_from_args

HELP = "commands: /reset forgets the conversation, /exit (or Ctrl-D) ends, /help shows this"


def _fit(model: Model, history: list[dict[str, Any]], max_tokens: int,
         err: TextIO) -> list[int] | None:
    """Prompt ids for the conversation, dropping the oldest exchanges until it leaves room
    for an answer; None (after a message to `err`) when even the last message alone does
    not fit."""
    ctx = model.context_length
    keep = ctx - max(1, min(max_tokens, ctx // 2))
    first = 1 if history and history[0]["role"] == "system" else 0
    dropped = 0
    while True:
        ids = model.encode_prompt(messages=history)
        if len(ids) <= keep:
            if dropped:
                err.write(f"colibri: dropped the {dropped} oldest message(s) to fit the "
                          f"context of {ctx} tokens\n")
            return ids
        if len(history) - first <= 1:
            err.write(f"colibri: error: the message is {len(ids)} tokens with the template "
                      f"and does not fit the context of {ctx} tokens (room for {keep}); "
                      "shorten it or raise --context-length\n")
            return None
        del history[first : first + 2]  # the oldest user message and its answer
        dropped += 2


def _answer(session: Session, ids: list[int], args: argparse.Namespace, out: TextIO,
            err: TextIO, sampling: Any, stops: list[str]) -> tuple[str, bool]:
    """Streams the answer to `ids`; returns (text, interrupted). A prefill that runs over
    a second shows a bar on `err` when it is a terminal, erased before the answer."""
    common = common_prefix(session.token_ids, ids)
    if common == len(ids):
        common -= 1  # forward at least one token to get logits
    if not session.holds_prefix(common):  # a sliding window's ring no longer holds it
        common = 0
    if session.n_tokens > common:
        session.rollback(session.n_tokens - common)
    pieces: list[str] = []
    bar = delayed_bar(None, "colibri: prompt", len(ids) - common, unit="tok", out=err)
    stream = session.stream(ids[common:], max_tokens=args.max_tokens, sampling=sampling,
                            stop=stops, spec=spec_from_args(args),
                            progress=False if bar is None else bar.start())
    try:
        for chunk in stream:
            if bar is not None:
                bar.close()  # the prefill is over
            if chunk.text:
                pieces.append(chunk.text)
                out.write(chunk.text)
                out.flush()
    except KeyboardInterrupt:
        stream.close()  # ends the generator: its bookkeeping (stats) runs now
        return "".join(pieces), True
    finally:
        if bar is not None:
            bar.close()
    return "".join(pieces), False


def cmd_chat(args: argparse.Namespace, stdin: TextIO, out: TextIO, err: TextIO) -> int:
    sampling = sampling_from_args(args)
    stops = stops_from_args(args)
    loaded = load_model(args, err)
    try:
        return _converse(loaded, args, sampling, stops, stdin, out, err)
    finally:
        loaded.model.close()  # saves the routing history (what --cache-policy pinned learns)


def _converse(loaded: Loaded, args: argparse.Namespace, sampling: Any, stops: list[str],
              stdin: TextIO, out: TextIO, err: TextIO) -> int:
    model = loaded.model
    session = model.session()
    system = [{"role": "system", "content": args.system}] if args.system is not None else []
    history: list[dict[str, Any]] = list(system)
    tty = stdin.isatty()
    name = loaded.resolved.name or loaded.resolved.path.name
    if tty:
        err.write(f"colibri: chatting with {name}; {HELP}\n")
        err.flush()
    while True:
        try:
            if tty:
                out.write("> ")
                out.flush()
            line = stdin.readline()
        except KeyboardInterrupt:
            out.write("\n")
            return 130
        if not line:  # end of input
            if tty:
                out.write("\n")
            return 0
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            cmd = text.split()[0].lower()
            if cmd in ("/exit", "/quit"):
                return 0
            if cmd == "/reset":
                history = list(system)
                session.reset()
                err.write("colibri: conversation reset\n")
            else:
                err.write(f"colibri: {HELP}\n")
            err.flush()
            continue
        history.append({"role": "user", "content": text})
        try:
            ids = _fit(model, history, args.max_tokens, err)
        except ColibriError as exc:
            err.write(f"colibri: error: {exc}\n")
            history.pop()
            continue
        if ids is None:
            history.pop()
            continue
        try:
            answer, interrupted = _answer(session, ids, args, out, err, sampling, stops)
        except ColibriError as exc:
            err.write(f"\ncolibri: error: {exc}\n")
            history.pop()
            continue
        out.write("\n")
        out.flush()
        if interrupted:
            err.write("colibri: answer interrupted\n")
            err.flush()
            if session.n_tokens != len(session.token_ids):  # interrupted mid-bookkeeping
                session.reset()
        history.append({"role": "assistant", "content": answer})

