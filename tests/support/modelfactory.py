"""Tiny randomly initialised test models: a Hugging Face checkpoint and GGUF files for each.

For each family (Llama, Qwen3-MoE, Qwen2-MoE with a shared expert, OLMoE, Mixtral) this
builds a transformers model with a fixed seed (vocab 256, hidden 64, 3 layers, 4 query / 2
KV heads, 8-16 experts, top-k 2-4), writes it with ``save_pretrained`` in F32, and converts
that checkpoint to GGUF in F32, Q8_0, Q4_0 and Q4_1 the way llama.cpp's ``convert_hf_to_gguf.py``
would: the same architecture names and metadata keys, tensor names from ``gguf``'s own
``TensorNameMap``, experts stacked into ``ffn_*_exps`` tensors, and the Q/K row permutation
for the ``llama`` architecture (Llama and Mixtral). Norms, the router and the shared-expert
gate stay F32 in the quantized files, as llama.cpp keeps them.

Weights are drawn with a larger spread than transformers' init (std 0.15 for matrices, 0.5
for routers, norm weights 1 +- 0.1) so logits are O(1) and comparisons mean something.

A second variant, ``small=True`` (``build_tiny_model(family, small=True)``), keeps the
residual stream small: embeddings std 1e-3 and every matrix that writes into the residual
(``o_proj``, ``down_proj``, experts' and shared expert's ``down``) scaled by 1e-3, and, for the
families with Q/K RMSNorm (Qwen3-MoE, OLMoE), ``q_proj``/``k_proj`` too. Every RMSNorm then
sees mean(x^2) of order 1e-6, the size of its epsilon, so a wrong epsilon, a norm weight
applied twice or a dropped bias moves the logits by whole percents instead of ~1e-6.

Everything is cached under ``build/test-models/<version>/`` (built once into a temporary
directory and renamed into place, so concurrent test runs do not see half-written files).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
import transformers
from safetensors.numpy import load_file

FACTORY_VERSION = "2"
FAMILIES = ("llama", "qwen3_moe", "qwen2_moe", "olmoe", "mixtral")
GGUF_TYPES = ("F32", "Q8_0", "Q4_0", "Q4_1")
VOCAB = 256
REPO = Path(__file__).resolve().parents[2]

_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def hf_config(family: str) -> transformers.PretrainedConfig:
    """The transformers config of the tiny model of a family."""
    if family == "llama":
        return transformers.LlamaConfig(
            intermediate_size=128, rms_norm_eps=1e-5, max_position_embeddings=512, **_COMMON
        )
    if family == "qwen3_moe":
        # head_dim 32 != hidden/heads, tied embeddings, renormalized top-k (as llama.cpp).
        return transformers.Qwen3MoeConfig(
            head_dim=32,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            max_position_embeddings=512,
            **_COMMON,
        )
    if family == "qwen2_moe":
        # Q/K/V biases, a sigmoid-gated shared expert, 16 experts top-4, no renormalization.
        return transformers.Qwen2MoeConfig(
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_experts=16,
            num_experts_per_tok=4,
            norm_topk_prob=False,
            max_position_embeddings=512,
            **_COMMON,
        )
    if family == "olmoe":
        # Q/K RMSNorm over the whole projection; intermediate_size is the expert width.
        return transformers.OlmoeConfig(
            intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            max_position_embeddings=512,
            **_COMMON,
        )
    if family == "mixtral":
        return transformers.MixtralConfig(
            intermediate_size=32,
            num_local_experts=8,
            num_experts_per_tok=2,
            max_position_embeddings=512,
            **_COMMON,
        )
    raise ValueError(f"unknown family {family!r}")


_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
}


SMALL = 1e-3  # the small variant's residual-stream scale
_QK_NORM_FAMILIES = ("qwen3_moe", "olmoe")
# Parameters (by name ending) that write into the residual stream. transformers 5 fuses
# experts in memory: ``experts.down_proj`` is the stack of every expert's down matrix.
_RESIDUAL_WRITERS = ("o_proj.weight", "down_proj", "down_proj.weight", "w2.weight")


def build_hf_model(family: str, seed: int = 0, small: bool = False) -> torch.nn.Module:
    """A randomly initialised transformers model (eval mode, F32); ``small`` keeps the
    residual stream at ~1e-3 (see the module docstring)."""
    torch.manual_seed(seed)
    cls = getattr(transformers, _CLASSES[family])
    model = cls(hf_config(family)).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                p.copy_((SMALL if small else 1.0) * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
                if small and (
                    name.endswith(_RESIDUAL_WRITERS)
                    or (family in _QK_NORM_FAMILIES and name.endswith(("q_proj.weight",
                                                                        "k_proj.weight")))
                ):
                    p.mul_(SMALL)
    return model


# --------------------------------------------------------------------------- GGUF writer

_GGUF_ARCH = {
    "llama": gguf.MODEL_ARCH.LLAMA,
    "mixtral": gguf.MODEL_ARCH.LLAMA,
    "qwen3_moe": gguf.MODEL_ARCH.QWEN3MOE,
    "qwen2_moe": gguf.MODEL_ARCH.QWEN2MOE,
    "olmoe": gguf.MODEL_ARCH.OLMOE,
}
_QTYPES = {
    "F32": gguf.GGMLQuantizationType.F32,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_0": gguf.GGMLQuantizationType.Q4_0,
    "Q4_1": gguf.GGMLQuantizationType.Q4_1,
}
_FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
}


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: HF rotate-half rows -> interleaved-RoPE rows."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of :func:`permute_qk` (what transformers does when it loads a GGUF)."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _read_checkpoint(hf_dir: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _hf_tensors_for_gguf(family: str, cfg: dict[str, Any], sd: dict[str, np.ndarray]):
    """(HF-style name understood by TensorNameMap, array) after llama.cpp's modify_tensors."""
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    n_exp = cfg.get("num_experts") or cfg.get("num_local_experts") or 0
    permute = _GGUF_ARCH[family] == gguf.MODEL_ARCH.LLAMA
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name in sorted(sd):
        data = sd[name]
        if permute and name.endswith(("q_proj.weight", "q_proj.bias")):
            data = permute_qk(data, n_head)
        if permute and name.endswith(("k_proj.weight", "k_proj.bias")):
            data = permute_qk(data, n_kv)
        parts = name.split(".")
        if ".experts." in name and parts[-1] == "weight":
            bid, xid, w = int(parts[2]), int(parts[-3]), parts[-2]
            experts.setdefault((bid, w), {})[xid] = data
            continue
        yield name, data
    for (bid, w), per in sorted(experts.items()):
        stacked = np.stack([per[x] for x in range(n_exp)])
        if family == "mixtral":
            yield f"layers.{bid}.feed_forward.experts.{w}.weight", stacked
        else:
            yield f"model.layers.{bid}.mlp.experts.{w}.weight", stacked


