"""``colibri run``: one prompt, the answer streamed to stdout (or one JSON record)."""

from __future__ import annotations

import argparse
import json
from typing import Any, TextIO

from ..generation import GenerationStats
from .common import Loaded, load_model
from .parser import UsageError, engine_from_args, sampling_from_args, stops_from_args

RUN_SCHEMA = "colibri.run/1"


def _read_prompt(args: argparse.Namespace, stdin: TextIO) -> str:
    if args.prompt is not None and args.prompt != "-":
        text: str = args.prompt
    elif args.prompt is None and stdin.isatty():
        raise UsageError("give a PROMPT, or '-' to read it from stdin (see 'colibri run --help')")
    else:
        text = stdin.read()
        text = text.removesuffix("\n") if args.raw else text.strip()
    if not text.strip():
        raise UsageError("the prompt is empty")
    return text


def summary_line(stats: GenerationStats, finish: str, load_seconds: float | None = None) -> str:
    """The one-line summary ``colibri run`` prints to stderr."""
    load = f"load {load_seconds:.2f} s, " if load_seconds is not None else ""
    return (
        f"colibri: {load}{stats.prompt_tokens} prompt tokens, {stats.generated_tokens} "
        f"generated; prefill {stats.prefill_tok_s:.1f} tok/s, decode "
        f"{stats.decode_tok_s:.1f} tok/s; finish: {finish}"
    )


def run_record(
    loaded: Loaded,
    args: argparse.Namespace,
    prompt: str,
    prompt_ids: list[int],
    text: str,
    token_ids: list[int],
    finish: str,
    stats: GenerationStats,
) -> dict[str, Any]:
    """The record ``colibri run --json`` prints (schema in docs/cli.md)."""
    model = loaded.model
    threads = model.threads
    return {
        "schema": RUN_SCHEMA,
        "model": {
            "path": str(loaded.resolved.path),
            "name": loaded.resolved.name,
            "architecture": model.config.arch,
            "source": model.manifest.source,
        },
        "prompt": {
            "mode": "raw" if args.raw else "chat",
            "text": prompt,
            "system": args.system,
            "token_ids": prompt_ids,
        },
        "text": text,
        "token_ids": token_ids,
        "finish_reason": finish,
        "stats": {
            **stats.to_dict(),
            "decode_tokens": stats.decode_tokens,
            "load_seconds": loaded.load_seconds,
        },
        "settings": {
            "max_tokens": args.max_tokens,
            "stop": stops_from_args(args),
            "sampling": sampling_from_args(args).to_dict(),
            "threads": threads.team_size(),
            "wait_policy": threads.wait_policy.value,
            "context_length": model.context_length,
            "activation_precision": model.engine_config.activation_precision.value,
        },
    }


def cmd_run(args: argparse.Namespace, stdin: TextIO, out: TextIO, err: TextIO) -> int:
    # Every flag is checked before anything is downloaded or loaded.
    sampling = sampling_from_args(args)
    stops = stops_from_args(args)
    engine_from_args(args)
    if args.raw and args.system is not None:
        raise UsageError("--system needs the chat template; it cannot be combined with --raw")
    prompt = _read_prompt(args, stdin)

    loaded = load_model(args, err, quiet=args.quiet)
    model = loaded.model
    if args.raw:
        ids = model.encode_prompt(prompt)
    else:
        messages = [{"role": "user", "content": prompt}]
        if args.system is not None:
            messages.insert(0, {"role": "system", "content": args.system})
        ids = model.encode_prompt(messages=messages)

    pieces: list[str] = []
    token_ids: list[int] = []
    finish = "interrupted"
    try:
        for chunk in model.stream(ids, max_tokens=args.max_tokens, sampling=sampling, stop=stops):
            if chunk.token_id is not None:
                token_ids.append(chunk.token_id)
            if chunk.finish_reason is not None:
                finish = chunk.finish_reason
            if chunk.text:
                pieces.append(chunk.text)
                if not args.json:
                    out.write(chunk.text)
                    out.flush()
    except KeyboardInterrupt:
        if not args.json:
            out.write("\n")
            out.flush()
        stats = model.stats().last
        if stats is not None and not args.quiet:
            err.write(summary_line(stats, finish, loaded.load_seconds) + "\n")
        raise
    stats = model.stats().last
    assert stats is not None  # the stream has ended, so its record exists
    text = "".join(pieces)
    if args.json:
        record = run_record(loaded, args, prompt, ids, text, token_ids, finish, stats)
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    else:
        if not text.endswith("\n"):
            out.write("\n")
        if not args.quiet:
            err.write(summary_line(stats, finish, loaded.load_seconds) + "\n")
    out.flush()
    return 0
