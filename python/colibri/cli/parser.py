"""The argument parser of ``colibri`` and the settings built from its flags."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from ..errors import ConfigError
from ..sampling import Sampling
from ..settings.config import EngineConfig, SpecConfig

PROG = "colibri"


class UsageError(Exception):
    """A bad command line: reported as ``colibri: error: ...``, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


# Settings fields -> the flag that sets them, to name flags in ConfigError messages.
FLAG_OF_FIELD = {
    "Sampling.temperature": "--temperature",
    "Sampling.top_k": "--top-k",
    "Sampling.top_p": "--top-p",
    "Sampling.min_p": "--min-p",
    "Sampling.repetition_penalty": "--repetition-penalty",
    "Sampling.seed": "--seed",
    "ThreadConfig.n": "--threads",
    "ThreadConfig.wait_policy": "--wait-policy",
    "EngineConfig.context_length": "--context-length",
    "EngineConfig.prefill_chunk": "--prefill-chunk",
    "EngineConfig.activation_precision": "--activation-precision",
    "EngineConfig.ram_budget": "--ram-budget",
    "IOConfig.workers": "--io-workers",
    "IOConfig.max_in_flight": "--io-max-in-flight",
    "IOConfig.direct": "--direct/--no-direct",
    "IOConfig.prefetch": "--prefetch/--no-prefetch",
    "IOConfig.first_layer_guess": "--first-layer-guess/--no-first-layer-guess",
    "CacheConfig.policy": "--cache-policy",
    "stop_strings": "--stop",
}
_FIELD = re.compile(r"^(" + "|".join(re.escape(k) for k in FLAG_OF_FIELD) + r"):")



def _workers(text: str) -> int | str:
    """--io-workers: a count or "auto" (range checked by IOConfig)."""
    return "auto" if text == "auto" else int(text)

def flag_message(exc: ConfigError) -> str:
    """A ConfigError's message with the settings field replaced by its flag."""
    msg = str(exc)
    return _FIELD.sub(lambda m: f"argument {FLAG_OF_FIELD[m.group(1)]}:", msg, count=1)


def _non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return v


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def unescape(text: str) -> str:
    r"""``\n``, ``\t``, ``\r`` and ``\\`` in a flag value become the characters."""
    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], text)


def _debug_flag(p: argparse.ArgumentParser, default: Any) -> None:
    p.add_argument("--debug", action="store_true", default=default,
                   help="show the full traceback of an error")


def _model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("-m", "--model", metavar="MODEL",
                   help="a .gguf file, a Hugging Face checkpoint directory, or a named model "
                        "(smollm2-135m-instruct, smollm2-moe-demo); default: "
                        "smollm2-135m-instruct")
    _cache_flag(g)


def _cache_flag(g: argparse._ActionsContainer) -> None:
    g.add_argument("--cache-dir", metavar="DIR",
                   help="where named models are downloaded or built (default: "
                        "$XDG_CACHE_HOME/colibri/models or ~/.cache/colibri/models)")


