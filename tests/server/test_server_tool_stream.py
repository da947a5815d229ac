"""Tool calls streamed as written (issue 34, item 3), end to end through the real server
app: SmolLM2 served in-process with a small template per tool-call format, its output
forced by a regex grammar to a scripted answer (the model generates it token by token, so
the stream sees the call arrive in pieces). The streamed answer must be the non-streamed
one: the same calls (the concatenated ``arguments`` fragments equal to the non-streamed
``arguments`` string), the same text; a long call's arguments start arriving long before
it ends; two calls in one answer; malformed and unterminated calls stay text in both
modes; the official ``openai`` and ``anthropic`` clients' stream helpers read the
streams."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

import colibri as co
from colibri.generate.structured import compile_format
from colibri.server import create_app, routes_anthropic, routes_openai
from colibri.server.tool_formats import deepseek_marker
from support.realmodel import smollm2_gguf

DS_CALLS, DS_CALLS_END = deepseek_marker("tool calls begin"), deepseek_marker("tool calls end")
DS_CALL, DS_CALL_END = deepseek_marker("tool call begin"), deepseek_marker("tool call end")
DS_SEP = deepseek_marker("tool sep")
KIMI = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
        "<|tool_call_end|>", "<|tool_calls_section_end|>")

# The markers that make colibri pick each format (tool_formats.template_format), in a
# ChatML template that renders the tools.
MARKERS = {"hermes": "<tool_call>", "glm": "<tool_call> <arg_key>",
           "kimi_k2": f"{KIMI[0]} {KIMI[1]}", "deepseek_v3": f"{DS_SEP} ```json",
           "deepseek_v31": DS_SEP}


def _template(fmt: str) -> str:
    return ("{%- if tools -%}<|im_start|>system\nTools: {{ tools | tojson }}; call them as "
            + MARKERS[fmt] + "<|im_end|>\n{%- endif -%}"
            "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}")


def _call(fmt: str, name: str, args: dict[str, Any]) -> str:
    """One call as format `fmt` writes it (its template's spelling)."""
    body = json.dumps(args, ensure_ascii=False)
    if fmt == "hermes":
        return f'<tool_call>\n{{"name": "{name}", "arguments": {body}}}\n</tool_call>'
    if fmt == "glm":
        pairs = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>"
                        f"{v if isinstance(v, str) else json.dumps(v)}</arg_value>\n"
                        for k, v in args.items())
        return f"<tool_call>{name}\n{pairs}</tool_call>"
    if fmt == "kimi_k2":
        return f"{KIMI[1]}functions.{name}:0{KIMI[2]}{body}{KIMI[3]}"
    if fmt == "deepseek_v3":
        return f"{DS_CALL}function{DS_SEP}{name}\n```json\n{body}\n```{DS_CALL_END}"
    return f"{DS_CALL}{name}{DS_SEP}{body}{DS_CALL_END}"


def _answer(fmt: str, text: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    inner = "".join(_call(fmt, n, a) for n, a in calls)
    if fmt == "kimi_k2":
        inner = KIMI[0] + inner + KIMI[4]
    elif fmt.startswith("deepseek"):
        inner = DS_CALLS + inner + DS_CALLS_END
    return text + inner


def _literal(text: str) -> str:
    """A regex that matches exactly `text` (llguidance's syntax)."""
    return "".join("\\" + c if c in "\\.+*?()|[]{}^$#&-~" else "\\n" if c == "\n" else c
                   for c in text)


FORCED: list[str] = []  # the regex the next request's output is forced to


def _forcing(make_plan: Any) -> Any:
    def wrapped(*args: Any) -> Any:
        p = make_plan(*args)
        if FORCED:
            model = args[0] if isinstance(args[0], co.Model) else args[0].model
            p.options["response_format"] = compile_format(
                co.Regex(FORCED[0]), model.tokenizer, model.config.vocab_size)
        return p
    return wrapped


@pytest.fixture(scope="module")
def model() -> Iterator[co.Model]:
    with co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=1024)) as m:
        yield m


@pytest.fixture(scope="module")
def apps(model: co.Model) -> Iterator[dict[str, TestClient]]:
    clients: dict[str, TestClient] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(routes_openai, "chat_plan", _forcing(routes_openai.chat_plan))
        mp.setattr(routes_anthropic, "_plan", _forcing(routes_anthropic._plan))
        for fmt in MARKERS:
            clients[fmt] = TestClient(create_app(model, model_name="smollm2",
                                                 chat_template=_template(fmt)),
                                      raise_server_exceptions=False).__enter__()
        yield clients
        for c in clients.values():
            c.__exit__(None, None, None)


