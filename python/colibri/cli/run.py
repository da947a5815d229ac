"""``colibri run``: one prompt, the answer streamed to stdout (or one JSON record)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, TextIO

from ..chat.fit import FittedPrompt
from ..engine.stats import ExpertStats, MemoryStats, PhaseTimes
from ..errors import ContextOverflowError
from ..generate.generation import GenerationStats
from ..progress import PROGRESS_DELAY
from ..sampling import Sampling
from ..settings.config import format_bytes
from .common import Loaded, load_model
from .parser import (
    UsageError,
    engine_from_args,
    sampling_from_args,
    spec_from_args,
    stops_from_args,
)

RUN_SCHEMA = "colibri.run/1"

PROGRESS_MIN_TOKENS = 2048
"""Prompts at least this long show a prefill progress line from their first chunk (on a
terminal only); shorter ones once their prefill has run PROGRESS_DELAY seconds."""


class PrefillProgress:
    """``progress(done, total)`` for Session.forward that keeps one status line on a
    terminal: ``colibri: prompt 1536/4030 tokens (38%), 95 tok/s, 26 s left``. It writes
    nothing when `err` is not a terminal, or for a short prompt whose prefill is quick;
    :meth:`clear` erases the line before the answer is printed."""

    def __init__(self, err: TextIO, total: int, min_tokens: int | None = None) -> None:
        isatty = getattr(err, "isatty", None)
        least = PROGRESS_MIN_TOKENS if min_tokens is None else min_tokens
        self.enabled = callable(isatty) and bool(isatty())
        self._long = total >= least
        self._err = err
        self._t0 = time.perf_counter()
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or done >= total:
            self.clear()
            return
        elapsed = time.perf_counter() - self._t0
        if not (self._long or self._shown or elapsed >= PROGRESS_DELAY):
            return
        rate = done / elapsed if elapsed > 0 else 0.0
        left = f", {(total - done) / rate:.0f} s left" if rate > 0 else ""
        self._err.write(f"\r\x1b[Kcolibri: prompt {done}/{total} tokens "
                        f"({100 * done // total}%), {rate:.0f} tok/s{left}")
        self._err.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self._err.write("\r\x1b[K")
            self._err.flush()
            self._shown = False


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


def summary_line(stats: GenerationStats, finish: str, load_seconds: float | None = None,
                 mode: str = "") -> str:
    """The first line of the summary ``colibri run`` prints to stderr; `mode` says how the
    prompt was made ("chat template" or "raw")."""
    load = f"load {load_seconds:.2f} s, " if load_seconds is not None else ""
    how = f" ({mode})" if mode else ""
    return (
        f"colibri: {load}{stats.prompt_tokens} prompt tokens{how}, {stats.generated_tokens} "
        f"generated; prefill {stats.prefill_tok_s:.1f} tok/s, decode "
        f"{stats.decode_tok_s:.1f} tok/s; finish: {finish}"
    )


# The streaming tier's figures. GenerationStats.experts / .phases / .wait_policy and
# ModelStats.memory are read with getattr so that this module works with a model that
# does not report them (a dense model, or a build without the expert store).


def generation_experts(stats: GenerationStats) -> ExpertStats | None:
    value = getattr(stats, "experts", None)
    return value if isinstance(value, ExpertStats) else None


def generation_phases(stats: GenerationStats) -> PhaseTimes | None:
    value = getattr(stats, "phases", None)
    return value if isinstance(value, PhaseTimes) else None


def wait_policy_in_effect(stats: GenerationStats | None, model_stats: object = None) -> str:
    """The wait policy the core used ("passive" when auto chose it); "" if not reported."""
    for source in (stats, model_stats):
        value = getattr(source, "wait_policy", "")
        if isinstance(value, str) and value:
            return value
    return ""


def model_memory(model_stats: object) -> MemoryStats | None:
    value = getattr(model_stats, "memory", None)
    return value if isinstance(value, MemoryStats) else None


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _dur(seconds: float) -> str:
    """``"1.25 s"``, ``"120 ms"``, ``"0.00245 ms"``: three significant digits below 1 s,
    so that a small model's phases do not all read 0.00 s."""
    if seconds >= 1 or seconds <= 0:
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.3g} ms"


