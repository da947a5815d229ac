"""Model.chat, apply_chat_template, count_tokens: one rule for prompts (a str prompt is a
raw completion; messages and chat() use the model's template), checked against
transformers' own apply_chat_template on SmolLM2 (the reference of test_smollm2.py), and
tools passed to a template that renders them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import colibri as co
from colibri.errors import InvalidRequestError
from support.modelfactory import TinyModel, write_gguf
from support.realmodel import smollm2_gguf
from support.smollm2_reference import QUESTION

TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{%- for tool in tools %}\n"
    "{{ tool | tojson }}{%- endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
NOT_CHATML = ("{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
              "<end_of_turn>\n{% endfor %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def model() -> co.Model:
    return co.Model.load(smollm2_gguf(), engine=co.EngineConfig(context_length=256))


def test_template_ids_equal_transformers(
    model: co.Model, reference: dict[str, np.ndarray],
) -> None:
    msgs = [{"role": "user", "content": QUESTION}]
    want = [int(x) for x in reference["prompt"]]
    assert model.apply_chat_template(msgs, tokenize=True) == want
    assert model.apply_chat_template(QUESTION, tokenize=True) == want  # a str: one user turn
    assert model.count_tokens(messages=msgs) == len(want)
    assert model.encode_prompt(messages=msgs) == want
    text = model.apply_chat_template(msgs)
    assert text.endswith("<|im_start|>assistant\n")
    assert not model.apply_chat_template(msgs, add_generation_prompt=False).endswith(
        "assistant\n")
    assert model.count_tokens(QUESTION) == len(model.encode_prompt(QUESTION)) < len(want)


def test_raw_or_templated_is_one_rule(model: co.Model) -> None:
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    templated = model.generate(messages=msgs, max_tokens=16)
    assert model.chat("What is 2+2?", max_tokens=16).token_ids == templated.token_ids
    assert model.chat(msgs, max_tokens=16).prompt_ids == model.apply_chat_template(
        msgs, tokenize=True)
    assert "".join(c.text for c in model.stream_chat(msgs, max_tokens=16)) == templated.text
    raw = model.generate("What is 2+2?", max_tokens=16)
    assert raw.prompt_ids == model.tokenizer.encode("What is 2+2?") != templated.prompt_ids
    sys_ids = model.chat("Hi", system="Answer in French.", max_tokens=1).prompt_ids
    assert "Answer in French." in model.tokenizer.decode(sys_ids)
    # SmolLM2's own template renders no tools but is ChatML: colibri's tool template stands
    # in (tests/chat/test_tool_templates.py). One that is neither refuses them.
    model.chat_template = NOT_CHATML
    try:
        with pytest.raises(InvalidRequestError, match="does not render tools"):
            model.apply_chat_template(msgs, tools=[WEATHER])
    finally:
        model.chat_template = None
    with pytest.raises(InvalidRequestError, match="exactly one of"):
        model.count_tokens()


def test_tools_reach_a_template_that_renders_them(
    tiny_models: dict[str, TinyModel], tmp_path: Path
) -> None:
    path = tmp_path / "tools.gguf"
    write_gguf(tiny_models["llama"].hf_dir, path, "F32", chat_template=TOOL_TEMPLATE)
    m = co.Model.load(path)
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    text = m.apply_chat_template(msgs, tools=[WEATHER])
    assert json.dumps(WEATHER) in text and text.startswith("<|im_start|>system\nTools:")
    assert "Tools:" not in m.apply_chat_template(msgs)
    ids = m.apply_chat_template(msgs, tools=[WEATHER], tokenize=True)
    assert ids == m.tokenizer.encode(text, add_special_tokens=False, special=True)
    assert m.count_tokens(messages=msgs, tools=[WEATHER]) == len(ids)
