"""transformers' answer on the real SmolLM2 (the ``reference`` fixture): the oracle that
tests/oracle/test_smollm2.py, tests/chat/test_templates_api.py and
tests/generate/test_logprobs.py compare against."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import transformers

from support.modelfactory import cache_root
from support.realmodel import smollm2_gguf

QUESTION = "What is the capital of France?"
N_NEW = 40


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    """transformers' prompt ids, greedy answer and logits over prompt + answer (cached on
    disk next to the test models: loading the GGUF into transformers takes ~20 s)."""
    path = smollm2_gguf()
    cache = cache_root() / f"smollm2-reference-{path.stat().st_size}.npz"
    if cache.is_file():
        with np.load(cache) as z:
            return {k: z[k] for k in z.files}
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=True
    )
    if not isinstance(ids, list):  # a BatchEncoding in some versions
        ids = list(ids["input_ids"])
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=N_NEW,
            do_sample=False,
            eos_token_id=None,  # no early stop: compare N_NEW tokens
            pad_token_id=tok.eos_token_id,
        )
        seq = out[0].tolist()
        logits = model(torch.tensor([seq])).logits[0].float().numpy()
    answer = tok.decode(seq[len(ids) :], skip_special_tokens=False)
    ref = {
        "prompt": np.asarray(ids, dtype=np.int64),
        "sequence": np.asarray(seq, dtype=np.int64),
        "logits": logits,
        "answer": np.asarray(answer),
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, **ref)  # type: ignore[arg-type]
    os.replace(tmp, cache)
    return ref
