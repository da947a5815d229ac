"""Chat-template mutation fuzzer (issue 8: the chat template harness).

Seeds are real templates (llama.cpp's collection of 70 models, when available, and a few
built in); each mutant gets 1-3 structure-aware mutations of its Jinja tags: integer
literals set to 0/+-1/2^31/2^63/10^9..., hostile constructs inserted at tag boundaries
(``range(10**9)``, ``'x' * N``, recursive macros, nested loops, ``center(N)``,
``tojson(indent=N)``, sandbox escapes), tags deleted, duplicated, swapped or cut,
identifiers and filter names replaced, expressions wrapped in amplifiers. Every mutant is
compiled and rendered (with and without tools) in a child process forked from a worker
that has colibri imported, under a memory cap (RLIMIT_AS: the worker's size + 2 GiB) and a
timeout, and classified:

- ``colibri_error``: a colibri.errors exception (the expected rejection);
- ``success``: rendered without error (a mutant that is still a valid template);
- ``other_exception``: any other exception (a bug: must be 0);
- ``signal``: the child died by a signal (a crash: must be 0);
- ``timeout``: still running at the timeout (a hang: must be 0);
- ``escape``: the template opened a file, ran a process or a socket (audit hook; must be 0).

The campaign is deterministic for a given seed (mutant i is made from Random(seed, i)).
Run it from the repository root:

    PYTHONPATH=python:build/dev/<build> python tests/fuzz/fuzz_chat_template.py \\
        --mutants 20000 --seed 1 --json /tmp/chat_fuzz.json

The pytest entry points are in test_fuzz_chat_template.py (a short campaign in the default
suite, the long one with ``-m slow``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
REGRESSIONS = HERE / "regressions" / "chat_template"
OUTCOMES = ("colibri_error", "success", "other_exception", "signal", "timeout", "escape")
FAILURES = ("other_exception", "signal", "timeout", "escape")

BUILTIN_SEEDS = [
    # ChatML (colibri's fallback; SmolLM2 and Qwen2 use this shape)
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}",
    # Llama-2 style with a system prompt and raise_exception
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}",
    # tools, namespace, tojson, macros
    "{%- macro render(t) -%}{{ t|tojson(indent=2) }}{%- endmacro -%}"
    "{%- set ns = namespace(first=true) -%}{%- if tools %}<tools>{% for t in tools %}"
    "{{ render(t) }}{% endfor %}</tools>{% endif -%}{%- for m in messages -%}"
    "{%- if ns.first %}{% set ns.first = false %}{% endif -%}"
    "<|{{ m.role }}|>{{ m.content|trim }}{{ '\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif -%}",
]

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}}}}}]

SIZES = ["0", "1", "-1", "7", "100", "100000", "1000000", "2147483648", "9223372036854775808",
         "10**9", "10**18", "2**63", "-2**63", "10**100"]

PAYLOADS = [
    "{{ 'x' * N }}", "{{ [0] * N }}", "{{ 'x'|center(N) }}", "{{ 'x'.ljust(N) }}",
    "{{ 'x'.zfill(N) }}", "{{ messages|tojson(indent=N) }}",
    "{% for i in range(N) %}{{ i }}{% endfor %}",
    "{% for i in range(N) %}{% for j in range(N) %}{% endfor %}{% endfor %}",
    "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}",
    "{% macro r(n) %}{{ caller() }}{% call r(n) %}x{% endcall %}{% endmacro %}{{ r(1) }}",
    "{{ N ** N }}", "{{ 7 ** N }}", "{{ '%*s' % (N, 'x') }}", "{{ '%Ns' % 'x' }}",
    "{{ '{:>N}'.format('x') }}", "{{ '{:{w}}'.format('x', w=N) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(N) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(x=3) %}{% for i in range(N) %}{% set ns.x = ns.x * ns.x %}"
    "{% endfor %}", "{{ ('a' * N)|replace('a', 'bb') }}",
    "{{ ('a' * 1000).replace('a', 'b' * N) }}",
    "{{ (['y' * 1000] * N)|join }}", "{{ ['y' * 1000] * N }}", "{{ range(N)|list|tojson }}",
    "{{ raise_exception('x' * N) }}", "{{ strftime_now('%Y' * N) }}",
    "{% for x in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "{{ lipsum(N) }}", "{{ cycler(*range(N)).next() }}", "{{ namespace(**{'_x': 1}) }}",
    "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "{{ messages.__class__ }}", "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ self.__init__.__globals__ }}", "{{ joiner().__init__.__globals__ }}",
    "{{ cycler.__init__.__globals__.os }}", "{{ namespace.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}", "{{ messages.pop() }}", "{{ messages.append(1) }}",
    "{{ messages[0].update({'role': 'x'}) }}", "{% include 'x' %}",
    "{% extends '/etc/passwd' %}", "{% import 'os' as os %}", "{% from 'x' import y %}",
    "{{ config }}", "{{ request }}", "{% filter center(N) %}x{% endfilter %}",
    "{{ (messages * N)|length }}", "{{ messages[N] }}", "{{ messages[0]['content'][N:] }}",
    "{{ 1 / 0 }}", "{{ 1 // 0 }}", "{{ 10.0 ** N }}", "{{ 'x'|wordwrap(N) }}",
    "{{ 'x'|indent(N) }}", "{{ [1]|batch(N)|list }}", "{{ [1]|slice(N)|list }}",
    "{{ 'a'.encode('utf-16') * N }}", "{{ dict(a=1) * N }}",
    "{{ (tools or [])|tojson(indent=N) }}", "{{ ('\\t' * 1000).expandtabs(N) }}",
    "{{ ('a' * 1000).translate({97: 'b' * N}) }}", "{{ range(N)|sum }}",
    "{{ ([['x'] * 1000] * N)|sum(start=[]) }}", "{{ range(N)|map('string')|join(',' * N) }}",
    "{{ 'x'|format(N) }}", "{{ '%s' * N % () }}", "{{ 'a'|urlize(target='x' * N) }}",
    "{% set y %}{% for i in range(N) %}{{ 'x' * 1000 }}{% endfor %}{% endset %}{{ y|length }}",
    "{{ (" + "(" * 200 + "1" + ")" * 200 + ") }}", "{{ " + "[" * 300 + "]" * 300 + " }}",
    "{% for a in range(N) %}{% for b in range(N) %}{% for c in range(N) %}{{ '' }}"
    "{% endfor %}{% endfor %}{% endfor %}", "{{ messages|map(attribute='content')|join * N }}",
    "{% for m in messages * N %}{{ m.content }}{% endfor %}", "{{ (bos_token ~ eos_token) * N }}",
    "{% break %}", "{% continue %}", "{% raw %}{{ x }}", "{{ x }", "{% if %}", "{% endfor %}",
]

IDENTIFIERS = ["messages", "message", "content", "role", "tools", "range(100000)",
               "messages * 100000", "loop", "ns", "none", "true", "''", "[]", "{}",
               "raise_exception", "namespace", "cycler", "joiner", "bos_token * 100000",
               "add_generation_prompt", "loop.length", "messages|length", "self", "caller"]

FILTERS = ["abs", "attr", "batch", "capitalize", "center", "count", "default", "dictsort",
           "escape", "first", "float", "forceescape", "format", "groupby", "indent", "int",
           "items", "join", "last", "length", "list", "lower", "map", "max", "min", "pprint",
           "random", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
           "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "tojson",
           "trim", "truncate", "unique", "upper", "urlencode", "urlize", "wordcount",
           "wordwrap", "xmlattr", "nope"]

_TAG = re.compile(r"(\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\})", re.DOTALL)
_INT = re.compile(r"(?<![\w.])\d+(?![\w.])")
_NAME = re.compile(r"(?<![\w.'\"])[A-Za-z_]\w*")
_FILTER = re.compile(r"\|\s*([a-z_]+)")


def _segments(source: str) -> list[str]:
    return [s for s in _TAG.split(source) if s]


def _payload(rng: random.Random) -> str:
    return rng.choice(PAYLOADS).replace("N", rng.choice(SIZES))


def _mutate_once(source: str, rng: random.Random) -> tuple[str, str]:
    segs = _segments(source) or [source]
    tags = [i for i, s in enumerate(segs) if _TAG.fullmatch(s)]
    # Weighted toward mutations that keep the template valid (they reach the render and
    # its limits); the rest break the syntax, which the compile must reject cleanly.
    op = rng.choice(["int", "int", "insert", "insert", "insert", "amplify", "amplify",
                     "identifier", "identifier", "filter", "wrap", "delete", "duplicate",
                     "truncate", "swap", "flip"])
    if op == "int" and tags:
        i = rng.choice(tags)
        hits = list(_INT.finditer(segs[i]))
        if hits:
            m = rng.choice(hits)
            segs[i] = segs[i][:m.start()] + rng.choice(SIZES) + segs[i][m.end():]
            return "".join(segs), "int"
    if op == "insert" or not tags:
        at = rng.randrange(len(segs) + 1)
        segs.insert(at, _payload(rng))
        return "".join(segs), "insert"
    if op == "delete":
        del segs[rng.choice(tags)]
        return "".join(segs), "delete"
    if op == "duplicate":
        i = rng.choice(tags)
        j = rng.randrange(i, min(len(segs), i + 6)) + 1
        segs[i:i] = segs[i:j] * rng.choice([1, 2, 3])
        return "".join(segs), "duplicate"
    if op == "truncate":
        return "".join(segs[: rng.randrange(len(segs) + 1)]), "truncate"
    if op == "swap" and len(tags) > 1:
        a, b = rng.sample(tags, 2)
        segs[a], segs[b] = segs[b], segs[a]
        return "".join(segs), "swap"
    if op == "identifier":
        i = rng.choice(tags)
        names = list(_NAME.finditer(segs[i]))
        if names:
            m = rng.choice(names)
            segs[i] = segs[i][:m.start()] + rng.choice(IDENTIFIERS) + segs[i][m.end():]
            return "".join(segs), "identifier"
    if op == "filter":
        i = rng.choice(tags)
        fs = list(_FILTER.finditer(segs[i]))
        if fs:
            m = rng.choice(fs)
            new = rng.choice(FILTERS)
            if rng.random() < 0.5:
                new += "(" + rng.choice(SIZES) + ")"
            segs[i] = segs[i][:m.start(1)] + new + segs[i][m.end(1):]
            return "".join(segs), "filter"
    if op == "amplify":
        outs = [i for i in tags if segs[i].startswith("{{")]
        if outs:
            i = rng.choice(outs)
            expr = segs[i][2:-2].strip("-+ ")
            n = rng.choice(SIZES)
            form = rng.choice(["({e}) * {n}", "({e})|center({n})", "({e}) ~ ({e})",
                               "[({e})] * {n}", "({e})|tojson(indent={n})",
                               "(({e}) ~ '')|replace('', 'xx')", "({e})|string * {n}"])
            segs[i] = "{{ " + form.format(e=expr, n=n) + " }}"
            return "".join(segs), "amplify"
    if op == "flip":
        i = rng.choice(tags)
        s = segs[i]
        if len(s) > 4:
            k = rng.randrange(2, len(s) - 2)
            segs[i] = s[:k] + rng.choice("{}%#()[]|~*'\"\\.,0123456789_ax-+") + s[k + 1:]
            return "".join(segs), "flip"
    n = rng.choice(SIZES)
    if rng.random() < 0.5:
        return "{% for _w in range(" + n + ") %}" + source + "{% endfor %}", "wrap-loop"
    return ("{% macro _w(d) %}" + source + "{{ _w(d + 1) }}{% endmacro %}{{ _w(0) }}",
            "wrap-recursion")


def make_mutant(seeds: list[str], seed: int, index: int) -> tuple[str, str]:
    """Mutant `index` of the campaign `seed`: (template source, mutations applied)."""
    rng = random.Random(seed * 1_000_003 + index)
    source = rng.choice(seeds)
    ops = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        source, op = _mutate_once(source, rng)
        ops.append(op)
    return source, "+".join(ops)


def load_seeds() -> list[str]:
    seeds = list(BUILTIN_SEEDS)
    sys.path.insert(0, str(TESTS))
    from support.tokenizer_vectors import TEMPLATES_DIR  # fetched by scripts/fetch_test_data.py

    d = TEMPLATES_DIR if any(TEMPLATES_DIR.glob("*.jinja")) else None
    if d is not None:
        seeds += [p.read_text(encoding="utf-8") for p in sorted(d.glob("*.jinja"))]
    return seeds


# --- the child: one mutant -------------------------------------------------------------------


def _render_case(source: str, seconds: float | None) -> dict[str, Any]:
    from colibri.chat.limits import DEFAULT_LIMITS, TemplateLimits
    from colibri.chat.template import ChatTemplate
    from colibri.errors import ColibriError

    limits = TemplateLimits(seconds=seconds) if seconds is not None else DEFAULT_LIMITS
    t0 = time.perf_counter()
    compile_s = render_s = 0.0  # the compile, and the longest single render
    try:
        tpl = ChatTemplate(source, bos_token="<s>", eos_token="</s>", limits=limits)
        compile_s = time.perf_counter() - t0
        cases: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
            (CONVERSATIONS[1], {}), (CONVERSATIONS[0], {"tools": TOOLS})]
        for conv, extra in cases:
            t = time.perf_counter()
            try:
                tpl.render(conv, add_generation_prompt=True, **extra)
            finally:
                render_s = max(render_s, time.perf_counter() - t)
        outcome, error = "success", ""
    except ColibriError as exc:
        outcome, error = "colibri_error", f"{type(exc).__name__}: {str(exc)[:200]}"
    except BaseException as exc:
        outcome, error = "other_exception", f"{type(exc).__name__}: {str(exc)[:200]}"
    if compile_s == 0.0:
        compile_s = time.perf_counter() - t0
    return {"outcome": outcome, "error": error, "compile_seconds": compile_s,
            "render_seconds": render_s, "seconds": time.perf_counter() - t0}


_ALLOWED_OPEN_ROOTS = tuple({os.path.realpath(p) for p in
                             (sys.prefix, sys.base_prefix, sys.exec_prefix) if p})


def _audit(events: list[str]) -> None:
    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and args and isinstance(args[0], (str, bytes)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if not path.startswith(_ALLOWED_OPEN_ROOTS):  # a lazy stdlib import is fine
                events.append(f"open {path}")
        elif event in ("subprocess.Popen", "os.system", "os.exec", "os.spawn", "os.fork",
                       "socket.connect", "socket.bind", "os.remove", "os.rename", "shutil.rmtree"):
            events.append(event)

    sys.addaudithook(hook)


def _vm_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _run_child(source: str, timeout: float, seconds: float | None) -> dict[str, Any]:
    """Forks a child for one mutant; classifies how it ended."""
    cap = _vm_bytes() + (2 << 30)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        try:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
            events: list[str] = []
            _audit(events)
            result = _render_case(source, seconds)
            if events:
                result = {**result, "outcome": "escape", "error": "; ".join(events[:5])}
            os.write(w, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(w)
    data, deadline, timed_out = b"", time.monotonic() + timeout, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            os.kill(pid, signal.SIGKILL)
            break
        ready, _, _ = select.select([r], [], [], left)
        if ready:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            data += chunk
    os.close(r)
    _, status, usage = os.wait4(pid, 0)
    peak = usage.ru_maxrss * 1024  # the child's own peak (pages it touched or made)
    if timed_out:
        return {"outcome": "timeout", "error": f"still running after {timeout} s",
                "seconds": timeout, "peak_bytes": peak}
    if os.WIFSIGNALED(status):
        return {"outcome": "signal", "error": f"signal {os.WTERMSIG(status)}",
                "seconds": timeout - (deadline - time.monotonic()), "peak_bytes": peak}
    try:
        result: dict[str, Any] = json.loads(data)
    except ValueError:
        result = {"outcome": "other_exception", "error": "the child wrote no result",
                  "seconds": 0.0}
    result["peak_bytes"] = peak
    return result


def worker_main(timeout: float, seconds: float | None) -> None:
    """Reads one JSON job per line on stdin, answers one JSON result per line."""
    import pprint  # noqa: F401
    import textwrap  # noqa: F401  (filters import these lazily: not a template's doing)
    import urllib.parse  # noqa: F401

    import colibri.chat

    colibri.chat.ChatTemplate(BUILTIN_SEEDS[0]).render(CONVERSATIONS[0])  # warm every import
    for line in sys.stdin:
        job = json.loads(line)
        result = _run_child(job["source"], timeout, seconds)
        sys.stdout.write(json.dumps({"index": job["index"], **result}) + "\n")
        sys.stdout.flush()


# --- the campaign ----------------------------------------------------------------------------


def _reason(error: str) -> str:
    """A rejection's kind: the limit that was hit, or the kind of template error."""
    for key in ("longer than", "iterations", "nest deeper", "range()", "built more",
                "bits", "indent", "characters long"):
        if key in error:
            return f"limit: {key}"
    if "would be" in error:
        return "limit: size"
    if "syntax error" in error:
        return "syntax error"
    if "unsafe" in error:
        return "sandbox: unsafe operation"
    if "refused the conversation" in error:
        return "raise_exception"
    m = re.search(r"\((\w+(?:Error|Exception|Exceeded)):", error)
    return m.group(1) if m else error.split(":")[0]


