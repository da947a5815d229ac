"""Synthetic gpt-oss-shaped MoE models with random weights (issue 33's benchmarks): GGUF
files with llama.cpp's ``gpt-oss`` names and keys, which llama.cpp and colibri both load.

The layout is what llama.cpp's converter writes for a released gpt-oss checkpoint: Q/K/V/O
with biases, learned attention sinks (``attn_sinks``), a sliding window on even layers
(llama.cpp's rule, 128 as released), ``post_attention_norm``, a router with a bias, stacked
MXFP4 experts with F32 biases (the clamped SwiGLU is llama.cpp's hard-coded one), YaRN.
Experts are MXFP4 (17 bytes per 32 weights, as released); attention, embeddings and the
LM head Q4_0 (the released checkpoints keep them in BF16: Q4_0 keeps the dense part small
here, so the RAM budget goes to experts); norms, biases, sinks and routers F32. Same
random-weight rules, tokenizer and writer as synthetic_moe.py / synthetic_deepseek.py.

    python benchmarks/synthetic_gpt_oss.py --list
    python benchmarks/synthetic_gpt_oss.py oss120-10g     # build/bench-data/...gguf
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from synthetic_deepseek import write_family_gguf
from synthetic_moe import (
    DEFAULT_DIR,
    MXFP4_BLOCK_BYTES,
    QK4_0,
    TensorSpec,
    _fmt,
    _ProgressLine,
    add_tokenizer,
)
from synthetic_routing import regime, shape_specs

GENERATOR_VERSION = 1


@dataclass(frozen=True)
class GptOssPreset:
    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_experts: int
    top_k: int
    expert_ffn: int
    vocab: int
    window: int = 128
    context_length: int = 32768
    rope_theta: float = 150000.0
    yarn_factor: float = 32.0
    yarn_original: int = 4096
    rms_eps: float = 1e-5
    routing: str = "local"  # synthetic_routing.REGIMES
    description: str = ""

    def __post_init__(self) -> None:
        for what, cols in (("hidden", self.hidden), ("expert_ffn", self.expert_ffn)):
            if cols % QK4_0:
                raise ValueError(f"{self.name}: {what} = {cols} is not a multiple of {QK4_0}")

    @property
    def n_moe(self) -> int:
        return self.n_layers

    @property
    def bytes_per_expert(self) -> int:
        return 3 * self.expert_ffn * self.hidden // QK4_0 * MXFP4_BLOCK_BYTES

    @property
    def expert_bytes(self) -> int:
        return self.n_layers * self.n_experts * self.bytes_per_expert

    @property
    def routed_bytes_per_token(self) -> int:
        return self.top_k * self.n_layers * self.bytes_per_expert

    def tensors(self) -> list[TensorSpec]:
        h, e, f = self.hidden, self.n_experts, self.expert_ffn
        q, kv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        out = [TensorSpec("token_embd.weight", (self.vocab, h), "q4_0", 1.0)]
        for i in range(self.n_layers):
            b = f"blk.{i}."
            out += [
                TensorSpec(b + "attn_norm.weight", (h,), "norm"),
                TensorSpec(b + "attn_q.weight", (q, h), "q4_0", h**-0.5),
                TensorSpec(b + "attn_k.weight", (kv, h), "q4_0", h**-0.5),
                TensorSpec(b + "attn_v.weight", (kv, h), "q4_0", h**-0.5),
                TensorSpec(b + "attn_q.bias", (q,), "router", 0.1),
                TensorSpec(b + "attn_k.bias", (kv,), "router", 0.1),
                TensorSpec(b + "attn_v.bias", (kv,), "router", 0.1),
                TensorSpec(b + "attn_output.weight", (h, q), "q4_0", q**-0.5),
                TensorSpec(b + "attn_output.bias", (h,), "router", 0.1),
                TensorSpec(b + "attn_sinks.weight", (self.n_heads,), "router", 1.0),
                TensorSpec(b + "post_attention_norm.weight", (h,), "norm"),
                TensorSpec(b + "ffn_gate_inp.weight", (e, h), "router", h**-0.5),
                TensorSpec(b + "ffn_gate_inp.bias", (e,), "router", 0.1),
                TensorSpec(b + "ffn_gate_exps.weight", (e, f, h), "mxfp4", h**-0.5),
                TensorSpec(b + "ffn_up_exps.weight", (e, f, h), "mxfp4", h**-0.5),
                TensorSpec(b + "ffn_down_exps.weight", (e, h, f), "mxfp4", f**-0.5),
                TensorSpec(b + "ffn_gate_exps.bias", (e, f), "router", 0.1),
                TensorSpec(b + "ffn_up_exps.bias", (e, f), "router", 0.1),
                TensorSpec(b + "ffn_down_exps.bias", (e, h), "router", 0.1),
            ]
        out += [
            TensorSpec("output_norm.weight", (h,), "norm"),
            TensorSpec("output.weight", (self.vocab, h), "q4_0", h**-0.5),
        ]
        return shape_specs(out, self.routing, h)

    def summary(self) -> dict[str, Any]:
        total = sum(t.nbytes for t in self.tensors())
        return {
            "preset": self.name, "routing": self.routing, "arch": "gpt-oss",
            "layers": self.n_layers, "hidden": self.hidden, "heads": self.n_heads,
            "kv_heads": self.n_kv_heads, "head_dim": self.head_dim, "window": self.window,
            "experts": self.n_experts, "top_k": self.top_k, "expert_ffn": self.expert_ffn,
            "vocab": self.vocab, "tensor_bytes": total, "expert_bytes": self.expert_bytes,
            "resident_bytes": total - self.expert_bytes,
            "bytes_per_expert": self.bytes_per_expert,
            "routed_bytes_per_token": self.routed_bytes_per_token,
        }  # fmt: skip


# gpt-oss-120b (openai/gpt-oss-120b config.json): 36 layers, hidden 2880, 64 query heads and
# 8 KV heads of 64, 128 experts of 2880, top-4, window 128 on every other layer; scaled to a
# hidden and expert width of 1152 so 9.8 GB of experts fit a shared disk. gpt-oss-20b: 24
# layers, the same attention, 32 experts; here at half the hidden width (the attention's
# heads kept, so its cost per context token is the real one) with 8 experts (a resident
# decode step computes top-4 experts whatever their count), so a 4k prefill fits minutes.
GPT_OSS_PRESETS: dict[str, GptOssPreset] = {
    p.name: p
    for p in (
        GptOssPreset(
            "oss-tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16,
            n_experts=4, top_k=2, expert_ffn=64, vocab=512, window=8, context_length=4096,
            description="tests: a 2-layer gpt-oss shape",
        ),
        GptOssPreset(
            "oss120-10g", n_layers=36, hidden=1152, n_heads=64, n_kv_heads=8, head_dim=64,
            n_experts=128, top_k=4, expert_ffn=1152, vocab=32768,
            description="gpt-oss-120b's layout (36 layers, 128 MXFP4 experts, top-4, "
            "sinks, window 128) at hidden 1152: 9.7 GB of experts",
        ),
        GptOssPreset(
            "oss20-attn", n_layers=24, hidden=1440, n_heads=64, n_kv_heads=8, head_dim=64,
            n_experts=8, top_k=4, expert_ffn=1440, vocab=32768,
            description="gpt-oss-20b's attention (24 layers, 64/8 heads of 64, sinks, window "
            "128) at half its hidden width (1440), 8 experts of 32: resident sweeps",
        ),
    )
}  # fmt: skip


def _writer(p: GptOssPreset, path: Path, seed: int) -> gguf.GGUFWriter:
    a = "gpt-oss"
    w = gguf.GGUFWriter(str(path), a)
    w.add_name(f"colibri-synthetic-{p.name}-s{seed}")
    w.add_description(f"colibri synthetic {a} (random weights, generator v{GENERATOR_VERSION}, "
                      f"preset {p.name}, seed {seed}); benchmarks/synthetic_gpt_oss.py")
    w.add_context_length(p.context_length)
    w.add_embedding_length(p.hidden)
    w.add_block_count(p.n_layers)
    w.add_feed_forward_length(p.expert_ffn)
    w.add_head_count(p.n_heads)
    w.add_head_count_kv(p.n_kv_heads)
    w.add_key_length(p.head_dim)
    w.add_value_length(p.head_dim)
    w.add_rope_freq_base(p.rope_theta)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(p.yarn_factor)
    w.add_rope_scaling_orig_ctx_len(p.yarn_original)
    w.add_layer_norm_rms_eps(p.rms_eps)
    w.add_sliding_window(p.window)
    w.add_expert_count(p.n_experts)
    w.add_expert_used_count(p.top_k)
    w.add_expert_feed_forward_length(p.expert_ffn)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(w, p.vocab)
    for t in p.tensors():
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.ggml_type)
    return w


def default_path(preset: GptOssPreset | str, seed: int = 0, root: Path | None = None) -> Path:
    name = preset if isinstance(preset, str) else preset.name
    if not isinstance(preset, str) and preset.routing != "local":
        name += f"-{preset.routing}"
    return (root or DEFAULT_DIR) / f"synthetic-{name}-v{GENERATOR_VERSION}-s{seed}.MXFP4.gguf"


def ensure_gpt_oss_preset(preset: GptOssPreset | str, seed: int = 0, root: Path | None = None,
                          progress: Any = None) -> Path:  # fmt: skip
    p = GPT_OSS_PRESETS[preset] if isinstance(preset, str) else preset
    path = default_path(p, seed, root)
    if not path.is_file():
        write_family_gguf(p, path, seed, progress, writer=_writer)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("preset", nargs="?", choices=sorted(GPT_OSS_PRESETS))
    ap.add_argument("-o", "--output", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--routing", default="local", choices=("local", "realistic", "uniform"),
                    help="routing regime (benchmarks/synthetic_routing.py)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list or args.preset is None:
        for p in GPT_OSS_PRESETS.values():
            s = p.summary()
            print(f"{p.name:<11}{p.n_layers:>4} layers {p.n_experts:>4}x{p.expert_ffn:<5} "
                  f"top-{p.top_k}  experts {_fmt(s['expert_bytes']):>10}  per token "
                  f"{_fmt(s['routed_bytes_per_token']):>10}  file {_fmt(s['tensor_bytes']):>10}"
                  f"  {p.description}")  # fmt: skip
        return 0
    p = dataclasses.replace(GPT_OSS_PRESETS[args.preset], routing=regime(args.routing).name)
    path = args.output or default_path(p, args.seed)
    if path.exists() and not args.force:
        print(f"{path} exists (--force rewrites it)", file=sys.stderr)
        return 0
    os.makedirs(path.parent, exist_ok=True)
    r = write_family_gguf(p, path, args.seed, _ProgressLine(p.name), writer=_writer)
    print(f"wrote {r.path}: {_fmt(r.file_bytes)}, experts {_fmt(r.expert_bytes)}, "
          f"{_fmt(r.routed_bytes_per_token)} routed per token, {r.wall_s:.1f} s")  # fmt: skip
    return 0


__all__ = ["GPT_OSS_PRESETS", "GptOssPreset", "ensure_gpt_oss_preset"]

if __name__ == "__main__":
    sys.exit(main())
