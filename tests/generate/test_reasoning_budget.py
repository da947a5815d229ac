"""reasoning_budget (issue 34, item 1): the most tokens the output spends inside a <think>
block before colibri writes its closing marker for the model. On the real SmolLM2 with a
template that opens the block in the prompt, greedy, so the unbudgeted run is the reference
the budgeted one must follow token for token until the budget is spent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import colibri as co
from colibri.sampling.reasoning_split import closing_text
from support.realmodel import smollm2_gguf

THINKING = ("{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{%- endfor -%}{%- if add_generation_prompt -%}<|im_start|>assistant\n"
            "<think>\n{%- endif -%}{#- closed with </think> -#}")
HI = [{"role": "user", "content": "Say hello to the world"}]
GREEDY = co.Sampling(temperature=0.0)
# SmolLM2 would end at once after "<think>\n"; min_tokens keeps it writing.
OPTS = {"sampling": GREEDY, "min_tokens": 40}


@pytest.fixture(scope="module")
def model() -> Iterator[co.Model]:
    m = co.Model.load(smollm2_gguf(), engine=co.EngineConfig(
        threads=co.ThreadConfig(n=2), context_length=256))
    m.chat_template = THINKING
    yield m
    m.close()


def test_budget_closes_the_block_after_that_many_tokens(model: co.Model) -> None:
    free = model.generate(messages=HI, max_tokens=40, **OPTS)
    closing = model.tokenizer.encode(closing_text("think_opened"), add_special_tokens=False)
    # The reference never closes its block within 40 tokens, so the cap is what acts.
    assert free.text == "" and len(free.reasoning) > 0
    for budget in (0, 1, 6):
        g = model.generate(messages=HI, max_tokens=40, reasoning_budget=budget,
                           **OPTS)
        assert g.token_ids[:budget] == free.token_ids[:budget]  # untouched until spent
        assert g.token_ids[budget:budget + len(closing)] == closing
        # The block's text: what came before the forced "\n</think>" (its newline kept, as
        # in a block the model closes itself), leading whitespace dropped by the splitter.
        head = model.tokenizer.decode(g.token_ids[:budget])
        assert g.reasoning == (head + "\n").lstrip()
        assert g.text  # the model answers after the forced close
        assert len(g.token_ids) <= 40


def test_budget_larger_than_the_reasoning_changes_nothing(model: co.Model) -> None:
    free = model.generate(messages=HI, max_tokens=30, **OPTS)
    g = model.generate(messages=HI, max_tokens=30, reasoning_budget=100, **OPTS)
    assert g.token_ids == free.token_ids and g.reasoning == free.reasoning


def test_stream_follows_the_same_tokens(model: co.Model) -> None:
    g = model.generate(messages=HI, max_tokens=30, reasoning_budget=4, **OPTS)
    chunks = list(model.stream(messages=HI, max_tokens=30, reasoning_budget=4,
                               **OPTS))
    assert [c.token_id for c in chunks if c.token_id is not None] == g.token_ids
    assert "".join(c.reasoning for c in chunks) == g.reasoning
    assert "".join(c.text for c in chunks) == g.text


def test_output_without_a_block_is_untouched(model: co.Model) -> None:
    plain = model.generate("The capital of France is", max_tokens=12, **OPTS)
    g = model.generate("The capital of France is", max_tokens=12, reasoning_budget=0,
                       **OPTS)
    assert g.token_ids == plain.token_ids


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_bad_budget_is_refused(model: co.Model, bad: object) -> None:
    with pytest.raises(co.errors.InvalidRequestError, match="reasoning_budget"):
        model.generate(messages=HI, max_tokens=4, reasoning_budget=bad)