@dataclass
class Report:
    mutants: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)  # rejections, by what was hit
    slowest_seconds: float = 0.0  # one mutant, compile and renders together
    slowest_compile_seconds: float = 0.0
    slowest_render_seconds: float = 0.0  # one render (what the deadline bounds)
    peak_bytes: int = 0
    peak_rejection_bytes: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)  # first few of each kind
    slowest: dict[str, Any] = field(default_factory=dict)  # the slowest mutant's record
    wall_seconds: float = 0.0

    def add(self, r: dict[str, Any], source: str, ops: str) -> None:
        self.mutants += 1
        self.outcomes[r["outcome"]] += 1
        if r["seconds"] > self.slowest_seconds:
            self.slowest = {**r, "mutations": ops, "source": source[:2000]}
        self.slowest_seconds = max(self.slowest_seconds, r["seconds"])
        self.slowest_compile_seconds = max(self.slowest_compile_seconds,
                                           r.get("compile_seconds", 0.0))
        self.slowest_render_seconds = max(self.slowest_render_seconds,
                                          r.get("render_seconds", 0.0))
        self.peak_bytes = max(self.peak_bytes, r.get("peak_bytes", 0))
        if r["outcome"] == "colibri_error":
            self.reasons[_reason(r["error"])] += 1
            self.peak_rejection_bytes = max(self.peak_rejection_bytes, r.get("peak_bytes", 0))
        if r["outcome"] in FAILURES and sum(
                f["outcome"] == r["outcome"] for f in self.failures) < 20:
            self.failures.append({**r, "mutations": ops, "source": source[:20000]})

    @property
    def failed(self) -> int:
        return sum(self.outcomes[k] for k in FAILURES)

    def to_dict(self) -> dict[str, Any]:
        return {"mutants": self.mutants, "outcomes": {k: self.outcomes[k] for k in OUTCOMES},
                "slowest_seconds": round(self.slowest_seconds, 3),
                "slowest_compile_seconds": round(self.slowest_compile_seconds, 3),
                "slowest_render_seconds": round(self.slowest_render_seconds, 3),
                "peak_mib": round(self.peak_bytes / 2**20, 1),
                "peak_rejection_mib": round(self.peak_rejection_bytes / 2**20, 1),
                "wall_seconds": round(self.wall_seconds, 1),
                "rejections": dict(self.reasons.most_common()), "slowest": self.slowest,
                "failures": self.failures}

    def summary(self) -> str:
        o = ", ".join(f"{k} {self.outcomes[k]}" for k in OUTCOMES)
        return (f"{self.mutants} mutants: {o}; slowest mutant {self.slowest_seconds:.2f} s "
                f"(compile {self.slowest_compile_seconds:.2f} s, one render "
                f"{self.slowest_render_seconds:.2f} s), peak child RSS "
                f"{self.peak_bytes / 2**20:.0f} MiB (rejection "
                f"{self.peak_rejection_bytes / 2**20:.0f} MiB), {self.wall_seconds:.0f} s wall")


