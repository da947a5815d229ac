"""Structured output on the real SmolLM2 (llguidance): every run that finishes with
"stop" is valid, checked by independent validators (the ``jsonschema`` package, Python's
``re``, a list, a hand-written check of the grammar), 20 seeded sampled runs per JSON
schema (nested objects, enums, arrays, bounded integers and strings), a sampled run
per seed for the other kinds."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

import colibri as co
from colibri.errors import InvalidRequestError
from colibri.generate.structured import Choice, Grammar, JsonSchema, Regex
from support.realmodel import smollm2_gguf

RUNS = 20
SAMPLING = co.Sampling(temperature=0.9, top_p=0.95, seed=20240)

PERSON = {  # nested object, enum, bounded integer and string
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "pet": {
            "type": "object",
            "properties": {
                "kind": {"enum": ["cat", "dog", "bird"]},
                "age": {"type": "integer", "minimum": 0, "maximum": 30},
            },
            "required": ["kind", "age"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "pet"],
    "additionalProperties": False,
}
COLORS = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1,
          "maxItems": 3}
REVIEW = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["ok", "stars", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model() -> co.Model:
    return co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=512))


@pytest.mark.parametrize(("schema", "ask"), [
    (PERSON, "Describe a person and their pet as JSON."),
    (COLORS, "List some colors as a JSON array."),
    (REVIEW, "Review a restaurant as JSON."),
], ids=["nested-enum", "array-enum", "bool-int-strings"])
def test_json_schema_output_always_validates(model: co.Model, schema: dict, ask: str) -> None:
    runs = model.generate_n(messages=[{"role": "user", "content": ask}], n=RUNS,
                            max_tokens=96, sampling=SAMPLING,
                            response_format=JsonSchema(schema))
    texts = [g.text for g in runs]
    assert len(set(texts)) > 1  # sampled: the runs differ
    for g in runs:
        assert g.finish_reason == "stop", g.text
        jsonschema.validate(json.loads(g.text), schema)


def test_openai_response_format_mappings(model: co.Model) -> None:
    q = [{"role": "user", "content": "Give me a JSON object about a cat."}]
    g = model.generate(messages=q, max_tokens=96, response_format={
        "type": "json_schema", "json_schema": {"name": "pet", "schema": PERSON}})
    jsonschema.validate(json.loads(g.text), PERSON)
    q = [{"role": "user", "content": "Give me a small JSON object with a name and an age."}]
    g = model.generate(messages=q, max_tokens=128, response_format={"type": "json_object"})
    assert g.finish_reason == "stop" and isinstance(json.loads(g.text), dict)


def test_regex_choice_and_grammars(model: co.Model) -> None:
    q = [{"role": "user", "content": "Write something."}]
    pattern = r"[A-Z][a-z]{2,8} [0-9]{1,3}"
    lark = 'start: NUM " + " NUM " = " NUM\nNUM: /[0-9]{1,3}/\n'
    gbnf = 'root ::= "yes" | "no" | "maybe " [a-z]{1,5}\n'
    for seed in range(5):
        s = SAMPLING.replace(seed=seed)
        g = model.generate(messages=q, max_tokens=24, sampling=s, response_format=Regex(pattern))
        assert g.finish_reason == "stop" and re.fullmatch(pattern, g.text), g.text
        g = model.generate(messages=q, max_tokens=8, sampling=s,
                           response_format=Choice(["alpha", "beta", "gamma delta"]))
        assert g.text in ("alpha", "beta", "gamma delta")
        g = model.generate(messages=q, max_tokens=24, sampling=s, response_format=Grammar(lark))
        m = re.fullmatch(r"([0-9]{1,3}) \+ ([0-9]{1,3}) = ([0-9]{1,3})", g.text)
        assert g.finish_reason == "stop" and m, g.text
        g = model.generate(messages=q, max_tokens=12, sampling=s,
                           response_format=Grammar(gbnf, syntax="gbnf"))
        assert g.finish_reason == "stop" and re.fullmatch(r"yes|no|maybe [a-z]{1,5}", g.text)


def test_constraints_work_in_streams_and_sessions(model: co.Model) -> None:
    ids = model.encode_prompt(messages=[{"role": "user", "content": "Pick a fruit."}])
    fmt = Choice(["apple", "pear"])
    text = "".join(c.text for c in model.stream(ids, max_tokens=8, response_format=fmt))
    s = model.session()
    g = s.generate(ids, max_tokens=8, response_format=fmt)
    assert text == g.text and g.text in ("apple", "pear") and g.finish_reason == "stop"
    assert s.n_tokens == len(ids) + len(g.token_ids) - 1  # the session holds the answer


def test_bad_formats_are_clear_errors(model: co.Model) -> None:
    with pytest.raises(InvalidRequestError, match="regular expression is not valid"):
        model.generate("x", max_tokens=2, response_format=Regex("[0-9"))
    with pytest.raises(InvalidRequestError, match="lark grammar is not valid"):
        model.generate("x", max_tokens=2, response_format=Grammar("start: undefined_rule\n"))
    with pytest.raises(InvalidRequestError, match="unknown type 'xml'"):
        model.generate("x", max_tokens=2, response_format={"type": "xml"})
    with pytest.raises(InvalidRequestError, match="non-empty strings"):
        model.generate("x", max_tokens=2, response_format=Choice([]))


def test_the_matcher_is_never_touched_while_a_mask_is_computed(
        model: co.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    """llguidance's compute_bitmask holds its matcher (GIL released) on the mask thread;
    any other call on it meanwhile raises "Already mutably borrowed" (seen under load as
    a 500 from colibri serve). Every mask here takes 5 ms, and every matcher call made
    while one is pending is recorded: there must be none."""
    import threading
    import time

    import llguidance

    import colibri.generate.structured as structured

    real, pool = llguidance.LLMatcher, structured._MASKS
    pending = threading.Event()
    touched: list[str] = []

    class Executor:
        def submit(self, fn):  # type: ignore[no-untyped-def]
            pending.set()

            def run():  # type: ignore[no-untyped-def]
                try:
                    time.sleep(0.005)
                    return fn()
                finally:
                    pending.clear()
            return pool.submit(run)

    class Forward(type):
        def __getattr__(cls, name: str) -> object:
            return getattr(real, name)

    class Guarded(metaclass=Forward):
        def __init__(self, *args: object, **kwargs: object) -> None:
            self._m = real(*args, **kwargs)

        def compute_bitmask(self) -> object:
            return self._m.compute_bitmask()

        def __getattr__(self, name: str) -> object:
            attr = getattr(self._m, name)

            def call(*args: object, **kwargs: object) -> object:
                if pending.is_set():
                    touched.append(name)
                return attr(*args, **kwargs)
            return call

    monkeypatch.setattr(structured, "_MASKS", Executor())
    monkeypatch.setattr(llguidance, "LLMatcher", Guarded)
    g = model.chat("Is water wet?", max_tokens=8, response_format=Choice(["yes", "no"]))
    assert g.text in ("yes", "no")
    g = model.chat("A city as JSON.", max_tokens=24,
                   response_format=JsonSchema({"type": "object"}))
    assert touched == []