def experts_line(e: ExpertStats) -> str:
    """``experts: 1200 hits, 80 misses (93.8% hit rate); read 1.0 GiB in 100 reads,
    1.25 s (819 MiB/s), stalled 400 ms; prefetch 300 issued, 250 used, 50 wasted (recall
    83.3%); 12 evictions``"""
    parts = [
        f"experts: {e.hits} hits, {e.misses} misses ({_pct(e.hit_rate)} hit rate)",
        f"read {format_bytes(e.bytes_read)} in {e.reads} reads, {_dur(e.read_seconds)}"
        + (f" ({format_bytes(int(e.read_throughput))}/s)" if e.read_seconds > 0 else "")
        + f", stalled {_dur(e.stall_seconds)}",
    ]
    if e.prefetch_issued or e.routed_after_prediction:
        parts.append(f"prefetch {e.prefetch_issued} issued, {e.prefetch_used} used, "
                     f"{e.prefetch_wasted} wasted (recall {_pct(e.prefetch_recall)})")
    parts.append(f"{e.evictions} evictions")
    if e.read_errors or e.checksum_failures:
        parts.append(f"{e.read_errors} read errors, {e.checksum_failures} checksum failures")
    return "; ".join(parts)


def phases_line(p: PhaseTimes, wait_policy: str = "", configured: str = "") -> str:
    """``time: attention 120 ms, dense 10 ms, router 20 ms, expert matmul 800 ms, expert
    wait 400 ms, lm_head 50 ms; wait policy passive (auto)``"""
    line = (f"time: attention {_dur(p.attention)}, dense {_dur(p.dense)}, router "
            f"{_dur(p.router)}, expert matmul {_dur(p.expert_matmul)}, expert wait "
            f"{_dur(p.expert_wait)}, lm_head {_dur(p.lm_head)}")
    if wait_policy:
        # "passive (auto)" when auto chose it; the core may say so itself ("auto (passive)").
        chosen = f" ({configured})" if configured and configured not in wait_policy else ""
        line += f"; wait policy {wait_policy}{chosen}"
    return line


def memory_line(m: MemoryStats) -> str:
    """``memory: budget 12.0 GiB = dense 3.1 GiB + KV 768 MiB + work 83.0 MiB + expert
    cache 8.0 GiB (655 slots of 12.5 MiB; 600 in use, 120 pinned); experts 6144, 56.9 GiB
    on disk``"""
    return (
        f"memory: budget {format_bytes(m.budget)} = dense {format_bytes(m.dense_bytes)} + KV "
        f"{format_bytes(m.kv_bytes)}"
        + (f" + MTP KV {format_bytes(m.mtp_kv_bytes)}" if m.mtp_kv_bytes else "")
        + f" + work {format_bytes(m.work_bytes)} + expert cache "
        f"{format_bytes(m.cache_bytes)} ({m.cache_slots} slots of {format_bytes(m.slot_bytes)}; "
        f"{m.cached_experts} in use, {m.pinned_experts} pinned); experts {m.total_experts}, "
        f"{format_bytes(m.expert_bytes)} on disk"
    )


def summary_lines(loaded: Loaded, stats: GenerationStats, finish: str,
                  mode: str = "") -> list[str]:
    """The summary ``colibri run`` prints to stderr: the speed line, and for a model with
    routed experts the generation's expert cache and I/O figures, its time per phase (and
    the wait policy in effect) and the RAM split."""
    lines = [summary_line(stats, finish, loaded.load_seconds, mode)]
    if stats.spec is not None:
        sp = stats.spec
        lines.append(f"colibri: speculative ({sp.drafter}): {sp.accepted}/{sp.drafted} drafts "
                     f"accepted ({_pct(sp.acceptance)}), {sp.tokens_per_forward:.2f} tokens "
                     f"per forward, {sp.verify_forwards} verify + {sp.plain_forwards} plain")
    model = loaded.model
    if model.config.n_experts <= 0:
        return lines
    model_stats = model.stats()
    experts = generation_experts(stats)
    if experts is not None:
        lines.append("colibri: " + experts_line(experts))
    phases = generation_phases(stats)
    if phases is not None:
        configured = model.threads.wait_policy.value
        lines.append("colibri: " + phases_line(phases, wait_policy_in_effect(stats, model_stats),
                                               configured))
    memory = model_memory(model_stats)
    if memory is not None:
        lines.append("colibri: " + memory_line(memory))
    return lines


