"""Chat templates: transformers' apply_chat_template as the oracle, errors, the fallback."""

from __future__ import annotations

import datetime
import warnings
from pathlib import Path
from typing import Any

import pytest

from colibri.chat.template import (
    CHATML_TEMPLATE,
    ChatTemplate,
    apply_chat_template,
    validate_messages,
)
from colibri.errors import InvalidRequestError, ModelFormatError
from colibri.tokenizers import Tokenizer
from support.tokenizer_vectors import (
    gguf_tokenizer,
    hf_tokenizer_dir,
    smollm2_gguf,
    transformers_tokenizer,
    vocab_dir,
)

CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Ünïcode 🦙 <b>&amp;</b> {{ not jinja }}\n  code:\n\tx = 1\n"},
    ],
    [{"role": "user", "content": ""}],
    [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "<|im_end|> is just text here"},
    ],
]

TOOLS = [
    {
        "name": "internet_search",
        "description": "Returns a list of relevant document snippets",
        "parameter_definitions": {
            "query": {"description": "Query", "type": "str", "required": True}
        },
    }
]
DOCUMENTS = [{"title": "Tall penguins", "text": "Emperor penguins are the tallest."}]


@pytest.fixture(scope="module")
def smol() -> Tokenizer:
    tok = gguf_tokenizer(smollm2_gguf())
    assert isinstance(tok, Tokenizer)
    return tok


@pytest.fixture(scope="module")
def smol_ref() -> Any:
    directory = hf_tokenizer_dir("smollm2", smollm2_gguf())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers_tokenizer(directory)


@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
def test_smollm2_template_matches_transformers(
    smol: Tokenizer, smol_ref: Any, conv: int, gen: bool
) -> None:
    messages = CONVERSATIONS[conv]
    expected = smol_ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert apply_chat_template(smol, messages, add_generation_prompt=gen) == expected
    tpl = ChatTemplate.for_tokenizer(smol)
    assert not tpl.is_fallback
    assert tpl.render(messages, add_generation_prompt=gen) == expected
    # transformers matches control tokens in the messages' text too: colibri does so only
    # when asked (special_tokens_in_content=True); by default that text is plain text
    # (tests/chat/test_content_injection.py), the same ids where it holds none.
    ids = apply_chat_template(smol, messages, add_generation_prompt=gen, tokenize=True,
                              special_tokens_in_content=True)
    ref_ids = smol_ref.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen)
    if not isinstance(ref_ids, list):
        ref_ids = ref_ids["input_ids"]
    assert ids == list(ref_ids)
    plain = apply_chat_template(smol, messages, add_generation_prompt=gen, tokenize=True)
    assert (plain == ids) == ("<|im_end|>" not in str(messages))


@pytest.mark.parametrize("name", ["qwen2", "phi-3", "command-r"])
def test_gguf_templates_match_transformers_renderer(name: str) -> None:
    """Other models' templates (from the llama.cpp vocab files) against transformers' renderer."""
    from transformers.utils import chat_template_utils as cu

    d = vocab_dir()
    tok = gguf_tokenizer(d / f"ggml-vocab-{name}.gguf")
    assert isinstance(tok, Tokenizer) and tok.chat_template
    templates = {"default": tok.chat_template, **tok.chat_templates}
    extra: dict[str, Any] = {"tools": TOOLS, "documents": DOCUMENTS}
    for tname, source in templates.items():
        tpl = (
            ChatTemplate.for_tokenizer(tok)
            if tname == "default"
            else ChatTemplate.for_tokenizer(tok, tname)
        )
        for messages in CONVERSATIONS:
            for gen in (True, False):
                rendered, _ = cu.render_jinja_template(
                    conversations=[messages],
                    chat_template=source,
                    add_generation_prompt=gen,
                    bos_token=tok.bos_token,
                    eos_token=tok.eos_token,
                    **extra,
                )
                out = tpl.render(messages, add_generation_prompt=gen, **extra)
                assert out == rendered[0], (name, tname)
    if name == "command-r":
        assert set(tok.chat_templates) == {"tool_use", "rag"}
        with pytest.raises(InvalidRequestError, match="no chat template named 'nope'"):
            ChatTemplate.for_tokenizer(tok, "nope")


def test_fallback_chatml() -> None:
    d = vocab_dir()
    tok = gguf_tokenizer(d / "ggml-vocab-gpt-2.gguf")  # ships no template
    assert isinstance(tok, Tokenizer) and tok.chat_template is None
    tpl = ChatTemplate.for_tokenizer(tok)
    assert tpl.is_fallback and tpl.source == CHATML_TEMPLATE
    out = apply_chat_template(tok, CONVERSATIONS[1][:2])
    assert out == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert apply_chat_template(tok, CONVERSATIONS[0], add_generation_prompt=False).endswith(
        "<|im_end|>\n"
    )


