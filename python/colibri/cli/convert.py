"""``colibri convert`` and ``colibri verify``: the native streaming container
(docs/format.md, "Native container")."""

from __future__ import annotations

import argparse
import time
from typing import TextIO

from ..convert import verify_container, write_container
from ..errors import ModelFormatError


def cmd_convert(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..hub import resolve_model
    from ..sources import open_model_source

    resolved = resolve_model(args.source, args.cache_dir, log=err)
    manifest = open_model_source(resolved.path)
    t0 = time.perf_counter()
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if not args.quiet and (now - last[0] > 0.5 or done == total):
            last[0] = now
            pct = 100.0 * done / total if total else 100.0
            err.write(f"\rcolibri: converting {done / 2**20:,.0f} / {total / 2**20:,.0f} MiB "
                      f"({pct:.0f}%)")  # fmt: skip
            err.flush()

    report = write_container(manifest, args.dest, progress=progress)
    if not args.quiet:
        err.write("\n")
    out.write(
        f"wrote {args.dest}: {report.items_total} items ({report.items_written} written, "
        f"{report.items_reused} reused from an interrupted run), "
        f"{report.bytes_total / 2**20:,.1f} MiB in {time.perf_counter() - t0:.1f} s\n"
    )
    return 0


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    problems = verify_container(args.container)
    if problems:
        # One line per problem on stdout, then the error line (exit 1) from main.
        for p in problems:
            out.write(p + "\n")
        out.flush()
        raise ModelFormatError(f"{args.container}: {len(problems)} problem(s) found")
    out.write(f"{args.container}: every checksum matches\n")
    return 0
