"""Stop strings are bounded and cheap: a call may give at most MAX_STOP_STRINGS of them,
each at most MAX_STOP_LENGTH characters (InvalidRequestError from the Python API, a 400
from the server; a 60,000-character stop string used to take 11.6 s and 1.77 GiB, 10^5
short ones 231 s), and StopChecker's work per token does not grow with the text so far
or with the length of the strings."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import colibri as co
from colibri.errors import InvalidRequestError
from colibri.generate.request import MAX_STOP_LENGTH, MAX_STOP_STRINGS, parse_request
from colibri.sampling import StopChecker
from support.realmodel import smollm2_gguf

TOO_MANY = [f"stop{i}" for i in range(MAX_STOP_STRINGS + 1)]
TOO_LONG = "x" * (MAX_STOP_LENGTH + 1)


def test_the_limits_are_checked_when_the_request_is_parsed() -> None:
    assert parse_request({"stop": [f"s{i}" for i in range(MAX_STOP_STRINGS)]}).stop
    assert parse_request({"stop": "x" * MAX_STOP_LENGTH}).stop
    with pytest.raises(InvalidRequestError, match=f"at most {MAX_STOP_STRINGS}"):
        parse_request({"stop": TOO_MANY})
    for stop in (TOO_LONG, ["a", TOO_LONG]):
        with pytest.raises(InvalidRequestError,
                           match=f"1001 characters; at most {MAX_STOP_LENGTH}"):
            parse_request({"stop": stop})


def _per_token(checker: StopChecker, tokens: list[str]) -> float:
    t = time.perf_counter()
    for i, text in enumerate(tokens):
        assert not checker.feed(i, text).done
    return (time.perf_counter() - t) / len(tokens)


def test_time_per_token_stays_flat_as_the_text_grows() -> None:
    # Strings that keep a long prefix of themselves pending most of the time.
    stops = ["ab" * 499 + "c", "b" * 999 + "!", *(f"{i}x" for i in range(MAX_STOP_STRINGS - 2))]
    checker = StopChecker(stops)
    tokens = ["ab", "b", "ba", "abab"] * 1_000
    first = _per_token(checker, tokens)
    for _ in range(10):  # 40,000 tokens later
        _per_token(checker, tokens)
    last = _per_token(checker, tokens)
    assert last < 3 * first + 1e-5, f"{first * 1e6:.1f} us then {last * 1e6:.1f} us a token"
    assert len(checker.held) < MAX_STOP_LENGTH


def test_a_long_stop_string_costs_linear_time() -> None:
    """StopChecker itself takes any strings (the limits are the request's): a 60,000-
    character one is still read once per character."""
    t = time.perf_counter()
    checker = StopChecker(["a" * 60_000 + "b"])
    for i in range(15_001):  # 60,004 of them
        assert not checker.feed(i, "aaaa").done
    assert checker.feed(15_001, "b").stop_string is not None
    assert time.perf_counter() - t < 2.0


@pytest.fixture(scope="module")
def model() -> Iterator[co.Model]:
    with co.Model.load(smollm2_gguf(), progress=False,
                       engine=co.EngineConfig(context_length=128)) as m:
        yield m


def test_the_python_api_refuses_them(model: co.Model) -> None:
    for stop in (TOO_MANY, TOO_LONG):
        with pytest.raises(InvalidRequestError):
            model.generate("Hi", max_tokens=1, stop=stop)


def test_the_server_answers_400(model: co.Model) -> None:
    from fastapi.testclient import TestClient

    from colibri.server import create_app

    with TestClient(create_app(model, model_name="m")) as client:
        for stop in (TOO_MANY, TOO_LONG):
            for path, body in (
                    ("/v1/chat/completions",
                     {"messages": [{"role": "user", "content": "Hi"}], "stop": stop}),
                    ("/v1/completions", {"prompt": "Hi", "stop": stop}),
                    ("/v1/messages", {"messages": [{"role": "user", "content": "Hi"}],
                                      "stop_sequences": [stop] if isinstance(stop, str)
                                      else stop})):
                r = client.post(path, json={"model": "m", "max_tokens": 1, **body})
                assert r.status_code == 400, (path, r.status_code, r.text[:300])
                assert "at most" in r.text
        ok = client.post("/v1/completions", json={"model": "m", "max_tokens": 1,
                                                  "prompt": "Hi", "stop": ["a", "b"]})
        assert ok.status_code == 200, ok.text
