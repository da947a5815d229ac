"""``colibri convert`` and ``colibri verify``: the native streaming container
(docs/format.md, "Native container"; docs/cli.md).

``add_convert_options(parser)`` adds ``convert``'s ``--quant`` option to its sub-parser
(``cli/parser.py`` calls it); ``cmd_convert`` reads ``args.quant`` (``keep`` when the
parser has no such option).
"""

from __future__ import annotations

import argparse
import time
from typing import TextIO

from ..convert import verify_container, write_container
from ..convert.quantize import QUANT_CHOICES
from ..errors import ModelFormatError
from ..models.resolve import resolve_model_spec
from ..progress import Progress

QUANT_HELP = (
    "element type of the matrices: keep (default: the source's bytes unchanged; FP8 "
    "weights become bf16), f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, the K-quants "
    "q2_k, q3_k, q4_k, q5_k, q6_k, llama.cpp's mixes q4_k_m and q5_k_m (attn_v, "
    "ffn_down and the output at q6_k in some layers), or the i-quants iq4_xs, iq3_s, "
    "iq3_xxs, iq2_s, iq2_xs, iq2_xxs, iq1_m, iq1_s (colibri's own quantizer below 4 bits: "
    "no importance matrix). "
    "Norms, biases and routers are f32 with any type but keep. A quantized source is "
    "requantized through f32."
)


def add_convert_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``colibri convert`` beyond SOURCE, DEST and --quiet."""
    parser.add_argument(
        "--quant", choices=QUANT_CHOICES, default="keep", metavar="TYPE", help=QUANT_HELP
    )


def cmd_convert(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..models.resolve import resolve_model_spec

    quant = str(getattr(args, "quant", "keep") or "keep")
    resolved = resolve_model_spec(args.source, cache_dir=args.cache_dir, log=err,
                                  download=bool(getattr(args, "download", False)),
                                  download_option="--download")
    t0 = time.perf_counter()
    progress = Progress(None if args.quiet else err, f"colibri: converting ({quant})")
    report = write_container(resolved.path, args.dest, quant=quant, progress=progress.update)
    out.write(
        f"wrote {args.dest}: {report.items_total} items ({report.items_written} written, "
        f"{report.items_reused} reused from an interrupted run), "
        f"{report.bytes_total / 2**20:,.1f} MiB in {time.perf_counter() - t0:.1f} s"
        f" (--quant {report.quant})\n"
    )
    return 0


def cmd_verify(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    # A named model resolves as for run and info (built or fetched on first use).
    container = resolve_model_spec(args.container, cache_dir=args.cache_dir, log=err,
                                   download=args.download, download_option="--download").path
    problems = verify_container(container)
    if problems:
        # One line per problem on stdout, then the error line (exit 1) from main.
        for p in problems:
            out.write(p + "\n")
        out.flush()
        raise ModelFormatError(f"{container}: {len(problems)} problem(s) found")
    out.write(f"{container}: every checksum matches\n")
    return 0
