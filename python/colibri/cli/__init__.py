"""The ``colibri`` command line: ``run``, ``chat``, ``serve``, ``info``, ``convert``,
``verify`` and ``doctor`` (see docs/cli.md).

``main(argv)`` returns the exit status: 0 on success, 1 for a runtime error (a colibri
error: a missing or unreadable model, a download that failed, a prompt that does not
fit), 2 for a bad command line or setting value, 130 after Ctrl-C. Errors are one line on
stderr, ``colibri: error: ...``; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from ..errors import ColibriError, ConfigError
from .parser import PROG, UsageError, flag_message, parse_args

__all__ = ["main"]


def _version() -> str:
    from .._version import __version__

    return __version__


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _dispatch(args: argparse.Namespace, stdin: TextIO, out: TextIO, err: TextIO) -> int:
    if args.command == "run":
        from .run import cmd_run

        return cmd_run(args, stdin, out, err)
    if args.command == "chat":
        from .chat import cmd_chat

        return cmd_chat(args, stdin, out, err)
    if args.command == "serve":
        from .serve import cmd_serve

        return cmd_serve(args, err)
    if args.command == "convert":
        from .convert import cmd_convert

        return cmd_convert(args, out, err)
    if args.command == "doctor":
        from .doctor import cmd_doctor

        return cmd_doctor(args, out, err)
    if args.command == "verify":
        from .convert import cmd_verify

        return cmd_verify(args, out, err)
    from ..models.resolve import resolve_model_spec
    from ..sources import open_model_source
    from .info import model_info, print_info

    resolved = resolve_model_spec(args.model, cache_dir=args.cache_dir, log=err,
                                  download=args.download, download_option="--download")
    info = model_info(open_model_source(resolved.path))
    if args.json:
        out.write(json.dumps(info) + "\n")
    else:
        print_info(info, out)
    out.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line `argv` (default ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    stdin, out, err = sys.stdin, sys.stdout, sys.stderr
    debug = "--debug" in argv
    try:
        args = parse_args(argv, _version())
        debug = bool(args.debug)
        return _dispatch(args, stdin, out, err)
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    except UsageError as exc:
        if debug:
            raise
        err.write(f"{PROG}: error: {_one_line(str(exc))}\n")
        return 2
    except ConfigError as exc:
        if debug:
            raise
        err.write(f"{PROG}: error: {_one_line(flag_message(exc))}\n")
        return 2
    except ColibriError as exc:
        if debug:
            raise
        err.write(f"{PROG}: error: {_one_line(str(exc))}\n")
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        err.write(f"{PROG}: interrupted\n")
        return 130
    except BrokenPipeError:
        # The reader went away (`colibri run ... | head`): stop quietly. Point stdout at
        # /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:
        if debug:
            raise
        err.write(f"{PROG}: error: {_one_line(str(exc))}\n")
        return 1
    except Exception as exc:
        if debug:
            raise
        err.write(
            f"{PROG}: error: internal error ({type(exc).__name__}: {_one_line(str(exc))}); "
            "rerun with --debug for the traceback and please report it\n"
        )
        return 1
