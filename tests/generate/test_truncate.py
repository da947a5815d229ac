"""``truncate=True`` on a conversation (issue 38, item 9): the system message and the
template's turns stay; the oldest turns go first, then the middle of the last user message;
a raw prompt keeps its end. ``Model.fit_prompt`` says what was prefilled and what was cut."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import colibri as co
from colibri.chat.fit import CUT_MARK
from colibri.errors import ContextOverflowError
from support.realmodel import smollm2_gguf

CTX = 128
SYSTEM = {"role": "system", "content": "Answer in French."}


@pytest.fixture(scope="module")
def model() -> Iterator[co.Model]:
    with co.Model.load(smollm2_gguf(), progress=False, engine=co.EngineConfig(
            threads=co.ThreadConfig(n=2), context_length=CTX)) as m:
        yield m


def _text(model: co.Model, ids: list[int]) -> str:
    return model.tokenizer.decode(ids)


def _turn(n: int, words: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"question {n} " * words},
            {"role": "assistant", "content": f"answer {n} " * words}]


def test_a_conversation_drops_its_oldest_turns_only(model: co.Model) -> None:
    last = {"role": "user", "content": "And the last question?"}
    conv = [SYSTEM, *_turn(1, 20), *_turn(2, 8), *_turn(3, 4), last]
    with pytest.raises(ContextOverflowError, match="system message and last turn"):
        model.generate(messages=conv, max_tokens=16)
    fitted = model.fit_prompt(messages=conv, max_tokens=16)
    room = CTX - 16
    assert fitted.truncated and fitted.cut_tokens == 0 and fitted.cut_from is None
    assert len(fitted.ids) <= room
    kept = [SYSTEM, *conv[1 + fitted.dropped_messages:]]
    assert fitted.ids == model.apply_chat_template(kept, tokenize=True)
    # Whole turns, as few as fit: one turn fewer dropped would not fit.
    assert fitted.dropped_messages in (2, 4)
    fewer = [SYSTEM, *conv[1 + fitted.dropped_messages - 2:]]
    assert len(model.apply_chat_template(fewer, tokenize=True)) > room
    text = _text(model, fitted.ids)
    assert text.startswith("<|im_start|>system\nAnswer in French.<|im_end|>")
    assert "question 1" not in text and "And the last question?" in text
    assert text.endswith("<|im_start|>assistant\n")
    # What generate, stream and chat prefill.
    g = model.generate(messages=conv, max_tokens=16, truncate=True)
    assert g.prompt_ids == fitted.ids and 0 < len(g.token_ids) <= 16
    assert model.chat(conv[1:], system=SYSTEM["content"], max_tokens=16,
                      truncate=True).prompt_ids == fitted.ids


def test_a_long_last_message_loses_its_middle(model: co.Model) -> None:
    words = " ".join(f"w{i}" for i in range(300))
    conv = [SYSTEM, *_turn(1, 4), {"role": "user", "content":
            f"Summarize the list below.\n{words}\nWhat is the last word?"}]
    fitted = model.fit_prompt(messages=conv, max_tokens=8)
    assert fitted.cut_from == "middle" and fitted.dropped_messages == 2
    assert 0 < fitted.cut_tokens and len(fitted.ids) <= CTX - 8
    text = _text(model, fitted.ids)
    assert text.startswith("<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\n"
                           "Summarize the list below.\nw0 w1 ")
    assert CUT_MARK in text and "w150 " not in text
    assert text.endswith(" w298 w299\nWhat is the last word?<|im_end|>\n<|im_start|>assistant\n")
    assert "question 1" not in text
    g = model.generate(messages=conv, max_tokens=8, truncate=True)
    assert g.prompt_ids == fitted.ids


def test_a_system_message_longer_than_the_room_keeps_the_end(model: co.Model) -> None:
    """The last resort: the fixed part alone does not fit, the rendered prompt keeps its
    end as a raw prompt does (the answer's header and the user's question stay)."""
    conv = [{"role": "system", "content": "Be brief. " * 100},
            {"role": "user", "content": "Hello?"}]
    full = model.apply_chat_template(conv, tokenize=True)
    fitted = model.fit_prompt(messages=conv, max_tokens=8)
    assert fitted.cut_from == "start" and fitted.ids == full[-(CTX - 8):]
    assert fitted.cut_tokens == len(full) - (CTX - 8)


def test_a_raw_prompt_keeps_its_end(model: co.Model) -> None:
    prompt = " ".join(f"w{i}" for i in range(300))
    full = model.encode_prompt(prompt)
    fitted = model.fit_prompt(prompt, max_tokens=8)
    assert fitted.cut_from == "start" and fitted.ids == full[-(CTX - 8):]
    assert model.generate(prompt, max_tokens=8, truncate=True).prompt_ids == fitted.ids
    assert model.fit_prompt(full, max_tokens=8) == fitted  # ids as given, the same rule
    # At most half the context is kept for the answer.
    assert len(model.fit_prompt(prompt, max_tokens=1000).ids) == CTX // 2


def test_a_prompt_that_fits_is_whole(model: co.Model) -> None:
    conv = [SYSTEM, {"role": "user", "content": "Hi"}]
    fitted = model.fit_prompt(messages=conv)
    assert not fitted.truncated and fitted.ids == model.apply_chat_template(conv, tokenize=True)
    assert model.fit_prompt(messages="Hi").ids == model.apply_chat_template("Hi", tokenize=True)
    assert model.fit_prompt("Hi").ids == model.encode_prompt("Hi")