def run_record(
    loaded: Loaded,
    args: argparse.Namespace,
    prompt: str,
    prompt_ids: FittedPrompt | list[int],
    text: str,
    token_ids: list[int],
    finish: str,
    stats: GenerationStats,
) -> dict[str, Any]:
    """The record ``colibri run --json`` prints (schema in docs/cli.md); `prompt_ids` are
    the ids prefilled (and what --truncate cut to fit them)."""
    fitted = prompt_ids if isinstance(prompt_ids, FittedPrompt) else FittedPrompt(prompt_ids)
    model = loaded.model
    threads = model.threads
    engine = model.engine_config
    routed = model.config.n_experts > 0
    model_stats = model.stats() if routed else None
    experts = generation_experts(stats) if routed else None
    phases = generation_phases(stats) if routed else None
    memory = model_memory(model_stats) if routed else None
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
            "token_ids": fitted.ids,
            "truncated": fitted.to_dict() if fitted.truncated else None,
        },
        "text": text,
        "token_ids": token_ids,
        "finish_reason": finish,
        "stats": {
            **stats.to_dict(),
            "decode_tokens": stats.decode_tokens,
            "load_seconds": loaded.load_seconds,
            "wait_policy": wait_policy_in_effect(stats, model_stats) or None,
            "experts": experts.to_dict() if experts is not None else None,
            "phases": phases.to_dict() if phases is not None else None,
            "memory": memory.to_dict() if memory is not None else None,
        },
        "settings": {
            "max_tokens": args.max_tokens,
            "stop": stops_from_args(args),
            "sampling": sampling_from_args(args).to_dict(),
            "threads": threads.team_size(),
            "wait_policy": threads.wait_policy.value,
            "context_length": model.context_length,
            "activation_precision": model.engine_config.activation_precision.value,
            "ram_budget": engine.ram_budget,
            "io": engine.io.to_dict(),
            "cache": engine.cache.to_dict(),
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
    try:
        return _generate(loaded, args, prompt, sampling, stops, out, err)
    finally:
        loaded.model.close()  # saves the routing history (what --cache-policy pinned learns)


def _prompt_ids(loaded: Loaded, args: argparse.Namespace, prompt: str) -> FittedPrompt:
    """The prompt's ids as they will be prefilled: with --truncate, fitted to the context
    (Model.fit_prompt: a chat prompt keeps its system message and the template's turns,
    losing the middle of the user message; a raw one keeps its end)."""
    model = loaded.model
    messages = [{"role": "user", "content": prompt}]
    if args.system is not None:
        messages.insert(0, {"role": "system", "content": args.system})
    ids = model.encode_prompt(prompt) if args.raw else model.encode_prompt(messages=messages)
    ctx = model.context_length
    if len(ids) < ctx:
        return FittedPrompt(ids)
    if not args.truncate:
        limit = model.config.max_position_embeddings
        how = "keep its end" if args.raw else "cut the middle of the message"
        raise ContextOverflowError(
            f"the prompt has {len(ids)} tokens but the context holds {ctx} (and at least one "
            f"more is needed to answer); shorten it, pass --truncate to {how}, or raise "
            f"--context-length (this model allows up to {limit})"
        )
    if args.raw:
        return model.fit_prompt(ids, max_tokens=args.max_tokens)
    return model.fit_prompt(messages=messages, max_tokens=args.max_tokens)


def truncation_line(fitted: FittedPrompt, context: int) -> str:
    """``colibri: --truncate: cut 1,200 tokens from the middle of the message to fit the
    context of 4096 tokens`` (what --truncate did, on stderr before the answer)."""
    where = ("the middle of the message" if fitted.cut_from == "middle"
             else "the start of the prompt")
    return (f"colibri: --truncate: cut {fitted.cut_tokens:,} tokens from {where} to fit the "
            f"context of {context} tokens")


def _generate(loaded: Loaded, args: argparse.Namespace, prompt: str, sampling: Sampling,
              stops: list[str], out: TextIO, err: TextIO) -> int:
    model = loaded.model
    fitted = _prompt_ids(loaded, args, prompt)
    ids = fitted.ids
    if fitted.truncated and not args.quiet and not args.json:
        err.write(truncation_line(fitted, model.context_length) + "\n")
        err.flush()
    mode = "raw" if args.raw else "chat template"
    pieces: list[str] = []
    token_ids: list[int] = []
    finish = "interrupted"
    progress = PrefillProgress(err, len(ids)) if not args.quiet else None
    try:
        for chunk in model.stream(ids, max_tokens=args.max_tokens, sampling=sampling, stop=stops,
                                  truncate=args.truncate,
                                  progress=False if progress is None else progress,
                                  spec=spec_from_args(args)):
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
        if progress is not None:
            progress.clear()
        if not args.json:  # --json: stdout holds one record or nothing, stderr no summary
            out.write("\n")
            out.flush()
            stats = model.stats().last
            if stats is not None and not args.quiet:
                err.write("".join(line + "\n"
                                  for line in summary_lines(loaded, stats, finish, mode)))
        raise
    stats = model.stats().last
    assert stats is not None  # the stream has ended, so its record exists
    text = "".join(pieces)
    if args.json:
        record = run_record(loaded, args, prompt, fitted, text, token_ids, finish, stats)
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
    else:
        if not text.endswith("\n"):
            out.write("\n")
        if not args.quiet:
            err.write("".join(line + "\n" for line in summary_lines(loaded, stats, finish, mode)))
    out.flush()
    return 0