def _engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("-t", "--threads", type=int, metavar="N",
                   help="compute threads (default: the performance cores)")
    g.add_argument("--wait-policy", choices=("auto", "spin", "passive", "hybrid"),
                   help="how threads wait between parallel regions (default: auto: passive "
                        "when disk-bound, spinning when compute-bound)")
    g.add_argument("-c", "--context-length", type=int, metavar="N",
                   help="KV-cache positions (default: the model's context, at most 4096)")
    g.add_argument("--prefill-chunk", type=int, metavar="N",
                   help="prompt tokens per prefill chunk (default 512; Ctrl-C and the "
                        "progress line are served between chunks)")
    g.add_argument("--activation-precision", choices=("int8", "float32"),
                   help="int8: llama.cpp's arithmetic (default, fastest); float32: "
                        "transformers' (changes the numbers)")

    s = p.add_argument_group("expert streaming (MoE models)")
    s.add_argument("--ram-budget", metavar="SIZE",
                   help="RAM for the whole engine: weights, KV cache, buffers and the expert "
                        "cache, e.g. 12GiB, 1.5GB, 800M (default: available memory less "
                        "10%% or 512 MiB)")
    s.add_argument("--io-workers", type=_workers, metavar="N|auto",
                   help="threads reading experts from disk, 0 = read on the compute thread, "
                        "auto = the knee of a read-depth curve measured at load (default: 2)")
    s.add_argument("--io-max-in-flight", type=_workers, metavar="N|auto",
                   help="expert reads on the device at once, apart from the workers; 0 = no "
                        "cap, auto = the best depth of a read-depth curve measured at load "
                        "(default: 0)")
    s.add_argument("--direct", action=argparse.BooleanOptionalAction, default=None,
                   help="read experts with O_DIRECT, bypassing the page cache (default: on; "
                        "falls back to buffered reads where unsupported)")
    s.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                   help="predict and start reading the next layer's experts early "
                        "(default: on)")
    s.add_argument("--first-layer-guess", action=argparse.BooleanOptionalAction, default=None,
                   help="with --prefetch: also guess the first MoE layer's experts just "
                        "before its attention runs (default: on)")
    s.add_argument("--cache-policy", choices=("lru", "lfru", "pinned"),
                   help="which expert the cache drops: lru, lfru (frequency-aware, the "
                        "default), pinned (pins learned from earlier runs + LRU)")


def _sampling_flags(p: argparse.ArgumentParser, max_tokens: int) -> None:
    g = p.add_argument_group("generation (defaults: greedy decoding)")
    g.add_argument("-n", "--max-tokens", type=_non_negative_int, default=max_tokens,
                   metavar="N", help=f"most tokens to generate (default: {max_tokens})")
    g.add_argument("--temperature", type=float, metavar="T",
                   help="0 = greedy (default 0)")
    g.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling (default 1: off)")
    g.add_argument("--top-k", type=int, metavar="K", help="keep the K most likely (default 0: off)")
    g.add_argument("--min-p", type=float, metavar="P", help="min-p filter (default 0: off)")
    g.add_argument("--repetition-penalty", type=float, metavar="R",
                   help="llama.cpp/transformers repetition penalty (default 1: off)")
    g.add_argument("--seed", type=int, metavar="S", help="random seed for sampling")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop at this text (repeatable; \\n and \\t are interpreted)")
    g.add_argument("--system", metavar="TEXT", help="a system message before the conversation")
    g.add_argument("--spec", choices=("off", "lookup", "mtp", "auto"),
                   help="speculative decoding: prompt-lookup or the model's MTP layer drafts "
                        "verified in one forward, same tokens (default off; auto: MTP when the "
                        "model has it, else lookup, only while it pays)")
    g.add_argument("--max-draft", type=int, metavar="K",
                   help="with --spec: most drafted tokens per verify forward (default 8)")


def spec_from_args(args: argparse.Namespace) -> SpecConfig | None:
    """--spec / --max-draft as a SpecConfig (None: the model's default, off)."""
    drafter, k = getattr(args, "spec", None), getattr(args, "max_draft", None)
    if drafter is None and k is None:
        return None
    return SpecConfig(drafter=drafter or "lookup", **({} if k is None else {"max_draft": k}))