TOOLS = [{"type": "function", "function": {"name": n, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "note": {"type": "string"},
                                     "days": {"type": "integer"}}}}}
         for n in ("get_weather", "get_time")]
ASK = [{"role": "user", "content": "Weather?"}]


def _force(text: str) -> None:
    FORCED.clear()
    FORCED.append(_literal(text))


def _chat(c: TestClient, **extra: Any) -> dict[str, Any]:
    r = c.post("/v1/chat/completions", json={"model": "smollm2", "messages": ASK, "tools": TOOLS,
                                             "temperature": 0, "max_tokens": 400, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]  # type: ignore[no-any-return]


def _chunks(c: TestClient, **extra: Any) -> list[dict[str, Any]]:
    body = {"model": "smollm2", "messages": ASK, "tools": TOOLS, "temperature": 0,
            "max_tokens": 400, "stream": True, **extra}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    return [json.loads(ln[6:])["choices"][0] for ln in lines]


def _streamed(chunks: list[dict[str, Any]]) -> tuple[str, list[dict[str, str]], str | None]:
    """(content, calls as {id, name, arguments}, finish_reason) accumulated from deltas."""
    text, calls, finish = "", [], None
    for ch in chunks:
        d = ch["delta"]
        text += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            if tc["index"] == len(calls):  # a call's first delta names it
                assert tc["type"] == "function" and tc["id"] and tc["function"]["name"]
                calls.append({"id": tc["id"], "name": tc["function"]["name"], "arguments": ""})
            else:
                assert tc["index"] == len(calls) - 1 and "name" not in tc["function"]
            calls[tc["index"]]["arguments"] += tc["function"].get("arguments") or ""
        finish = ch["finish_reason"] or finish
    return text, calls, finish


def _whole_calls(choice: dict[str, Any]) -> list[dict[str, str]]:
    return [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in choice["message"].get("tool_calls") or []]


LONG = {"city": "Lyon", "note": " ".join(f"item {i};" for i in range(16)),
        "days": 3}


def test_a_long_calls_arguments_arrive_before_it_ends(apps: dict[str, TestClient]) -> None:
    c = apps["hermes"]
    _force(_answer("hermes", "Let me look.\n", [("get_weather", LONG)]))
    whole = _chat(c)
    chunks = _chunks(c)
    text, calls, finish = _streamed(chunks)
    assert whole["finish_reason"] == finish == "tool_calls"
    assert whole["message"]["content"] == text == "Let me look."
    assert [{"name": k["name"], "arguments": k["arguments"]} for k in calls] \
        == _whole_calls(whole)
    assert json.loads(calls[0]["arguments"]) == LONG
    # Chunk by chunk (one per token): the call opened, then its arguments came over many
    # chunks, the first a short prefix, while the model was still writing the call.
    frames = [i for i, ch in enumerate(chunks) if ch["delta"].get("tool_calls")]
    assert len(frames) > 25
    first = chunks[frames[1]]["delta"]["tool_calls"][0]["function"]["arguments"]
    assert 0 < len(first) < 20 and calls[0]["arguments"].startswith(first)
    closing = next(i for i, ch in enumerate(chunks) if ch["finish_reason"])
    assert frames[1] < closing - 25


@pytest.mark.parametrize("fmt", sorted(MARKERS))
def test_every_format_streams_the_whole_answer(apps: dict[str, TestClient], fmt: str) -> None:
    """Each format's calls: the same calls and text streamed as whole. (Two calls where
    the markers are short; DeepSeek's and Kimi's take many tokens each, and their two-call
    answers are streamed without a model in test_tool_stream.py.)"""
    c = apps[fmt]
    written: list[tuple[str, dict[str, Any]]] = [("get_weather", {"city": "Zürich \"c\"",
                                                                  "days": 2})]
    if fmt in ("hermes", "glm"):
        written.append(("get_time", {"city": "Lyon"}))
    _force(_answer(fmt, "Sure.\n", written))
    whole = _chat(c)
    text, calls, finish = _streamed(_chunks(c))
    assert whole["finish_reason"] == finish == "tool_calls"
    assert (whole["message"]["content"], _whole_calls(whole)) == (
        text, [{"name": k["name"], "arguments": k["arguments"]} for k in calls])
    assert [k["name"] for k in calls] == [n for n, _ in written]
    if fmt == "kimi_k2":  # the id Kimi writes
        assert [k["id"] for k in calls] == ["functions.get_weather:0"]


BAD = [
    ("hermes", 'Sure. <tool_call>{"x": 1}</tool_call>'),  # no name
    ("hermes", 'Sure. <tool_call>{"name": "get_time", "arguments": {"city"}}</tool_call>'),
    ("hermes", 'Sure. <tool_call>{"name": "get_time", "arguments": {"city": '),  # unterminated
    ("glm", "Sure. <tool_call>get_time\n<arg_key>city</arg_key>\n</tool_call>"),
    ("kimi_k2", f"Sure. {KIMI[0]}{KIMI[1]}functions.get_time:0{KIMI[2]}[1]{KIMI[3]}"),
    ("deepseek_v31", f'Sure. {DS_CALLS}{DS_CALL}get_time{DS_SEP}{{"city"'),
]


@pytest.mark.parametrize(("fmt", "output"), BAD)
def test_malformed_and_unterminated_calls_are_text_in_both_modes(
        apps: dict[str, TestClient], fmt: str, output: str) -> None:
    c = apps[fmt]
    _force(output)
    whole = _chat(c)
    text, calls, finish = _streamed(_chunks(c))
    assert "tool_calls" not in whole["message"] and calls == []
    assert whole["message"]["content"] == text == output
    assert whole["finish_reason"] == finish == "stop"
    FORCED.clear()
    assert _chat(c, max_tokens=4)["finish_reason"] == "length"  # still serving


def test_a_call_cut_by_max_tokens(apps: dict[str, TestClient]) -> None:
    """max_tokens ends the output inside a call's arguments: the non-streamed answer drops
    the call; the stream had opened it (what it sent stays, a JSON prefix), and both
    finish with "length" and no content."""
    c = apps["hermes"]
    _force(_answer("hermes", "", [("get_weather", LONG)]))
    whole = _chat(c, max_tokens=40)
    text, calls, finish = _streamed(_chunks(c, max_tokens=40))
    assert whole["finish_reason"] == finish == "length"
    assert "tool_calls" not in whole["message"] and whole["message"]["content"] is None
    assert text == "" and len(calls) == 1 and calls[0]["arguments"].startswith('{"city": ')


MEDIUM = {"city": "Lyon", "note": " ".join(f"item {i};" for i in range(8))}
TWO: list[tuple[str, dict[str, Any]]] = [("get_weather", MEDIUM), ("get_time", {"city": "Lyon"})]


def _client(c: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=c,
                         max_retries=0)


def test_the_openai_clients_stream_helper(apps: dict[str, TestClient]) -> None:
    c = apps["hermes"]
    _force(_answer("hermes", "Two calls.\n", TWO))
    whole = _client(c).chat.completions.create(model="smollm2", messages=ASK, tools=TOOLS,
                                               temperature=0, max_tokens=400)
    kinds: list[str] = []
    with _client(c).chat.completions.stream(model="smollm2", messages=ASK, tools=TOOLS,
                                            temperature=0, max_tokens=400) as stream:
        for ev in stream:
            kinds.append(ev.type)
        final = stream.get_final_completion()
    assert kinds.count("tool_calls.function.arguments.delta") > 15
    assert kinds.count("tool_calls.function.arguments.done") == 2
    got, want = final.choices[0], whole.choices[0]
    assert got.finish_reason == want.finish_reason == "tool_calls"
    assert got.message.content == want.message.content == "Two calls."
    assert [(t.function.name, t.function.arguments) for t in got.message.tool_calls or []] \
        == [(t.function.name, t.function.arguments) for t in want.message.tool_calls or []]


def test_the_anthropic_clients_stream_accumulator(apps: dict[str, TestClient]) -> None:
    c = apps["hermes"]
    client = anthropic.Anthropic(base_url="http://testserver", api_key="unused", http_client=c,
                                 max_retries=0)
    _force(_answer("hermes", "Two calls.\n", TWO))
    kw: dict[str, Any] = dict(model="smollm2", max_tokens=400, messages=ASK,
                              tools=[{"name": t["function"]["name"],
                                      "input_schema": t["function"]["parameters"]}
                                     for t in TOOLS], extra_body={"temperature": 0})
    whole = client.messages.create(**kw)
    deltas: list[str] = []
    with client.messages.stream(**kw) as stream:
        for ev in stream:
            if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                deltas.append(ev.delta.partial_json)
        final = stream.get_final_message()
    assert len(deltas) > 15
    assert final.stop_reason == whole.stop_reason == "tool_use"
    def blocks(m: Any) -> list[tuple[str, Any]]:
        return [(b.type, b.text if b.type == "text" else (b.name, b.input)) for b in m.content]
    assert blocks(final) == blocks(whole) == [
        ("text", "Two calls."), ("tool_use", ("get_weather", MEDIUM)),
        ("tool_use", ("get_time", {"city": "Lyon"}))]
