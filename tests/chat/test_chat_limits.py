"""Chat templates under resource limits (issue 8, defect 3).

A template comes from the model file. Hostile ones (each from the defect report, and the
other amplifications the limits cover) must fail fast with a ModelFormatError naming the
template, within bounded memory; real ones (llama.cpp's collection of 70 templates and
the GGUF vocabularies') must render byte-identically to transformers' renderer.
"""

from __future__ import annotations

import resource
import threading
import time
import warnings
from typing import Any

import pytest
from test_chat import CONVERSATIONS, DOCUMENTS, TOOLS

from colibri.chat import template as chat
from colibri.chat.limits import TemplateLimits, text_size
from colibri.chat.template import ChatTemplate
from colibri.errors import ModelFormatError
from support.tokenizer_vectors import templates_dir

MESSAGES = [{"role": "user", "content": "hi"}]

# name -> (template, what the error says)
HOSTILE: dict[str, tuple[str, str]] = {
    "range 10**9": ("{% for i in range(10**9) %}{% endfor %}", "range"),
    "recursive macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nest"),
    "'x' * 10**10": ("{{ 'x' * 10**10 }}", "repetition"),
    "[0] * 10**9": ("{{ [0] * 10**9 }}", "repetition"),
    "center(10**9)": ("{{ 'x'|center(10**9) }}", "center"),
    "str.center": ("{{ 'x'.center(10**9) }}", "center"),
    "str.ljust": ("{{ 'x'.ljust(10**9) }}", "ljust"),
    "tojson(indent=10**8)": ("{{ messages|tojson(indent=10**8) }}", "indent"),
    "nested range loops": ("{% for i in range(100000) %}{% for j in range(100000) %}"
                           "{% endfor %}{% endfor %}", "iterations|longer than"),  # 0.5 s idle
    "doubling with ~": ("{% set ns = namespace(s='x') %}{% for i in range(60) %}"
                        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "concatenation"),
    "doubling with +": ("{% set ns = namespace(s='x') %}{% for i in range(60) %}"
                        "{% set ns.s = ns.s + ns.s %}{% endfor %}", "concatenation"),
    "squaring an int": ("{% set ns = namespace(x=3) %}{% for i in range(60) %}"
                        "{% set ns.x = ns.x * ns.x %}{% endfor %}", "bits"),
    "huge power": ("{{ 7 ** 123456789 }}", "bits"),
    "shared references joined": ("{{ (['x' * 100000] * 100000)|join }}", "join"),
    "shared references printed": ("{{ ['x' * 100000] * 100000 }}", "output"),
    "shared references tojson": ("{{ (['x' * 100000] * 100000)|tojson }}", "tojson"),
    "shared references string": ("{{ (['x' * 100000] * 100000)|string }}", "string"),
    "a block buffering copies": ("{% set y %}{% for i in range(100000) %}{{ 'x' * 100000 }}"
                                 "{% endfor %}{% endset %}{{ y|length }}", "built"),
    "printf width *": ("{{ '%*s' % (10**9, 'x') }}", "%-formatted"),
    "printf width": ("{{ '%1000000000s' % 'x' }}", "%-formatted"),
    "format filter width": ("{{ '%1000000000s'|format('x') }}", "%-formatted"),
    "str.format width": ("{{ '{:>1000000000}'.format('x') }}", "str.format"),
    "str.format nested width": ("{{ '{:{w}}'.format('x', w=10**9) }}", "str.format"),
    "str.replace": ("{{ ('a' * 100000).replace('a', 'b' * 100000) }}", "replace"),
    "replace filter": ("{{ ('a' * 100000)|replace('a', 'b' * 100000) }}", "replace"),
    "str.join": ("{{ ('x' * 100000).join(['y'] * 100000) }}", "join"),
    "str.expandtabs": ("{{ ('\t' * 100000).expandtabs(100000) }}", "expandtabs"),
    "str.translate": ("{{ ('a' * 100000).translate({97: 'b' * 100000}) }}", "translate"),
    "indent filter": ("{{ ('\n' * 100000)|indent(100000) }}", "indent"),
    "wordwrap filter": ("{{ ('a ' * 100000)|wordwrap(1, wrapstring='x' * 100000) }}",
                        "wordwrap"),
    "slice filter": ("{{ [1]|slice(10**9)|list }}", "slice"),
    "batch filter": ("{{ [1]|batch(10**9)|list }}", "batch"),
    # its size estimate walks 300,000 items (0.1 s of CPU): on a loaded machine the
    # deadline can come first
    "sum of lists": ("{{ ([['x'] * 100000] * 100000)|sum(start=[]) }}", "sum|longer than"),
    # Fuzz mutant #1502 (seed 1): its size estimate walked half a million items between two
    # deadline checks (0.5 s of CPU, 4 s on the loaded machine); now refused from the
    # list's length alone (test_size_estimate_refuses_a_long_list_without_walking_it)
    "sum of many short lists": ("{{ ([['x'] * 1000] * 1000000)|sum(start=[]) }}",
                                "sum filter's result would be"),
    "map center": ("{{ range(100000)|map('string')|map('center', 100000)|join }}", "built"),
    "recursive loop": ("{% for x in [[1]] recursive %}{{ loop([[1]]) }}{% endfor %}", "nest"),
    "raise_exception of a huge value": ("{{ raise_exception(['x' * 100000] * 100000) }}",
                                        "raise_exception"),
    "lipsum": ("{{ lipsum(10**9) }}", "lipsum"),
    "urlize": ("{{ 'a.com '|urlize(target='x' * 10**6) }}", "urlize"),
    "busy loop": ("{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}"
                  "{% endfor %}{% endfor %}", "longer than|iterations"),
    "deep nesting": ("{{ " + "(" * 50000 + "1" + ")" * 50000 + " }}", "cannot be compiled"),
    "division by zero": ("{{ 1 / 0 }}", "ZeroDivisionError"),
    "float overflow": ("{{ 10.0 ** 400 }}", "OverflowError"),
    "a huge template": ("x" * (2 << 20), "characters long"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_template_is_a_model_format_error(name: str) -> None:
    source, says = HOSTILE[name]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(ModelFormatError, match=says) as info:
        ChatTemplate(source, name="model's chat template").render(MESSAGES)
    seconds = time.perf_counter() - t0
    assert "model's chat template" in str(info.value)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    # Peak growth far below the gigabytes these take without limits (ru_maxrss only grows,
    # so this bounds this test's own growth from wherever earlier tests left the peak).
    assert grown_mib < 512, f"{name}: peak memory grew by {grown_mib:.0f} MiB"
    assert seconds < 30, f"{name}: {seconds:.1f} s"  # loose: the deadline itself is 0.4 s


def test_size_estimate_refuses_a_long_list_without_walking_it() -> None:
    class Unwalkable(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            raise AssertionError("walked")

    assert text_size(Unwalkable([0] * 1000), limit=1000) > 1000  # 1000 items: >= 4000
    assert text_size({k: 0 for k in range(200)}, limit=1000) > 1000
    assert text_size([0] * 100, limit=1000) == 402  # under the limit: counted as before


def test_deadline_stops_a_filter_looping_over_a_large_value() -> None:
    # Four chained select filters test 4 million items without calling a single hook of
    # the budget between (select runs its own loop): the budget's checks alone let this run
    # to the end (18 s on the loaded 2-core machine for one select); the watchdog
    # (chat_deadline.py) stops it at the deadline, wherever the Python code is.
    src = ("{{ (['x'] * 1000000)|select('defined')|select('defined')|select('defined')"
           "|select('defined')|list|length }}")
    limits = TemplateLimits(seconds=0.2)
    t0 = time.perf_counter()
    with pytest.raises(ModelFormatError, match="longer than 0.2 s of CPU time"):
        ChatTemplate(src, limits=limits).render(MESSAGES)
    assert time.perf_counter() - t0 < 30  # loose: a stop at the deadline, not at the end
    # the thread goes on normally afterwards: no interruption left pending
    assert ChatTemplate("{{ 'ok' }}", limits=limits).render(MESSAGES) == "ok"
    assert sum(range(10**6)) == 499999500000


def test_render_deadline_counts_cpu_time_not_a_busy_machine() -> None:
    # A render that needs ~0.07 s of CPU while other threads contend for the GIL takes
    # several times that on the wall clock (0.8-2.2 s with 2-12 spinning threads); the
    # deadline counts the rendering thread's CPU time, so a busy process slows a template
    # down without refusing it. (With a wall-clock deadline this test fails.)
    src = "{% for i in range(3) %}{% for j in range(100000) %}{% endfor %}{% endfor %}done"
    limits = TemplateLimits(seconds=0.3)
    tpl = ChatTemplate(src, limits=limits)
    t0 = time.thread_time()
    assert tpl.render(MESSAGES) == "done"
    alone = time.thread_time() - t0
    assert alone < 0.15, f"the render alone used {alone:.2f} s of CPU"  # the premise
    wall = 0.0
    # More contention until the render is past the wall-clock limit (how much a spinning
    # thread slows the render varies with the host's scheduling: CI once needed over 24).
    for n in (6, 12, 24, 48, 96):
        stop = threading.Event()

        def spin(stop: threading.Event) -> None:
            while not stop.is_set():
                pass

        spinners = [threading.Thread(target=spin, args=(stop,), daemon=True)
                    for _ in range(n)]
        for t in spinners:
            t.start()
        try:
            w0 = time.perf_counter()
            assert tpl.render(MESSAGES) == "done"
            wall = time.perf_counter() - w0
        finally:
            stop.set()
            for t in spinners:
                t.join()
        if wall > limits.seconds:
            break
    # the premise of the test: on the wall clock this render was past its deadline
    assert wall > limits.seconds, f"{wall:.2f} s: the contention did not slow the render"


def test_compile_deadline_stops_a_template_built_to_compile_for_seconds() -> None:
    # 128 KiB of tags (the source-size limit) took 1.7-2.5 s to compile at an idle core
    # before the compile had a deadline; it is stopped after compile_seconds of the
    # compiling thread's CPU time, and the thread goes on normally afterwards.
    src = "{% if x %}a{% endif %}" * 5900
    assert len(src) < TemplateLimits().max_source_chars
    cpu0 = time.thread_time()
    with pytest.raises(ModelFormatError, match=r"more than 0.05 s of CPU time to compile"):
        ChatTemplate(src, limits=TemplateLimits(compile_seconds=0.05))
    # the stop came near the deadline, not at the end of a 2 s compile (CPU time of this
    # thread: a loaded machine does not inflate it; Python's own compiler, the one step
    # the deadline cannot interrupt, gets no source here: the parse is cut short first)
    assert time.thread_time() - cpu0 < 1.0
    assert ChatTemplate("{{ 'ok' }}").render(MESSAGES) == "ok"
    assert sum(range(10**6)) == 499999500000


def test_largest_real_templates_compile_well_within_the_deadline() -> None:
    """The compile deadline is CPU time, so a busy machine does not refuse a real template:
    the largest ones known (15-17 KB) use about a third of the default budget."""
    files = sorted(templates_dir().glob("*.jinja"), key=lambda p: -p.stat().st_size)[:8]
    assert files[0].stat().st_size > 15_000
    for path in files:
        chat._compile.cache_clear()  # compiled for real, not found in the cache
        cpu0 = time.thread_time()
        ChatTemplate(path.read_text(encoding="utf-8"))
        used = time.thread_time() - cpu0
        assert used < TemplateLimits().compile_seconds, f"{path.name}: {used:.2f} s of CPU"


def test_limits_are_settings() -> None:
    src = "{% for i in range(n) %}{{ i }}{% endfor %}"
    assert ChatTemplate(src).render(MESSAGES, n=1000).endswith("999")
    tight = TemplateLimits(max_range=10)
    assert ChatTemplate(src, limits=tight).render(MESSAGES, n=10) == "0123456789"
    with pytest.raises(ModelFormatError, match="range"):
        ChatTemplate(src, limits=tight).render(MESSAGES, n=11)
    with pytest.raises(ModelFormatError, match="longer than"):
        ChatTemplate("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                     "{% endfor %}", limits=TemplateLimits(seconds=0.05,
                                                           max_iterations=10**12)).render(MESSAGES)


def test_a_long_conversation_still_renders() -> None:
    """The size limits grow with the input: a 4 MB document goes through a template."""
    content = "word " * 800_000
    tpl = ChatTemplate("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content']|trim }}\n"
                       "{% endfor %}")
    out = tpl.render([{"role": "user", "content": content}] * 2)
    assert len(out) == 2 * (len(content.strip()) + len("<|user|>\n"))


_TOOLS_OPENAI = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city"}}, "required": ["city"]}}}]


def test_real_templates_render_as_transformers_does() -> None:
    """Every template of llama.cpp's collection (70 real models), with and without tools,
    renders byte-identically to transformers' renderer (or fails in both)."""
    cu = pytest.importorskip("transformers.utils.chat_template_utils")
    d = templates_dir()
    files = sorted(d.glob("*.jinja"))
    assert len(files) >= 50
    compared = 0
    for path in files:
        source = path.read_text(encoding="utf-8")
        tpl = ChatTemplate(source, bos_token="<s>", eos_token="</s>", name=path.name)
        for messages in CONVERSATIONS:
            extras: list[dict[str, Any]] = [{}, {"tools": _TOOLS_OPENAI},
                                            {"tools": TOOLS, "documents": DOCUMENTS}]
            for extra in extras:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        expected: str | None = cu.render_jinja_template(
                            conversations=[messages], chat_template=source,
                            add_generation_prompt=True, bos_token="<s>", eos_token="</s>",
                            **extra)[0][0]
                except Exception:
                    expected = None
                try:
                    out: str | None = tpl.render(messages, add_generation_prompt=True, **extra)
                except Exception:
                    out = None
                assert out == expected, (path.name, messages, list(extra))
                compared += expected is not None
    assert compared > 500


def test_repeated_keyword_argument_opens_no_file(tmp_path: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`namespace(role='', role='')` is a SyntaxError of the Python Jinja generates, which
    Python's compiler reports by opening '<template>' in the working directory (template
    fuzzer, mutant 16687 of seed 1). It is refused before Python compiles anything."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "<template>").write_text("SECRET\n" * 200)
    opened: list[str] = []
    import sys

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and "<template>" in str(args[0]):
            opened.append(str(args[0]))

    sys.addaudithook(audit)  # cannot be removed: it only records
    with pytest.raises(ModelFormatError, match="keyword argument repeated: role") as info:
        ChatTemplate("{%- set ns = namespace(role='', role='') -%}{{ ns.role }}",
                     bos_token="", eos_token="", name="t")
    assert "SECRET" not in str(info.value)
    assert opened == []
    ok = ChatTemplate("{%- set ns = namespace(role='a', other='b') -%}{{ ns.role }}{{ ns.other }}",
                      bos_token="", eos_token="", name="t")
    assert ok.render([{"role": "user", "content": "x"}]) == "ab"


@pytest.mark.parametrize("control", ["continue", "break"])
def test_loop_control_outside_a_loop_opens_no_file(control: str, tmp_path: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's compiler quotes a SyntaxError's line by opening the file it names: Jinja
    names '<template>', so a `{% continue %}` outside a loop read '<template>' from the
    working directory. It is refused before Python compiles anything."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "<template>").write_text("SECRET\n" * 200)
    opened: list[str] = []
    import sys

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and "<template>" in str(args[0]):
            opened.append(str(args[0]))

    sys.addaudithook(audit)  # cannot be removed: it only records
    src = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{% " + control + " %}"
    with pytest.raises(ModelFormatError, match=f"'{control}' outside a loop") as info:
        ChatTemplate(src, bos_token="<s>", eos_token="</s>", name="t")
    assert "SECRET" not in str(info.value)
    assert opened == []
    # Inside a loop (and in a loop's macro-free body) they still work.
    ok = ChatTemplate("{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}"
                      "{{ m.content }}{% endfor %}", bos_token="", eos_token="", name="t")
    assert ok.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "b"