def build_parser(version: str) -> Parser:
    parser = Parser(
        prog=PROG,
        description="Run Mixture-of-Experts language models on the CPU.",
        epilog="Run 'colibri COMMAND --help' for the flags of a command.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version}")
    _debug_flag(parser, False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                parser_class=Parser)

    run = sub.add_parser("run", help="generate an answer to one prompt",
                         description="Generate an answer to PROMPT and stream it to stdout; "
                                     "a summary line goes to stderr. PROMPT is one user "
                                     "message rendered with the model's chat template, or "
                                     "with --raw a plain completion prompt.")
    run.add_argument("prompt", nargs="?", metavar="PROMPT",
                     help="the prompt; '-' or nothing reads it from stdin")
    run.add_argument("--raw", action="store_true",
                     help="a plain completion prompt: the text is continued as it is, with no "
                          "chat template (without --raw PROMPT is one user message rendered "
                          "with the model's chat template)")
    run.add_argument("--truncate", action="store_true",
                     help="keep the end of a prompt longer than the context (default: refuse "
                          "it)")
    run.add_argument("--json", action="store_true",
                     help="print one JSON record (see docs/cli.md) instead of the text")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="no summary line and no download progress on stderr")
    _model_flags(run)
    _engine_flags(run)
    _sampling_flags(run, 256)
    _debug_flag(run, argparse.SUPPRESS)

    chat = sub.add_parser("chat", help="interactive chat with history",
                          description="Chat with the model on stdin/stdout. Commands: /reset "
                                      "(forget the conversation), /exit. Ctrl-C stops an "
                                      "answer; Ctrl-D (end of input) ends.")
    _model_flags(chat)
    _engine_flags(chat)
    _sampling_flags(chat, 512)
    _debug_flag(chat, argparse.SUPPRESS)

    from .serve import add_serve_parser

    add_serve_parser(sub, _engine_flags, _cache_flag, _debug_flag)

    info = sub.add_parser("info", help="describe a model without loading its weights",
                          description="Architecture, parameter and byte counts, quantization "
                                      "types, context length and MoE layout, read from the "
                                      "model's header only.")
    info.add_argument("model", metavar="MODEL", help="a model path or a named model")
    info.add_argument("--json", action="store_true", help="print one JSON record")
    _cache_flag(info)
    _debug_flag(info, argparse.SUPPRESS)

    convert = sub.add_parser("convert", help="write a model as a native streaming container",
                             description="Lay SOURCE (a GGUF file, a Hugging Face directory or "
                                         "a named model) out as a native container at DEST: "
                                         "one 4 KiB-aligned, checksummed blob per expert. "
                                         "Rerun after an interruption to resume.")
    convert.add_argument("source", metavar="SOURCE", help="a model path or a named model")
    convert.add_argument("dest", metavar="DEST", help="the container directory to write")
    convert.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    from .convert import add_convert_options

    add_convert_options(convert)
    _cache_flag(convert)
    _debug_flag(convert, argparse.SUPPRESS)

    verify = sub.add_parser("verify", help="check every checksum of a native container",
                            description="Re-read a container and check every blob's and "
                                        "tensor's checksum; problems are listed one per line "
                                        "(a damaged expert by layer and expert).")
    verify.add_argument("container", metavar="CONTAINER", help="the container directory")
    _debug_flag(verify, argparse.SUPPRESS)
    from .doctor import add_doctor_parser

    add_doctor_parser(sub, _debug_flag)
    return parser


def parse_args(argv: Sequence[str], version: str) -> argparse.Namespace:
    return build_parser(version).parse_args(list(argv))


def sampling_from_args(args: argparse.Namespace) -> Sampling:
    fields = {
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "seed": args.seed,
    }
    return Sampling(**{k: v for k, v in fields.items() if v is not None})


def _given(args: argparse.Namespace, fields: dict[str, str]) -> dict[str, Any]:
    """{field: value} for the flags (attribute names) that were given on the command line;
    a flag left out keeps the setting's default."""
    return {f: getattr(args, a) for f, a in fields.items() if getattr(args, a, None) is not None}


def engine_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the engine flags ask for (validated: a bad value raises
    ConfigError naming the settings field; :func:`flag_message` names the flag)."""
    threads = _given(args, {"n": "threads", "wait_policy": "wait_policy"})
    io = _given(args, {"workers": "io_workers", "direct": "direct", "prefetch": "prefetch",
                       "first_layer_guess": "first_layer_guess",
                       "max_in_flight": "io_max_in_flight"})
    cache = _given(args, {"policy": "cache_policy"})
    engine = _given(args, {"context_length": "context_length", "prefill_chunk": "prefill_chunk",
                           "activation_precision": "activation_precision",
                           "ram_budget": "ram_budget"})
    return EngineConfig(threads=threads, io=io, cache=cache, **engine)


def stops_from_args(args: argparse.Namespace) -> list[str]:
    stops = [unescape(s) for s in args.stop]
    if any(not s for s in stops):
        raise UsageError("argument --stop: the text must not be empty")
    return stops