def _keep_f32(gguf_name: str, data: np.ndarray) -> bool:
    return data.ndim <= 1 or gguf_name.endswith(
        ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")
    )


Edit = Callable[[str, np.ndarray], "tuple[np.ndarray, gguf.GGMLQuantizationType | None] | None"]


def write_gguf(
    hf_dir: Path,
    out: Path,
    qtype: str,
    edit: Edit | None = None,
    extra: dict[str, np.ndarray] | None = None,
    chat_template: str | None = None,
) -> None:
    """Convert a tiny checkpoint to GGUF following llama.cpp's converter conventions.

    ``edit(gguf_name, f32_array)`` (tests of bad files) may return None to drop a tensor or
    ``(raw_bytes_or_array, raw_dtype)`` to write something else in its place. ``extra``
    tensors (F32) are written as they are, e.g. llama3's ``rope_freqs``. ``chat_template``
    is written as ``tokenizer.chat_template``.
    """
    cfg = json.loads((hf_dir / "config.json").read_text())
    family = cfg["model_type"]
    arch = _GGUF_ARCH[family]
    n_layers = cfg["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(arch, n_layers)
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(f"colibri-tiny-{family}")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(n_layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    rope = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(1e-5 if family == "olmoe" else cfg["rms_norm_eps"])
    n_exp = cfg.get("num_local_experts") or cfg.get("num_experts")
    if n_exp:
        w.add_expert_count(n_exp)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("head_dim"):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if arch == gguf.MODEL_ARCH.LLAMA:
        w.add_vocab_size(cfg["vocab_size"])
        w.add_rope_dimension_count(
            cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        )
    if family in ("qwen2_moe", "qwen3_moe"):
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if family == "qwen2_moe":
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_file_type(_FILE_TYPES[qtype])
    w.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<tok{i}>" for i in range(3, cfg["vocab_size"])]
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([2, 3, 3] + [1] * (len(tokens) - 3))
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    sd = _read_checkpoint(hf_dir)
    for name, data in _hf_tensors_for_gguf(family, cfg, sd):
        gname = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise ValueError(f"no GGUF name for {name}")
        data = np.ascontiguousarray(data, dtype=np.float32)
        if edit is not None:
            edited = edit(gname, data)
            if edited is None:
                continue
            if edited[1] is not None:
                w.add_tensor(gname, edited[0], raw_dtype=edited[1])
                continue
            data = edited[0]
        if qtype == "F32" or _keep_f32(gname, data):
            w.add_tensor(gname, data)
        else:
            q = gguf.quants.quantize(data, _QTYPES[qtype])
            w.add_tensor(gname, q, raw_dtype=_QTYPES[qtype])
    for gname, data in (extra or {}).items():
        w.add_tensor(gname, np.ascontiguousarray(data, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --------------------------------------------------------------------------- cache


@dataclass(frozen=True)
class TinyModel:
    """Paths of one family's test model: ``hf_dir`` and ``gguf[type]`` for F32/Q8_0/Q4_0/Q4_1."""

    family: str
    hf_dir: Path
    gguf: dict[str, Path]

    def __hash__(self) -> int:
        return hash((self.family, self.hf_dir))


def cache_root() -> Path:
    base = Path(os.environ.get("COLIBRI_TEST_MODELS", REPO / "build" / "test-models"))
    key = f"v{FACTORY_VERSION}-tf{transformers.__version__}-torch{torch.__version__}"
    return base / key.replace("+", "_")


def _paths(root: Path, family: str, small: bool = False) -> TinyModel:
    name = f"{family}-small" if small else family
    d = root / name
    return TinyModel(family, d / "hf", {t: d / f"{name}-{t}.gguf" for t in GGUF_TYPES})


def build_tiny_model(family: str, root: Path | None = None, small: bool = False) -> TinyModel:
    """Build (or reuse) the cached checkpoint and GGUF files of a family (of its
    small-residual variant when ``small``)."""
    root = root or cache_root()
    final = _paths(root, family, small)
    name = final.hf_dir.parent.name
    if (root / name / "DONE").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        staged = _paths(tmp, family, small)  # <tmp>/<name>/..., renamed to <root>/<name>
        model = build_hf_model(family, small=small)
        model.save_pretrained(staged.hf_dir, safe_serialization=True)
        for t, p in staged.gguf.items():
            write_gguf(staged.hf_dir, p, t)
        (tmp / name / "DONE").write_text("ok\n")
        try:
            os.replace(tmp / name, root / name)
        except OSError:
            if not (root / name / "DONE").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _gguf_name(family: str, cfg: dict[str, Any], tmap: Any, hf_name: str) -> tuple[str, int]:
    """GGUF tensor name (and expert index, or -1) holding an HF checkpoint tensor."""
    parts = hf_name.split(".")
    if ".experts." in hf_name and parts[-1] == "weight":
        bid, xid, w = int(parts[2]), int(parts[-3]), parts[-2]
        merged = (
            f"layers.{bid}.feed_forward.experts.{w}.weight"
            if family == "mixtral"
            else f"model.layers.{bid}.mlp.experts.{w}.weight"
        )
        return tmap.get_name(merged, try_suffixes=(".weight", ".bias")), xid
    return tmap.get_name(hf_name, try_suffixes=(".weight", ".bias")), -1


def dequantized_hf_dir(tiny: TinyModel, qtype: str) -> Path:
    """A checkpoint holding the GGUF's weights dequantized to F32 (and un-permuted).

    transformers run on it computes what the quantized model computes with exact
    arithmetic: the reference for a quantized forward pass, up to activation rounding.
    """
    out = tiny.hf_dir.parent / f"hf-dequant-{qtype}"
    if not (out / "DONE").is_file():
        write_dequantized_checkpoint(tiny.hf_dir, tiny.gguf[qtype], out)
    return out


def _gguf_arch(cfg: dict[str, Any]) -> Any:
    return _GGUF_ARCH[cfg["model_type"]]


def _dequantized_tensors(path: Path) -> dict[str, tuple[np.ndarray, str]]:
    """GGUF tensor name -> (F32 values in numpy axis order, GGML type name), by gguf.quants."""
    reader = gguf.GGUFReader(path)
    return {
        t.name: (
            gguf.quants.dequantize(t.data, t.tensor_type).reshape(
                tuple(reversed(t.shape.tolist()))
            ),
            t.tensor_type.name,
        )
        for t in reader.tensors
    }


def gguf_weight_types(hf_dir: Path, gguf_path: Path) -> dict[str, str]:
    """HF module name -> GGML type name of the GGUF tensor holding its weight (for
    :func:`use_ggml_arithmetic`); fused expert modules (``...mlp.experts``) map to
    ``"<gate/up type>/<down type>"``."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    tmap = gguf.get_tensor_name_map(_gguf_arch(cfg), cfg["num_hidden_layers"])
    types = {name: t for name, (_, t) in _dequantized_tensors(gguf_path).items()}
    out: dict[str, str] = {}
    experts: dict[str, dict[str, str]] = {}
    for hf_name in _read_checkpoint(hf_dir):
        gname, xid = _gguf_name(cfg["model_type"], cfg, tmap, hf_name)
        parts = hf_name.split(".")
        if xid >= 0:
            module = ".".join(parts[: parts.index("experts") + 1])
            experts.setdefault(module, {})[parts[-2]] = types[gname]
        elif parts[-1] == "weight":
            out[".".join(parts[:-1])] = types[gname]
    for module, kinds in experts.items():
        gate = kinds.get("gate_proj", kinds.get("w1"))
        up = kinds.get("up_proj", kinds.get("w3"))
        down = kinds.get("down_proj", kinds.get("w2"))
        if gate != up:
            raise ValueError(f"{module}: gate {gate} and up {up} types differ")
        out[module.replace("block_sparse_moe", "mlp")] = f"{gate}/{down}"
    # Tied embeddings: the LM head is token_embd itself (no lm_head tensor to map).
    out.setdefault("lm_head", types.get("output.weight", types["token_embd.weight"]))
    return out


def write_dequantized_checkpoint(hf_dir: Path, gguf_path: Path, out: Path) -> Path:
    """Writes to ``out`` the checkpoint ``hf_dir`` with every weight replaced by the GGUF's
    tensor dequantized by ``gguf.quants`` (and Q/K rows un-permuted for ``llama``); the
    GGUF's expert stacks are indexed by their first (expert) axis as stored."""
    from safetensors.numpy import save_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    family = cfg["model_type"]
    arch = _gguf_arch(cfg)
    tmap = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    tensors = _dequantized_tensors(gguf_path)
    heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}
    new: dict[str, np.ndarray] = {}
    for hf_name, arr in _read_checkpoint(hf_dir).items():
        gname, xid = _gguf_name(family, cfg, tmap, hf_name)
        val = tensors[gname][0][xid] if xid >= 0 else tensors[gname][0]
        proj = hf_name.split(".")[-2]
        if arch == gguf.MODEL_ARCH.LLAMA and proj in heads:
            val = unpermute_qk(val, heads[proj])
        new[hf_name] = np.ascontiguousarray(val.reshape(arr.shape), dtype=np.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        save_file(new, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for f in ("config.json", "generation_config.json"):
            if (hf_dir / f).is_file():
                shutil.copy(hf_dir / f, tmp / f)
        (tmp / "DONE").write_text("ok\n")
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "DONE").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@functools.cache
def transformers_model(hf_dir: str) -> torch.nn.Module:
    """The checkpoint loaded back with transformers (eval, F32), cached per process."""
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    return model.eval()


# --------------------------------------------------------------------------- ggml arithmetic
#
# A quantized GGUF is not run on dequantized weights alone: like llama.cpp, colibri rounds
# each activation row to 8-bit blocks before an integer dot product with the quantized
# weight rows (Q8_0 activations for Q8_0/Q4_0 weights, Q8_1 for Q4_1). These helpers give
# transformers the same arithmetic, so it computes what the quantized model computes, up to
# summation order.


def round_q8_0(x: torch.Tensor) -> torch.Tensor:
    """Activations as a Q8_0 block sees them (ggml's quantize_row_q8_0): blocks of 32 along
    the last axis, d = max|x| / 127 stored as fp16, q = roundf(x * (1/d))."""
    q, d = _q8_blocks(x)
    return (q * d.half().float()).reshape(x.shape)


def _q8_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's arithmetic exactly, in float32: the scaled value is x times the reciprocal of
    d (not x / d, which differs in the last bit), rounded half away from zero (C's roundf,
    not torch.round's half to even). Either difference moves values that sit on a rounding
    boundary to the other side, which the chaotic tiny models then amplify."""
    b = x.reshape(*x.shape[:-1], -1, 32)
    d = b.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1.0 / torch.where(d > 0, d, 1.0), 0.0)
    v = b * inv
    t = torch.trunc(v)
    q = t + torch.sign(v) * ((v - t).abs() >= 0.5)  # roundf: v - t is exact in float
    return q, d


def _q4_1_linear(x: torch.Tensor, w: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """x . w for Q4_1 rows w (dequantized) against Q8_1 activations, as ggml computes it:
    per block d*d_a*sum(q*q_a) + m*s with s = fp16(d_a*sum(q_a)), d_a as fp32 (the block
    minimum m [rows, blocks] is the smallest dequantized weight: the minimum is nibble 0).

    Written as x_q.w - (d_a16*sum q_a).m + s.m: three matmuls instead of a block loop. The
    activation rounding is float32 (as ggml's); the products and sums are in w's dtype
    (float64 weights give a reference free of summation error)."""
    q, d = _q8_blocks(x)
    if m is None:
        m = w.reshape(w.shape[0], -1, 32).amin(-1)
    qsum = q.sum(-1)
    d16 = d.half().to(w.dtype)
    s = (qsum * d[..., 0]).half().to(w.dtype)
    qsum = qsum.to(w.dtype)
    xq = (q.to(w.dtype) * d16).reshape(x.shape)
    lin = torch.nn.functional.linear
    return lin(xq, w) + lin(s - qsum * d16[..., 0], m.to(w.dtype))


def ggml_linear(
    x: torch.Tensor, w: torch.Tensor, wtype: str, m: torch.Tensor | None = None
) -> torch.Tensor:
    if wtype in ("Q8_0", "Q4_0"):
        return torch.nn.functional.linear(round_q8_0(x).to(w.dtype), w)
    if wtype == "Q4_1":
        return _q4_1_linear(x, w, m)
    return torch.nn.functional.linear(x, w)


def _ggml_experts_forward(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    out = torch.zeros_like(hidden_states)
    for t in range(hidden_states.shape[0]):
        for k in range(top_k_index.shape[1]):
            e = int(top_k_index[t, k])
            gate_up = ggml_linear(hidden_states[t], self.gate_up_proj[e], self.ggml_types[0])
            gate, up = gate_up.chunk(2, dim=-1)
            h = ggml_linear(self.act_fn(gate) * up, self.down_proj[e], self.ggml_types[1])
            out[t] += h * top_k_weights[t, k]
    return out


def use_ggml_arithmetic(model: Any, weight_type: Callable[[str], str]) -> Any:
    """Patch a transformers model in place: every linear layer and routed-expert block whose
    GGUF weight type ``weight_type(module_name)`` is quantized computes as ggml does."""
    for name, mod in model.named_modules():
        wtype = weight_type(name)
        if wtype == "F32":
            continue
        if isinstance(mod, torch.nn.Linear):
            mins = None
            if wtype == "Q4_1":
                mins = mod.weight.detach().reshape(mod.weight.shape[0], -1, 32).amin(-1)

            def fwd(
                x: torch.Tensor, mod: Any = mod, wtype: str = wtype, mins: Any = mins
            ) -> torch.Tensor:
                y = ggml_linear(x, mod.weight, wtype, mins)
                return y + mod.bias if mod.bias is not None else y

            mod.forward = fwd
        elif hasattr(mod, "gate_up_proj") and hasattr(mod, "down_proj"):
            # one type for gate/up and down, or "<gate/up type>/<down type>"
            gate_up, _, down = wtype.partition("/")
            mod.ggml_types = (gate_up, down or gate_up)
            mod.forward = _ggml_experts_forward.__get__(mod)
    return model


@functools.cache
def transformers_model_ggml(tiny: TinyModel, qtype: str) -> torch.nn.Module:
    """transformers on the GGUF's dequantized weights with ggml's activation arithmetic:
    what the ``qtype`` GGUF computes. Routers and the shared-expert gate stay F32, as in
    the GGUF."""
    d = dequantized_hf_dir(tiny, qtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    return use_ggml_arithmetic(
        model.eval(), lambda n: "F32" if n.endswith("shared_expert_gate") else qtype
    )


@torch.no_grad()
def reference_logits(model: torch.nn.Module, ids: list[int] | np.ndarray) -> np.ndarray:
    """transformers logits [n, vocab] (float32) for one sequence, every position."""
    x = torch.tensor(np.asarray(ids, dtype=np.int64))[None]
    return model(input_ids=x, use_cache=False).logits[0].float().numpy()


@torch.no_grad()
def reference_greedy(
    model: torch.nn.Module, ids: list[int], n_new: int
) -> tuple[list[int], np.ndarray]:
    """Greedy continuation with transformers (full recompute each step; no EOS stop).

    Returns the new tokens and the logits [n_new, vocab] each was chosen from.
    """
    seq = list(ids)
    steps: list[np.ndarray] = []
    for _ in range(n_new):
        row = reference_logits(model, seq)[-1]
        steps.append(row)
        seq.append(int(np.argmax(row)))
    return seq[len(ids) :], np.stack(steps)


def prompt_ids(n: int = 32, seed: int = 1234, vocab: int = VOCAB) -> list[int]:
    """A fixed pseudo-random token sequence (ids 3..vocab-1, avoiding the specials)."""
    return [int(x) for x in np.random.default_rng(seed).integers(3, vocab, size=n)]
