#!/usr/bin/env python3
"""GGUF fixtures written by llama.cpp's own converter, for tests/sources/test_gguf_fixtures.py.

colibri's tiny test GGUFs (tests/support/modelfactory.py) come from the project's own writer, so a
convention shared by writer and reader (gate/up swapped, the expert axis reversed, Q/K rows
permuted the wrong way) would pass every test. These fixtures close that gap: for each
family in ``FAMILIES`` a tiny random transformers model is saved with ``save_pretrained``
and converted by llama.cpp's ``convert_hf_to_gguf.py`` (its tensor names, stacking, Q/K
permutation, metadata keys), then both are committed under ``tests/fixtures/gguf/<family>/``:

* ``hf/``: config.json + model.safetensors, weights stored in F16 (the oracle: transformers
  loads it, upcast to F32 exactly);
* ``<family>.f16.gguf``: the converter's ``--outtype f16`` output (matrices F16 holding the
  very same values, norms and biases F32);
* ``<family>.q4_1.gguf`` (when llama-cpp-python is installed): that file re-quantized to
  Q4_1 by llama.cpp's own quantizer (``llama_model_quantize``), tensors llama.cpp keeps in
  other types included;
* ``MANIFEST.json``: sizes and SHA-256 of every file, the seed, the converter's version.

Tiny models have no tokenizer, so the converter is given a placeholder vocabulary: the
model class's ``set_vocab`` writes a ``llama`` tokenizer with tokens ``<unk> <s> </s>
<tok3>...`` (the same as tests/support/modelfactory.py's writer). Nothing else in the converter is
changed.

Weights: hidden states kept small (embedding std 1e-3, residual-writing matrices scaled
1e-3) so every RMSNorm works where its epsilon matters, as in tests/support/modelfactory.py's small
variant. The models are deterministic in (family, seed); the committed checkpoint, not the
seed, is the oracle, so a change of torch's RNG cannot silently change a test.

Extending: add an entry to ``FAMILIES`` (a transformers config class and its arguments,
optionally extra config.json keys the converter reads and a weight tweak), run
``python scripts/make_gguf_fixtures.py FAMILY`` and commit the new directory.

Usage::

    python scripts/make_gguf_fixtures.py [FAMILY ...] [--llama-cpp DIR] [--out DIR]

``--llama-cpp`` is an unpacked llama.cpp tree (with convert_hf_to_gguf.py, conversion/ and
gguf-py/); without it the llama-cpp-python 0.3.36 sdist is fetched with pip into
build/test-data/ and unpacked there (the same archive scripts/test.sh fetches).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "tests" / "fixtures" / "gguf"
SDIST = "llama-cpp-python==0.3.36"
SDIST_DIR = REPO / "build" / "test-data" / "sdist"
SEED = 0
VOCAB = 128
SMALL = 1e-3

_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    max_position_embeddings=256,
)  # fmt: skip

Tweak = Callable[[str, Any, Any], None]  # (parameter name, tensor, torch.Generator)


@dataclass(frozen=True)
class Family:
    """One fixture: a transformers config and how to build the model."""

    config_class: str  # transformers config class
    model_class: str  # transformers *ForCausalLM class (also config.json "architectures")
    config: dict[str, Any]  # arguments beyond _COMMON
    extra_config: dict[str, Any] = field(default_factory=dict)  # keys added to config.json
    tweak: Tweak | None = None  # called for every parameter after the standard init
    qk_norm: bool = False  # Q/K RMSNorm: q_proj/k_proj are kept small too


# One row per family. Widths are multiples of 32 so that llama.cpp's quantizer can make
# every matrix Q4_1. qwen2_moe has 16 experts so that an expert order by name ("10" < "2")
# differs from the numeric one; the others 4, to keep the files small.
FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaConfig", "LlamaForCausalLM",
                    dict(intermediate_size=64, rms_norm_eps=1e-5)),
    "qwen3_moe": Family("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        head_dim=32, intermediate_size=64, moe_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=True,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ), qk_norm=True),
    "qwen2_moe": Family("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        intermediate_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        num_experts=16, num_experts_per_tok=4, norm_topk_prob=False, rms_norm_eps=1e-6,
    )),
    "olmoe": Family("OlmoeConfig", "OlmoeForCausalLM", dict(
        intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False,
        rms_norm_eps=1e-5,
    ), qk_norm=True),
    "mixtral": Family("MixtralConfig", "MixtralForCausalLM", dict(
        intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5,
    )),
}  # fmt: skip

# Parameters (by name ending) that write into the residual stream; transformers 5 fuses
# experts in memory (``experts.down_proj`` is every expert's down matrix).
_RESIDUAL_WRITERS = ("o_proj.weight", "down_proj", "down_proj.weight", "w2.weight")


def build_model(name: str, seed: int = SEED) -> Any:
    """The family's random transformers model (eval, F32, values representable in F16)."""
    import torch
    import transformers

    fam = FAMILIES[name]
    torch.manual_seed(seed)
    cfg = getattr(transformers, fam.config_class)(**_COMMON, **fam.config)
    model = getattr(transformers, fam.model_class)(cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif pname.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif pname.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif pname.endswith("embed_tokens.weight"):
                p.copy_(SMALL * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
                if pname.endswith(_RESIDUAL_WRITERS) or (
                    fam.qk_norm and pname.endswith(("q_proj.weight", "k_proj.weight"))
                ):
                    p.mul_(SMALL)
            if fam.tweak is not None:
                fam.tweak(pname, p, gen)
            p.copy_(p.half().float())  # stored as F16: the F32 model is exactly the file
    return model


def save_checkpoint(name: str, hf_dir: Path, seed: int = SEED) -> None:
    import torch

    model = build_model(name, seed)
    model.to(torch.float16).save_pretrained(hf_dir, safe_serialization=True)
    cfg_path = hf_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(FAMILIES[name].extra_config)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (hf_dir / "generation_config.json").unlink(missing_ok=True)  # not needed, not stable


# --------------------------------------------------------------------------- the converter


def llama_cpp_tree(arg: str | None) -> Path:
    """An unpacked llama.cpp tree holding convert_hf_to_gguf.py (fetched if not given)."""
    if arg:
        tree = Path(arg)
    else:
        tree = SDIST_DIR / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
        if not (tree / "convert_hf_to_gguf.py").is_file():
            archive = SDIST_DIR / "llama_cpp_python-0.3.36.tar.gz"
            if not archive.is_file():
                SDIST_DIR.mkdir(parents=True, exist_ok=True)
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                                "--no-binary", "llama-cpp-python", SDIST, "-d", str(SDIST_DIR)],
                               check=True)  # fmt: skip
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers()
                           if "/vendor/llama.cpp/" in m.name and ".." not in m.name
                           and (m.isfile() or m.isdir())]  # fmt: skip
                tar.extractall(SDIST_DIR, members=members, filter="data")
    if not (tree / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"{tree}: no convert_hf_to_gguf.py there")
    return tree


