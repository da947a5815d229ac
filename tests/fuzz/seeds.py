"""The seed inputs the fuzzers mutate, built from the tiny test models (tests/modelfactory).

    python -m fuzz.seeds OUT      (from tests/; needs torch and transformers, once)

``OUT/outside/`` holds decoys next to the model directories: valid files (a safetensors
shard, a GGUF, a config.json) that an escaping name would reach. A mutant that is loaded
from them reads outside its model directory, which the audit reports.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

GGUF_SEEDS = {"llama": "Q4_0", "qwen3_moe": "Q4_0", "mixtral": "Q4_0", "qwen2_moe": "Q8_0"}
HF_SEEDS = ("llama", "qwen3_moe")
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def _byte_level_tokenizer(path: Path) -> None:
    """A byte-level BPE tokenizer.json with one token per byte (ids 0..255)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from colibri.tokenizers.vocab import byte_decoder

    vocab = {c: b for c, b in byte_decoder().items()}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.save(str(path))


def _sharded_copy(src: Path, dst: Path) -> None:
    """The checkpoint in two shards with a model.safetensors.index.json."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}  # fmt: skip
    weight_map = {}
    for shard, part in shards.items():
        save_file({n: np.ascontiguousarray(tensors[n]) for n in part}, str(dst / shard))
        weight_map.update({n: shard for n in part})
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1)
    )


def _hf_seed(src: Path, dst: Path, sharded: bool) -> None:
    dst.mkdir(parents=True)
    for name in ("config.json", "generation_config.json"):
        shutil.copy(src / name, dst / name)
    if sharded:
        _sharded_copy(src, dst)
    else:
        shutil.copy(src / "model.safetensors", dst / "model.safetensors")
    _byte_level_tokenizer(dst / "tokenizer.json")
    (dst / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHAT_TEMPLATE, "model_max_length": 512})
    )


def build_seeds(out: Path) -> Path:
    """Writes every seed under ``out`` (idempotent: a finished tree is reused)."""
    if (out / "DONE").is_file():
        return out
    from colibri.convert import write_container
    from support.modelfactory import build_tiny_model, write_gguf

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "gguf").mkdir(parents=True)
    tiny = {f: build_tiny_model(f) for f in {*GGUF_SEEDS, *HF_SEEDS}}
    for family, qtype in GGUF_SEEDS.items():
        shutil.copy(tiny[family].gguf[qtype], tmp / "gguf" / f"{family}.gguf")
    # A Llama with rope_freqs (how llama3-scaled GGUFs carry their scaling).
    write_gguf(tiny["llama"].hf_dir, tmp / "gguf" / "llama-rope-freqs.gguf", "Q8_0",
               extra={"rope_freqs": np.linspace(1.0, 4.0, 8, dtype=np.float32)})  # fmt: skip
    for family in HF_SEEDS:
        _hf_seed(tiny[family].hf_dir, tmp / "safetensors" / family, sharded=family == "llama")
    (tmp / "native").mkdir()
    write_container(tmp / "gguf" / "qwen2_moe.gguf", tmp / "native" / "qwen2_moe-gguf")
    write_container(tmp / "safetensors" / "qwen3_moe", tmp / "native" / "qwen3_moe-hf",
                    quant="q8_0")  # fmt: skip
    outside = tmp / "outside"
    outside.mkdir()
    shutil.copy(tmp / "safetensors" / "llama" / "model-00001-of-00002.safetensors",
                outside / "secret.safetensors")  # fmt: skip
    shutil.copy(tmp / "gguf" / "llama.gguf", outside / "secret.gguf")
    shutil.copy(tmp / "safetensors" / "llama" / "config.json", outside / "secret.json")
    (tmp / "DONE").write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


if __name__ == "__main__":
    print(build_seeds(Path(sys.argv[1])))
