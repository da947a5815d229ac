"""Real end to end on SmolLM2-135M-Instruct: colibri's own tokenizer, chat template and
generate loop against transformers loading the same GGUF (its tokenizer, its template, its
greedy generate). Activations in float32 so the arithmetic is transformers' own
(tests/oracle/test_smollm2.py explains why int8 activations flip a near-tie on this model)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers

import colibri
from support.modelfactory import cache_root
from support.realmodel import smollm2_gguf

PROMPTS = [
    "What is the capital of France?",
    "What is 2+2?",
    "Write a haiku about the sea.",
    "Explain in one sentence why the sky is blue.",
    "Give me three tips for learning Python.",
    "Translate 'good morning' into Spanish.",
]
MAX_NEW = 40


@pytest.fixture(scope="module")
def reference() -> list[dict[str, list[int]]]:
    """transformers' prompt ids and greedy ids per prompt (cached on disk: loading the GGUF
    into transformers takes ~20 s)."""
    path = smollm2_gguf()
    cache = cache_root() / f"smollm2-e2e-{path.stat().st_size}-{len(PROMPTS)}-{MAX_NEW}.json"
    if cache.is_file():
        data: list[dict[str, list[int]]] = json.loads(cache.read_text())
        return data
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    out = []
    for p in PROMPTS:
        ids = tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True
        )
        if not isinstance(ids, list):
            ids = list(ids["input_ids"])
        with torch.no_grad():
            seq = model.generate(
                torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                pad_token_id=tok.eos_token_id,
            )[0].tolist()  # fmt: skip
        out.append({"prompt": ids, "generated": seq[len(ids) :]})
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, cache)
    return out


@pytest.fixture(scope="module")
def model() -> colibri.Model:
    return colibri.Model.load(
        smollm2_gguf(),
        engine=colibri.EngineConfig(context_length=256, activation_precision="float32"),
    )


@pytest.mark.parametrize("i", range(len(PROMPTS)), ids=[p[:24] for p in PROMPTS])
def test_generate_equals_transformers(
    model: colibri.Model, reference: list[dict[str, list[int]]], i: int
) -> None:
    messages = [{"role": "user", "content": PROMPTS[i]}]
    g = model.generate(messages=messages, max_tokens=MAX_NEW)
    assert g.prompt_ids == reference[i]["prompt"]
    # transformers stops after emitting EOS; so does colibri (finish_reason "stop").
    assert g.token_ids == reference[i]["generated"]
    if g.finish_reason == "stop":
        assert g.token_ids[-1] in model.tokenizer.eos_ids


def test_capital_of_france_answers_paris(model: colibri.Model) -> None:
    g = model.generate(messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=MAX_NEW)
    assert "Paris" in g.text