# Runs inside a child process (the converter imports its own gguf-py): patches the model
# class's set_vocab with a placeholder vocabulary, then runs the converter's main().
_DRIVER = r"""
import sys
tree, vocab = sys.argv[1], int(sys.argv[2])
sys.path.insert(0, tree)
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[3:]]
import convert_hf_to_gguf as conv

def placeholder_vocab(self):
    tokens = ["<unk>", "<s>", "</s>"] + [f"<tok{i}>" for i in range(3, vocab)]
    w = self.gguf_writer
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

_get = conv.get_model_class
def get_model_class(*args, **kwargs):
    cls = _get(*args, **kwargs)
    cls.set_vocab = placeholder_vocab
    return cls
conv.get_model_class = get_model_class
conv.main()
"""


def convert(tree: Path, hf_dir: Path, out: Path, outtype: str = "f16") -> None:
    env = dict(os.environ, PYTHONPATH=str(tree / "gguf-py"))
    subprocess.run([sys.executable, "-c", _DRIVER, str(tree), str(VOCAB), str(hf_dir),
                    "--outtype", outtype, "--outfile", str(out)],
                   check=True, env=env, capture_output=True)  # fmt: skip


def quantize_q4_1(src: Path, dst: Path) -> bool:
    """llama.cpp's own quantizer (llama-cpp-python); False when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return False
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({src}) returned {rc}")
    return True


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make(name: str, tree: Path, out_root: Path) -> dict[str, Any]:
    d = out_root / name
    hf_dir = d / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    save_checkpoint(name, hf_dir)
    f16 = d / f"{name}.f16.gguf"
    convert(tree, hf_dir, f16)
    files = [f16]
    q41 = d / f"{name}.q4_1.gguf"
    if quantize_q4_1(f16, q41):
        files.append(q41)
    files += sorted(hf_dir.iterdir())
    manifest = {
        "family": name, "seed": SEED, "converter": f"{SDIST} convert_hf_to_gguf.py",
        "files": {str(p.relative_to(d)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
                  for p in files},
    }  # fmt: skip
    (d / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("families", nargs="*", help=f"default: all ({', '.join(FAMILIES)})")
    ap.add_argument("--llama-cpp", help="an unpacked llama.cpp tree (default: fetch the sdist)")
    ap.add_argument("--out", default=str(OUT), help=f"default: {OUT.relative_to(REPO)}")
    args = ap.parse_args(argv)
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")
    tree = llama_cpp_tree(args.llama_cpp)
    for name in args.families or FAMILIES:
        m = make(name, tree, Path(args.out))
        total = sum(f["bytes"] for f in m["files"].values())
        print(f"{name}: {len(m['files'])} files, {total / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
