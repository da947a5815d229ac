"""``colibri serve MODEL``: the HTTP server (colibri.server) on one loaded model."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, TextIO

from ..errors import UnsupportedError
from .parser import UsageError, engine_from_args


def add_serve_parser(sub: Any, engine_flags: Callable[[argparse.ArgumentParser], None],
                     cache_flag: Callable[[Any], None],
                     debug_flag: Callable[[argparse.ArgumentParser, Any], None]) -> None:
    p = sub.add_parser(
        "serve", help="serve a model over OpenAI's and Anthropic's HTTP APIs",
        description="Serve MODEL on OpenAI's (/v1/chat/completions, /v1/completions, "
                    "/v1/models) and Anthropic's (/v1/messages) HTTP APIs, with /health and "
                    "/metrics (Prometheus). One generation runs at a time; others wait in "
                    "a bounded queue (see docs/serving.md). Ctrl-C or SIGTERM stops "
                    "taking requests and lets the running ones finish.")
    p.add_argument("model", metavar="MODEL",
                   help="a .gguf file, a Hugging Face checkpoint directory, a native "
                        "container or a named model (smollm2, smollm2-moe-demo)")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free)")
    g.add_argument("--api-key", metavar="KEY",
                   help="require this key from clients (Authorization: Bearer KEY or "
                        "x-api-key: KEY; default: $COLIBRI_API_KEY, else none)")
    g.add_argument("--served-model-name", metavar="NAME",
                   help="the model id clients send and /v1/models lists (default: the "
                        "model's name)")
    g.add_argument("--chat-template", metavar="FILE",
                   help="a Jinja chat template file replacing the model's own (e.g. one "
                        "that renders tools)")
    g.add_argument("--parallel", type=int, default=4, metavar="N",
                   help="requests that generate at once, batched into shared forwards "
                        "(continuous batching; each holds its own KV cache; default 4)")
    g.add_argument("--max-queue", type=int, default=16, metavar="N",
                   help="requests that may wait beyond the running ones; more get 429 "
                        "(default 16)")
    g.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="most seconds a request may take, queue wait included; 0: no "
                        "limit (default 600)")
    g.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="at shutdown, how long running requests may take to finish "
                        "(default 30)")
    g.add_argument("--kv-budget", metavar="SIZE",
                   help="KV bytes all running requests may reserve (each its prompt + "
                        "max_tokens positions); a request that does not fit waits in the "
                        "queue (default: what --ram-budget holds beside the expert cache; "
                        "more is taken from the expert cache)")
    g.add_argument("--max-body-bytes", metavar="SIZE", default="8MiB",
                   help="largest request body; a larger one gets 413 before it is read "
                        "whole (default 8MiB)")
    g.add_argument("--max-messages", type=int, default=10_000, metavar="N",
                   help="most messages one request may hold; more get 400 before the "
                        "prompt is rendered (default 10000)")
    g.add_argument("--grammar-limits", metavar="KEY=VALUE,...", default="",
                   help="raise or lower what a request's response_format and tools may hold "
                        "(max_enum_values=50000,compile_seconds=30; the keys and defaults: "
                        "docs/serving.md, Limits)")
    g.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="a connection must send its request line and headers within this "
                        "many seconds of opening (or of the first byte of a later request), "
                        "else it gets 408 and is closed; 0: no limit (default 10)")
    g.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="a request body must arrive within this many seconds of its "
                        "headers, else 408; 0: no limit (default 30)")
    g.add_argument("--keep-alive-timeout", type=float, default=5.0, metavar="SECONDS",
                   help="an idle connection is closed this many seconds after its last "
                        "response; 0: after each response (default 5)")
    g.add_argument("--max-connections", type=int, default=512, metavar="N",
                   help="open connections at most; one more gets 503 and is closed at "
                        "once; 0: no cap (default 512)")
    g.add_argument("--prompt-cache", metavar="SIZE",
                   help="keep the KV state of recent requests (e.g. 512MiB) so a chat's "
                        "next turn prefills only its new tokens, and requests running at "
                        "the same time prefill a common prompt prefix once (default: off)")
    g.add_argument("--no-prefix-sharing", action="store_true",
                   help="with --prompt-cache: reuse only the prefixes of finished requests, "
                        "not those of requests running at the same time")
    g.add_argument("--allow-special-tokens-in-content", action="store_true",
                   help="match control tokens (<|im_start|>...) written in messages and "
                        "tools as those tokens, as before colibri encoded them as plain "
                        "text; for trusted clients only (docs/serving.md)")
    g.add_argument("-q", "--quiet", action="store_true",
                   help="no download progress and no access log on stderr")
    from .serve_ray import add_ray_flags

    add_ray_flags(p)
    cache_flag(p)
    engine_flags(p)
    debug_flag(p, argparse.SUPPRESS)


def cmd_serve(args: argparse.Namespace, err: TextIO) -> int:
    try:
        import uvicorn

        from ..server import create_app
        from ..server.connections import timed_h11_protocol
    except ImportError as exc:
        raise UnsupportedError(
            f"colibri serve needs FastAPI and uvicorn, part of colibri's install, but "
            f"{exc.name} is missing here: pip install fastapi uvicorn"
        ) from exc
    from ..errors import ColibriError
    from ..generate.grammar_limits import parse_limits
    from ..model import Model
    from ..models.resolve import resolve_model_spec
    from ..server.prompt_size import PromptLimits
    from ..settings.config import EngineConfig
    from ..sizes import format_bytes

    if not 0 <= args.port <= 65535:
        raise UsageError(f"argument --port: {args.port} is not a port (0..65535)")
    if args.max_queue < 0:
        raise UsageError("argument --max-queue: must be >= 0")
    if args.parallel < 1:
        raise UsageError("argument --parallel: must be >= 1")
    template = None
    if args.chat_template is not None:
        try:
            template = Path(args.chat_template).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"argument --chat-template: cannot read {args.chat_template}: "
                             f"{exc.strerror}") from None
    kv_budget = None if args.kv_budget is None else _size("--kv-budget", args.kv_budget)
    max_body = _size("--max-body-bytes", args.max_body_bytes)
    header_timeout = _seconds("--header-timeout", args.header_timeout)
    body_timeout = _seconds("--body-timeout", args.body_timeout)
    keep_alive = _seconds("--keep-alive-timeout", args.keep_alive_timeout) or 0.0
    if args.max_connections < 0:
        raise UsageError("argument --max-connections: must be >= 0")
    if args.max_messages < 1:
        raise UsageError("argument --max-messages: must be at least 1")
    prompt_limits = PromptLimits(max_messages=args.max_messages)
    try:
        grammar_limits = parse_limits(args.grammar_limits)
    except ColibriError as exc:
        raise UsageError(f"argument --grammar-limits: {exc}") from None
    api_key = args.api_key if args.api_key is not None else os.environ.get("COLIBRI_API_KEY")
    timeout = args.request_timeout if args.request_timeout > 0 else None
    if args.ray:
        from .serve_ray import cmd_serve_ray

        # Each replica builds this server around its own copy of the model.
        return cmd_serve_ray(args, {
            "model_name": args.served_model_name,
            "aliases": [args.model] if args.served_model_name is None else [],
            "api_key": api_key or None,
            "chat_template": template, "max_queue": args.max_queue,
            "max_running": args.parallel, "timeout": timeout,
            "drain_timeout": args.shutdown_timeout, "kv_budget": kv_budget,
            "max_body_bytes": max_body, "body_timeout": body_timeout,
            "grammar_limits": grammar_limits, "prompt_limits": prompt_limits,
            "special_tokens_in_content": args.allow_special_tokens_in_content,
            "prefix_sharing": not args.no_prefix_sharing}, err)
    # The port is taken before the model loads (seconds to minutes): one in use is this
    # command's error now, not uvicorn's after the load.
    sock = _listen(args.host, args.port)
    engine: EngineConfig = engine_from_args(args)
    if args.prompt_cache is not None:
        engine = engine.replace(prompt_cache=args.prompt_cache)
    # Resolved here first so that a missing model's error gives the CLI's options; the load
    # then finds it at once (a named model is in the cache by now).
    resolve_model_spec(args.model, cache_dir=args.cache_dir, download=args.download,
                       download_option="--download", log=None if args.quiet else err)
    # progress=False: what a fetch does was written just above; a server draws no bars.
    model = Model.load(args.model, engine=engine, cache_dir=args.cache_dir,
                       download=args.download, progress=False)
    # Without --served-model-name, the name the model was given on the command line
    # ("smollm2") is accepted as well as its resolved name ("smollm2-135m-instruct").
    aliases = [args.model] if args.served_model_name is None else []
    app = create_app(model, model_name=args.served_model_name, aliases=aliases,
                     api_key=api_key or None,
                     chat_template=template, max_queue=args.max_queue,
                     max_running=args.parallel, timeout=timeout,
                     close_model=True, drain_timeout=args.shutdown_timeout,
                     kv_budget=kv_budget, prefix_sharing=not args.no_prefix_sharing,
                     max_body_bytes=max_body, body_timeout=body_timeout,
                     grammar_limits=grammar_limits, prompt_limits=prompt_limits,
                     special_tokens_in_content=args.allow_special_tokens_in_content)
    scheduler = app.state.colibri.scheduler
    name = app.state.colibri.model_name

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and self.servers and self.servers[0].sockets:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                err.write(f"colibri: serving {name} at http://{host}:{port}/v1 "
                          f"(context {model.context_length}, {args.parallel} slots, "
                          f"KV budget {format_bytes(scheduler.kv_budget)}, "
                          f"queue {args.max_queue})\n")
                err.flush()

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            with super().capture_signals():
                yield
                # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, so the
                # process would end "killed by a signal"; a drained shutdown exits 0.
                captured = getattr(self, "_captured_signals", None)
                if isinstance(captured, list):
                    captured.clear()

        def handle_exit(self, sig: int, frame: Any) -> None:
            scheduler.draining = True  # new requests get 503 while the running ones end
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=args.host, port=args.port,
                            log_level="warning" if args.quiet else "info",
                            access_log=not args.quiet,
                            timeout_graceful_shutdown=int(max(1, args.shutdown_timeout)),
                            # Slow clients (issue 35, item 9): server/connections.py.
                            http=timed_h11_protocol(header_timeout, args.max_connections or None),
                            # uvicorn types it int; it only passes it to call_later.
                            timeout_keep_alive=keep_alive)  # type: ignore[arg-type]
    Server(config).run(sockets=[sock])
    return 0


def _size(flag: str, text: str) -> int:
    """A SIZE flag's value in bytes (at least 1), or a UsageError naming the flag."""
    from ..errors import ColibriError
    from ..sizes import parse_bytes

    try:
        n = parse_bytes(text)
    except (ValueError, ColibriError) as exc:
        raise UsageError(f"argument {flag}: {exc}") from None
    if n < 1:
        raise UsageError(f"argument {flag}: must be at least 1 byte")
    return n


def _seconds(flag: str, value: float) -> float | None:
    """A SECONDS flag's value; 0 means no limit (None). Negative, NaN: a UsageError."""
    if not value >= 0 or value == float("inf"):
        raise UsageError(f"argument {flag}: must be a number of seconds >= 0")
    return value or None


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), or a one-line UsageError saying why not. It listens
    only once the server starts, so clients are refused (not left waiting) while the model
    loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say TCP, and
    # without it every kept-alive response waited 40 ms for the client's delayed ACK
    # (Nagle: uvicorn writes the headers and the body separately).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        return sock
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        hint = "; pick another --port (0: any free one)" if exc.errno == errno.EADDRINUSE else ""
        raise UsageError(f"argument --port: cannot listen on {host}:{port}: {reason}{hint}"
                         ) from None