def _worker_env() -> dict[str, str]:
    paths = [p for p in sys.path if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def run_sources(sources: list[tuple[str, str]], workers: int = 2, timeout: float = 10.0,
                seconds: float | None = None, indices: list[int] | None = None) -> Report:
    """Runs (source, description) pairs through child processes; returns the Report.
    `indices` numbers them in the report (default 0, 1, ...)."""
    report = Report()
    lock = threading.Lock()
    t0 = time.perf_counter()

    def drive(part: list[tuple[int, str, str]]) -> None:
        extra = ["--seconds", str(seconds)] if seconds is not None else []
        proc = subprocess.Popen([sys.executable, str(Path(__file__)), "--worker",
                                 "--timeout", str(timeout), *extra], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=_worker_env())
        assert proc.stdin is not None and proc.stdout is not None
        try:
            for index, source, ops in part:
                proc.stdin.write(json.dumps({"index": index, "source": source}) + "\n")
                proc.stdin.flush()
                line = proc.stdout.readline()
                r = json.loads(line) if line else {
                    "outcome": "signal", "error": "the worker died", "seconds": 0.0}
                with lock:
                    report.add(r, source, ops)
                if not line:
                    break
        finally:
            proc.stdin.close()
            proc.wait(60)

    numbers = indices if indices is not None else list(range(len(sources)))
    jobs = [(i, s, d) for i, (s, d) in zip(numbers, sources, strict=True)]
    threads = [threading.Thread(target=drive, args=(jobs[k::workers],)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.wall_seconds = time.perf_counter() - t0
    return report


def run_campaign(mutants: int, seed: int, workers: int = 2, timeout: float = 10.0,
                 seconds: float | None = None, start: int = 0,
                 indices: list[int] | None = None) -> Report:
    """Mutants start .. start + mutants - 1 of `seed` (or exactly `indices`): a long
    campaign can run in slices, and any mutant be rebuilt alone. `seconds` overrides the
    render deadline (TemplateLimits.seconds) in the children."""
    seeds = load_seeds()
    numbers = indices if indices is not None else list(range(start, start + mutants))
    return run_sources([make_mutant(seeds, seed, i) for i in numbers], workers, timeout,
                       seconds, numbers)


def regression_sources() -> list[tuple[str, str]]:
    return [(p.read_text(encoding="utf-8"), p.name) for p in sorted(REGRESSIONS.glob("*.jinja"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mutants", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="first mutant index")
    ap.add_argument("--indices", help="comma-separated mutant indices (instead of a range)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=10.0, help="per mutant, seconds")
    ap.add_argument("--seconds", type=float, help="render deadline (default: colibri's)")
    ap.add_argument("--json", type=Path, help="write the report here")
    ap.add_argument("--save-failures", type=Path, help="write failing mutants here (.jinja)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(args.timeout, args.seconds)
        return 0
    indices = [int(i) for i in args.indices.split(",")] if args.indices else None
    report = run_campaign(args.mutants, args.seed, args.workers, args.timeout, args.seconds,
                          args.start, indices)
    print(report.summary())
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=1))
    if args.save_failures:
        args.save_failures.mkdir(parents=True, exist_ok=True)
        for k, f in enumerate(report.failures):
            (args.save_failures / f"{f['outcome']}-{k}.jinja").write_text(f["source"])
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
