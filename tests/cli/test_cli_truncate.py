"""``colibri run --truncate`` (issue 38, item 9): a chat prompt keeps its system message,
the template's turns and both ends of the user's message (its middle goes); a raw prompt
keeps its end; ``--json``'s ``prompt.token_ids`` are the tokens prefilled."""

from __future__ import annotations

import json
from typing import Any

import colibri as co
from support.cli_run import assert_one_line_error, colibri_cli
from support.realmodel import smollm2_gguf

CTX = 128
WORDS = " ".join(f"w{i}" for i in range(300))
MESSAGE = f"Summarize the list below.\n{WORDS}\nWhat is its last word?"


def _run_json(*args: str) -> dict[str, Any]:
    proc = colibri_cli("run", "-m", str(smollm2_gguf()), "-c", str(CTX), "-n", "4", "-t", "2",
                       "--truncate", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # --json: one record on stdout, nothing else
    rec: dict[str, Any] = json.loads(proc.stdout)
    assert rec["stats"]["prompt_tokens"] == len(rec["prompt"]["token_ids"])
    return rec


def _model() -> co.Model:
    return co.Model.load(smollm2_gguf(), progress=False,
                         engine=co.EngineConfig(context_length=CTX))


def test_a_chat_prompt_keeps_its_system_message_and_both_ends() -> None:
    rec = _run_json("--system", "Answer in one word.", MESSAGE)
    ids = rec["prompt"]["token_ids"]
    assert rec["prompt"]["truncated"]["cut_from"] == "middle"
    assert rec["prompt"]["truncated"]["cut_tokens"] > 0
    with _model() as model:
        text = model.tokenizer.decode(ids)
        messages = [{"role": "system", "content": "Answer in one word."},
                    {"role": "user", "content": MESSAGE}]
        assert ids == model.fit_prompt(messages=messages, max_tokens=4).ids
    assert text.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>\n"
                           "<|im_start|>user\nSummarize the list below.\nw0 w1")
    assert "\n[...]\n" in text
    assert text.endswith("w299\nWhat is its last word?<|im_end|>\n<|im_start|>assistant\n")
    assert len(ids) <= CTX - 4


def test_a_raw_prompt_keeps_its_end_and_lists_what_was_prefilled() -> None:
    rec = _run_json("--raw", WORDS)
    with _model() as model:
        full = model.encode_prompt(WORDS)
    assert rec["prompt"]["token_ids"] == full[-(CTX - 4):]
    assert rec["prompt"]["truncated"] == {"dropped_messages": 0,
                                          "cut_tokens": len(full) - (CTX - 4),
                                          "cut_from": "start"}
    short = _run_json("--raw", "Hello")  # nothing cut: the whole prompt, truncated null
    assert short["prompt"]["truncated"] is None


def test_truncation_is_said_on_stderr_and_refused_without_the_flag() -> None:
    path = str(smollm2_gguf())
    proc = colibri_cli("run", "-m", path, "-c", str(CTX), "-n", "2", "-t", "2", "--truncate",
                       MESSAGE)
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("colibri: --truncate: cut ")
    assert first.endswith(f" tokens from the middle of the message to fit the context of "
                          f"{CTX} tokens")
    proc = colibri_cli("run", "-m", path, "-c", str(CTX), "-n", "2", MESSAGE)
    assert_one_line_error(proc, 1, "--truncate to cut the middle of the message",
                          "--context-length")
    proc = colibri_cli("run", "-m", path, "-c", str(CTX), "-n", "2", "--raw", MESSAGE)
    assert_one_line_error(proc, 1, "--truncate to keep its end")