def test_malformed_template() -> None:
    with pytest.raises(
        ModelFormatError, match=r"syntax error at line 2: .*content.*unexpected '}'"
    ):
        ChatTemplate("{% for m in messages %}\n{{ m['content'] }\n{% endfor %}")
    with pytest.raises(ModelFormatError, match="syntax error"):
        ChatTemplate("{% if add_generation_prompt %}no end")
    with pytest.raises(ModelFormatError, match="syntax error"):
        ChatTemplate("{% frobnicate %}")
    with pytest.raises(ModelFormatError):
        ChatTemplate(None)  # type: ignore[arg-type]
    # runtime failures of the template itself
    with pytest.raises(ModelFormatError, match="failed while rendering"):
        ChatTemplate("{{ messages[5]['content'] }}").render(CONVERSATIONS[0])
    with pytest.raises(ModelFormatError, match="unsafe"):
        ChatTemplate("{{ ''.__class__.__mro__ }}").render(CONVERSATIONS[0])
    with pytest.raises(ModelFormatError, match="unsafe"):
        ChatTemplate("{% set x = [] %}{{ x.append(1) }}").render(CONVERSATIONS[0])
    with pytest.raises(ModelFormatError):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render(CONVERSATIONS[0])


def test_raise_exception_is_a_request_error() -> None:
    tpl = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversations must start with a user message') }}{% endif %}ok"
    )
    assert tpl.render(CONVERSATIONS[0]) == "ok"
    with pytest.raises(InvalidRequestError, match="must start with a user message"):
        tpl.render(CONVERSATIONS[1])


BAD_MESSAGES: list[tuple[Any, str]] = [
    ("Hello", "list of dicts"),
    ({"role": "user", "content": "x"}, "list of dicts"),
    (None, "list of dicts"),
    ([], "empty"),
    (["Hello"], r"messages\[0\] must be a dict"),
    ([{"content": "x"}], r"messages\[0\]\['role'\]"),
    ([{"role": "", "content": "x"}], "non-empty str"),
    ([{"role": 3, "content": "x"}], "non-empty str"),
    ([{"role": "user"}], "no 'content'"),
    ([{"role": "user", "content": None}], "must be a str, not NoneType"),
    ([{"role": "user", "content": ["a"]}], "must be a str, not list"),
    ([{"role": "user", "content": "ok"}, {"role": "user", "content": 5}], r"messages\[1\]"),
    ([{"role": "user", "content": "x", "extra": object()}], "cannot be passed"),
]


@pytest.mark.parametrize(("messages", "match"), BAD_MESSAGES)
def test_wrong_message_shapes(messages: Any, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match) as exc:
        ChatTemplate(CHATML_TEMPLATE).render(messages)
    assert isinstance(exc.value, ValueError)


def test_validate_messages_copies() -> None:
    msgs = [{"role": "assistant", "content": "x", "tool_calls": None, "name": "bob"}]
    out = validate_messages(msgs)
    assert out == [{"role": "assistant", "content": "x", "name": "bob"}]
    out[0]["content"] = "changed"
    assert msgs[0]["content"] == "x"
    assert validate_messages(({"role": "user", "content": "t"},)) == [
        {"role": "user", "content": "t"}
    ]


def test_template_helpers() -> None:
    msgs = [{"role": "user", "content": "x"}]
    tpl = ChatTemplate("{{ tools | tojson }}|{{ {'a': '<é&>'} | tojson(indent=2) }}")
    out = tpl.render(msgs, tools=[{"name": "f", "description": "<b>"}])
    assert out == '[{"name": "f", "description": "<b>"}]|{\n  "a": "<é&>"\n}'
    year = str(datetime.datetime.now().year)
    assert ChatTemplate("{{ strftime_now('%Y') }}").render(msgs) == year
    src = (
        "{{ bos_token }}{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}"
    )
    src += "{% if loop.first %}{% break %}{% endif %}{% endfor %}{{ eos_token }}{{ custom }}"
    tpl = ChatTemplate(src, bos_token="<s>", eos_token="</s>")
    assert tpl.render(msgs * 2, custom=7) == "<s>[x]</s>7"
    # trim_blocks / lstrip_blocks, as transformers compiles templates
    tpl = ChatTemplate(
        "{% for m in messages %}\n  {% if true %}\n{{ m.content }}\n  {% endif %}\n{% endfor %}"
    )
    assert tpl.render(msgs) == "x\n"
    assert ChatTemplate("{{ add_generation_prompt }}").render(msgs) == "True"


def test_hf_chat_template_sources(tmp_path: Path) -> None:
    src = hf_tokenizer_dir("smollm2", smollm2_gguf())
    import json
    import shutil

    shutil.copy(src / "tokenizer.json", tmp_path / "tokenizer.json")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "chat_template.jinja").unlink(missing_ok=True)
    assert Tokenizer.from_hf(tmp_path).chat_template is None
    (tmp_path / "chat_template.jinja").write_text("{{ 'from jinja file' }}")
    assert Tokenizer.from_hf(tmp_path).chat_template == "{{ 'from jinja file' }}"
    (tmp_path / "chat_template.jinja").unlink()
    cfg["chat_template"] = [
        {"name": "default", "template": "D"},
        {"name": "tool_use", "template": "T"},
    ]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_hf(tmp_path)
    assert tok.chat_template == "D" and tok.chat_templates == {"tool_use": "T"}
    assert (
        ChatTemplate.for_tokenizer(tok, "tool_use").render([{"role": "user", "content": ""}]) == "T"
    )
