"""The argument parser of ``colibri`` and the settings built from its flags."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any, NoReturn

from ..errors import ConfigError
from ..sampling import Sampling
from ..settings.config import STREAMING_FLAGS, EngineConfig, SpecConfig
from ..settings.fields import BOOL
from ..settings.table import Flag, flag_settings

PROG = "colibri"


class UsageError(Exception):
    """A bad command line: reported as ``colibri: error: ...``, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UsageError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _flag_display(flag: Flag, is_bool: bool) -> str:
    return f"{flag.long}/--no-{flag.long[2:]}" if is_bool else flag.long


# Settings fields -> the flag that sets them, to name flags in ConfigError messages: the
# EngineConfig fields from their declarations (settings/table.py), the rest by hand.
FLAG_OF_FIELD = {
    "Sampling.temperature": "--temperature",
    "Sampling.top_k": "--top-k",
    "Sampling.top_p": "--top-p",
    "Sampling.min_p": "--min-p",
    "Sampling.repetition_penalty": "--repetition-penalty",
    "Sampling.seed": "--seed",
    **{s.qualname: _flag_display(s.flag, s.check is BOOL)
       for _, s, _ in flag_settings(EngineConfig) if s.flag is not None},
    "stop_strings": "--stop",
}
_FIELDS = "|".join(re.escape(k) for k in sorted(FLAG_OF_FIELD, key=len, reverse=True))
_FIELD = re.compile(r"^(" + _FIELDS + r"):")
_FIELD_IN_TEXT = re.compile(r"\b(" + _FIELDS + r")\b")


def flag_message(exc: ConfigError) -> str:
    """A ConfigError's message in the CLI's words: the settings field it starts with becomes
    "argument --flag:", and every other field it names becomes that field's flag."""
    msg = _FIELD.sub(lambda m: f"argument {FLAG_OF_FIELD[m.group(1)]}:", str(exc), count=1)
    return _FIELD_IN_TEXT.sub(lambda m: FLAG_OF_FIELD[m.group(1)], msg)


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
    g.add_argument("--download", action="store_true",
                   help="a Hugging Face repository id (org/name) missing from the local "
                        "Hugging Face cache is downloaded into it (default: the cache only)")


def _engine_flags(p: argparse.ArgumentParser) -> None:
    """One flag per EngineConfig field (sub-configs included) that declares one."""
    groups = {"engine": p.add_argument_group("engine"),
              STREAMING_FLAGS: p.add_argument_group(STREAMING_FLAGS)}
    for _, s, group in flag_settings(EngineConfig):
        flag = s.flag
        assert flag is not None
        text = f"{flag.help or s.doc} (default: {s.flag_default()})".replace("%", "%%")
        g = groups[group]
        if s.check is BOOL:
            g.add_argument(flag.long, action=argparse.BooleanOptionalAction, default=None,
                           help=text)
            continue
        choices = flag.choices or s.check.choices or None
        g.add_argument(*flag.names, type=flag.parse or str, choices=choices, metavar=flag.metavar,
                       help=text)


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
                     help="fit a prompt longer than the context (default: refuse it): a chat "
                          "prompt keeps its system message and both ends of the message, a "
                          "--raw one its end")
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
    verify.add_argument("container", metavar="CONTAINER",
                        help="the container directory, or a named model that is one "
                             "(smollm2-moe-demo), as run and info take it")
    _cache_flag(verify)
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


def engine_from_args(args: argparse.Namespace) -> EngineConfig:
    """The EngineConfig the engine flags ask for (validated: a bad value raises
    ConfigError naming the settings field; :func:`flag_message` names the flag). A flag
    left out keeps its setting's default."""
    given: dict[str, Any] = {}
    for path, s, _ in flag_settings(EngineConfig):
        assert s.flag is not None
        value = getattr(args, s.flag.long[2:].replace("-", "_"), None)
        if value is None:
            continue
        where = given
        for name in path:  # a sub-config's field: {"io": {"workers": 8}}
            where = where.setdefault(name, {})
        where[s.name] = value
    return EngineConfig(**given)


def stops_from_args(args: argparse.Namespace) -> list[str]:
    stops = [unescape(s) for s in args.stop]
    if any(not s for s in stops):
        raise UsageError("argument --stop: the text must not be empty")
    return stops
