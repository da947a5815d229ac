"""Synthetic DeepSeek-V3 / GLM-4.5-shaped MoE models with random weights, for streaming and
attention benchmarks: GGUF files llama.cpp and colibri both load (synthetic_moe.py writes
the Qwen3-MoE ones; the same random-weight rules, generators and tokenizer are used here).

* ``deepseek2`` presets: multi-head latent attention as llama.cpp's converter writes it
  (q-LoRA ``attn_q_a``/``attn_q_a_norm``/``attn_q_b``, ``attn_kv_a_mqa`` + ``attn_kv_a_norm``,
  the split ``attn_k_b`` [heads, kv_lora, nope] / ``attn_v_b`` [heads, v, kv_lora]), sigmoid
  routing with ``exp_probs_b``, expert groups, a shared expert, leading dense layers;
* ``glm4moe`` presets: GQA with partial rotary (half the head), q/k/v biases, sigmoid
  routing with ``exp_probs_b``, one shared expert, the first layer dense.

Q4_0 matrices (F32 norms, routers and biases), every tensor a function of
``(preset, seed, name)``.

    python benchmarks/synthetic_deepseek.py --list
    python benchmarks/synthetic_deepseek.py ds3-10g         # build/bench-data/...gguf
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from synthetic_moe import (
    DEFAULT_DIR,
    F32,
    QK4_0,
    TensorSpec,
    WriteReport,
    _fmt,
    _ProgressLine,
    _rss_now,
    add_tokenizer,
    peak_rss_bytes,
    q4_0_nbytes,
    tensor_chunks,
)
from synthetic_routing import regime, shape_specs

GENERATOR_VERSION = 1


@dataclass(frozen=True)
class FamilyPreset:
    """A DeepSeek-V3-like (``deepseek2``) or GLM-4.5-like (``glm4moe``) synthetic model."""

    name: str
    arch: str  # "deepseek2" or "glm4moe"
    n_layers: int
    n_dense: int  # leading dense layers
    hidden: int
    n_heads: int
    n_experts: int
    top_k: int
    expert_ffn: int
    dense_ffn: int
    vocab: int
    n_group: int = 1
    topk_group: int = 1
    n_shared: int = 1
    routed_scaling: float = 2.5
    # deepseek2 (MLA)
    q_lora: int = 0
    kv_lora: int = 512
    qk_nope: int = 128
    qk_rope: int = 64
    v_dim: int = 128
    # glm4moe (GQA)
    n_kv_heads: int = 8
    head_dim: int = 128
    context_length: int = 16384
    routing: str = "local"  # synthetic_routing.REGIMES
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    description: str = ""

    def __post_init__(self) -> None:
        if self.arch not in ("deepseek2", "glm4moe"):
            raise ValueError(f"{self.name}: arch {self.arch}")
        for what, cols in (("hidden", self.hidden), ("expert_ffn", self.expert_ffn),
                           ("dense_ffn", self.dense_ffn)):  # fmt: skip
            if cols % QK4_0:
                raise ValueError(f"{self.name}: {what} = {cols} is not a multiple of {QK4_0}")

    @property
    def bytes_per_expert(self) -> int:
        return 3 * q4_0_nbytes(self.expert_ffn * self.hidden)

    @property
    def n_moe(self) -> int:
        return self.n_layers - self.n_dense

    @property
    def expert_bytes(self) -> int:
        return self.n_moe * self.n_experts * self.bytes_per_expert

    @property
    def routed_bytes_per_token(self) -> int:
        return self.top_k * self.n_moe * self.bytes_per_expert

    def _attention(self, b: str) -> list[TensorSpec]:
        h, nh = self.hidden, self.n_heads
        if self.arch == "glm4moe":
            q, kv = nh * self.head_dim, self.n_kv_heads * self.head_dim
            return [
                TensorSpec(b + "attn_q.weight", (q, h), "q4_0", h**-0.5),
                TensorSpec(b + "attn_k.weight", (kv, h), "q4_0", h**-0.5),
                TensorSpec(b + "attn_v.weight", (kv, h), "q4_0", h**-0.5),
                TensorSpec(b + "attn_q.bias", (q,), "router", 0.1),
                TensorSpec(b + "attn_k.bias", (kv,), "router", 0.1),
                TensorSpec(b + "attn_v.bias", (kv,), "router", 0.1),
                TensorSpec(b + "attn_output.weight", (h, q), "q4_0", q**-0.5),
            ]
        qk, r = self.qk_nope + self.qk_rope, self.kv_lora
        out = []
        if self.q_lora:
            out += [
                TensorSpec(b + "attn_q_a.weight", (self.q_lora, h), "q4_0", h**-0.5),
                TensorSpec(b + "attn_q_a_norm.weight", (self.q_lora,), "norm"),
                TensorSpec(b + "attn_q_b.weight", (nh * qk, self.q_lora), "q4_0",
                           self.q_lora**-0.5),
            ]  # fmt: skip
        else:
            out.append(TensorSpec(b + "attn_q.weight", (nh * qk, h), "q4_0", h**-0.5))
        out += [
            TensorSpec(b + "attn_kv_a_mqa.weight", (r + self.qk_rope, h), "q4_0", h**-0.5),
            TensorSpec(b + "attn_kv_a_norm.weight", (r,), "norm"),
            TensorSpec(b + "attn_k_b.weight", (nh, r, self.qk_nope), "q4_0", self.qk_nope**-0.5),
            TensorSpec(b + "attn_v_b.weight", (nh, self.v_dim, r), "q4_0", r**-0.5),
            TensorSpec(b + "attn_output.weight", (h, nh * self.v_dim), "q4_0",
                       (nh * self.v_dim) ** -0.5),
        ]  # fmt: skip
        return out

    def tensors(self) -> list[TensorSpec]:
        h, e, f = self.hidden, self.n_experts, self.expert_ffn
        out = [TensorSpec("token_embd.weight", (self.vocab, h), "q4_0", 1.0)]
        for i in range(self.n_layers):
            b = f"blk.{i}."
            out.append(TensorSpec(b + "attn_norm.weight", (h,), "norm"))
            out += self._attention(b)
            norm = "post_attention_norm" if self.arch == "glm4moe" else "ffn_norm"
            out.append(TensorSpec(b + norm + ".weight", (h,), "norm"))
            if i < self.n_dense:
                out += [
                    TensorSpec(b + "ffn_gate.weight", (self.dense_ffn, h), "q4_0", h**-0.5),
                    TensorSpec(b + "ffn_down.weight", (h, self.dense_ffn), "q4_0",
                               self.dense_ffn**-0.5),
                    TensorSpec(b + "ffn_up.weight", (self.dense_ffn, h), "q4_0", h**-0.5),
                ]  # fmt: skip
                continue
            s = self.n_shared * f
            out += [
                TensorSpec(b + "ffn_gate_inp.weight", (e, h), "router", h**-0.5),
                TensorSpec(b + "exp_probs_b.bias", (e,), "router", 0.05),
                TensorSpec(b + "ffn_gate_exps.weight", (e, f, h), "q4_0", h**-0.5),
                TensorSpec(b + "ffn_down_exps.weight", (e, h, f), "q4_0", f**-0.5),
                TensorSpec(b + "ffn_up_exps.weight", (e, f, h), "q4_0", h**-0.5),
                TensorSpec(b + "ffn_gate_shexp.weight", (s, h), "q4_0", h**-0.5),
                TensorSpec(b + "ffn_down_shexp.weight", (h, s), "q4_0", s**-0.5),
                TensorSpec(b + "ffn_up_shexp.weight", (s, h), "q4_0", h**-0.5),
            ]
        out += [
            TensorSpec("output_norm.weight", (h,), "norm"),
            TensorSpec("output.weight", (self.vocab, h), "q4_0", h**-0.5),
        ]
        return shape_specs(out, self.routing, h)

    def summary(self) -> dict[str, Any]:
        total = sum(t.nbytes for t in self.tensors())
        return {
            "preset": self.name, "routing": self.routing, "arch": self.arch,
            "layers": self.n_layers,
            "dense_layers": self.n_dense, "hidden": self.hidden, "heads": self.n_heads,
            "experts": self.n_experts, "top_k": self.top_k, "expert_ffn": self.expert_ffn,
            "vocab": self.vocab, "tensor_bytes": total, "expert_bytes": self.expert_bytes,
            "resident_bytes": total - self.expert_bytes,
            "bytes_per_expert": self.bytes_per_expert,
            "routed_bytes_per_token": self.routed_bytes_per_token,
        }  # fmt: skip


# DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3): 61 layers (3 dense), hidden 7168,
# 128 heads, q_lora 1536, kv_lora 512, nope 128 / rope 64 / v 128, 256 experts of 2048,
# top-8 in 4 of 8 groups, 1 shared expert, routed_scaling_factor 2.5. Scaled here to a
# hidden of 2048 (experts of 1024, q_lora 512) so ~10 GB of experts fit a shared disk.
# GLM-4.5-Air (zai-org/GLM-4.5-Air): 46 layers (1 dense), hidden 4096, 96 heads / 8 KV
# heads of 128, 128 experts of 1408, top-8, 1 shared expert; hidden scaled to 1024 here.
FAMILY_PRESETS: dict[str, FamilyPreset] = {
    p.name: p
    for p in (
        FamilyPreset(
            "ds3-tiny", "deepseek2", n_layers=3, n_dense=1, hidden=256, n_heads=4,
            n_experts=16, top_k=4, expert_ffn=128, dense_ffn=512, vocab=512, n_group=4,
            topk_group=2, q_lora=128, kv_lora=128, qk_nope=32, qk_rope=32, v_dim=32,
            context_length=4096, description="tests: a 3-layer DeepSeek-V3 shape, ~2 MB",
        ),
        FamilyPreset(
            "ds3-small", "deepseek2", n_layers=4, n_dense=1, hidden=1024, n_heads=8,
            n_experts=32, top_k=4, expert_ffn=512, dense_ffn=2560, vocab=32768, n_group=4,
            topk_group=2, q_lora=384, description="resident attention runs (absorbed MLA "
            "at 512 / 4k context): 4 layers, 0.14 GB",
        ),
        FamilyPreset(
            "ds3-10g", "deepseek2", n_layers=12, n_dense=1, hidden=2048, n_heads=16,
            n_experts=256, top_k=8, expert_ffn=1024, dense_ffn=5120, vocab=32768, n_group=8,
            topk_group=4, q_lora=512, description="DeepSeek-V3 shapes at hidden 2048: 11 MoE "
            "layers x 256 experts, 9.97 GB of experts",
        ),
        FamilyPreset(
            "glm45-air", "glm4moe", n_layers=46, n_dense=1, hidden=1024, n_heads=16,
            n_kv_heads=4, head_dim=64, n_experts=128, top_k=8, expert_ffn=1408,
            dense_ffn=5472, vocab=32768, routed_scaling=1.0, rms_eps=1e-5,
            description="GLM-4.5-Air's layout (46 layers, first dense, 128 experts of 1408, "
            "top-8 + 1 shared) at hidden 1024: 13.9 GB of experts",
        ),
    )
}  # fmt: skip


def _writer(p: FamilyPreset, path: Path, seed: int) -> gguf.GGUFWriter:
    w = gguf.GGUFWriter(str(path), p.arch)
    a = p.arch
    w.add_name(f"colibri-synthetic-{p.name}-s{seed}")
    w.add_description(f"colibri synthetic {a} (random weights, generator "
                      f"v{GENERATOR_VERSION}, preset {p.name}, seed {seed}"
                      + (f", routing {p.routing}" if p.routing != "local" else "") + "); "
                      "benchmarks/synthetic_deepseek.py")
    w.add_context_length(p.context_length)
    w.add_embedding_length(p.hidden)
    w.add_block_count(p.n_layers)
    w.add_feed_forward_length(p.dense_ffn)
    w.add_head_count(p.n_heads)
    w.add_rope_freq_base(p.rope_theta)
    w.add_layer_norm_rms_eps(p.rms_eps)
    w.add_expert_count(p.n_experts)
    w.add_expert_used_count(p.top_k)
    w.add_expert_group_count(p.n_group)
    w.add_expert_group_used_count(p.topk_group)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_feed_forward_length(p.expert_ffn)
    w.add_expert_shared_count(p.n_shared)
    w.add_leading_dense_block_count(p.n_dense)
    w.add_expert_weights_scale(p.routed_scaling)
    w.add_expert_weights_norm(True)
    if a == "deepseek2":
        w.add_head_count_kv(1)
        w.add_vocab_size(p.vocab)
        if p.q_lora:
            w.add_q_lora_rank(p.q_lora)
        w.add_kv_lora_rank(p.kv_lora)
        w.add_key_length(p.kv_lora + p.qk_rope)
        w.add_value_length(p.kv_lora)
        w.add_key_length_mla(p.qk_nope + p.qk_rope)
        w.add_value_length_mla(p.v_dim)
        w.add_rope_dimension_count(p.qk_rope)
    else:
        w.add_head_count_kv(p.n_kv_heads)
        w.add_key_length(p.head_dim)
        w.add_value_length(p.head_dim)
        w.add_rope_dimension_count(p.head_dim // 2)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(w, p.vocab)
    for t in p.tensors():
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.ggml_type)
    return w


def write_family_gguf(preset: FamilyPreset | str, path: str | os.PathLike[str], seed: int = 0,
                      progress: Any = None, writer: Any = None) -> WriteReport:  # fmt: skip
    """Write ``preset`` with weights drawn from ``seed`` to ``path`` (atomically). ``writer``
    makes the header (another family's preset: synthetic_gpt_oss.py); the data is written
    the same way for every family."""
    p = FAMILY_PRESETS[preset] if isinstance(preset, str) else preset
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    specs = p.tensors()
    total = sum(t.nbytes for t in specs)
    rss_before = _rss_now()
    t0 = time.perf_counter()
    w = (writer or _writer)(p, tmp, seed)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None and len(w.fout) == 1
        f = w.fout[0]
        done = 0
        for t in specs:
            f.write(bytes(-f.tell() % w.data_alignment))
            n = 0
            for chunk in tensor_chunks(t, seed):
                f.write(chunk.data)
                n += chunk.nbytes
                done += chunk.nbytes
                if progress is not None:
                    progress(done, total, t.name)
            if n != t.nbytes:
                raise AssertionError(f"{t.name}: wrote {n} bytes, expected {t.nbytes}")
        f.write(bytes(-f.tell() % w.data_alignment))
        f.flush()
        os.fsync(f.fileno())
        w.close()
        os.replace(tmp, out)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    return WriteReport(path=out, preset=p.name, seed=seed, file_bytes=out.stat().st_size,
                       tensor_bytes=total, expert_bytes=p.expert_bytes,
                       bytes_per_expert=p.bytes_per_expert,
                       routed_bytes_per_token=p.routed_bytes_per_token,
                       wall_s=time.perf_counter() - t0, peak_rss_bytes=peak_rss_bytes(),
                       rss_before_bytes=rss_before)  # fmt: skip


def default_path(preset: FamilyPreset | str, seed: int = 0, root: Path | None = None) -> Path:
    name = preset if isinstance(preset, str) else preset.name
    if not isinstance(preset, str) and preset.routing != "local":
        name += f"-{preset.routing}"  # local keeps the file name it always had
    return (root or DEFAULT_DIR) / f"synthetic-{name}-v{GENERATOR_VERSION}-s{seed}.Q4_0.gguf"


def family_with_routing(preset: FamilyPreset | str, routing: str) -> FamilyPreset:
    """The preset in a routing regime (synthetic_routing.REGIMES)."""
    p = FAMILY_PRESETS[preset] if isinstance(preset, str) else preset
    return dataclasses.replace(p, routing=regime(routing).name)


def ensure_family_preset(preset: FamilyPreset | str, seed: int = 0, root: Path | None = None,
                         progress: Any = None) -> Path:  # fmt: skip
    path = default_path(preset, seed, root)
    if not path.is_file():
        write_family_gguf(preset, path, seed, progress)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("preset", nargs="?", choices=sorted(FAMILY_PRESETS))
    ap.add_argument("-o", "--output", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="override the preset's layer count")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--routing", default="local", choices=("local", "realistic", "uniform"),
                    help="routing regime (benchmarks/synthetic_routing.py)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    if args.list or args.preset is None:
        for p in FAMILY_PRESETS.values():
            s = p.summary()
            print(f"{p.name:<11}{p.arch:<10}{p.n_layers:>4} layers {p.n_experts:>4}x"
                  f"{p.expert_ffn:<5} top-{p.top_k}  experts {_fmt(s['expert_bytes']):>10}  "
                  f"per token {_fmt(s['routed_bytes_per_token']):>10}  "
                  f"file {_fmt(s['tensor_bytes']):>10}  {p.description}")  # fmt: skip
        return 0
    preset = family_with_routing(args.preset, args.routing)
    if args.layers is not None:
        preset = dataclasses.replace(preset, name=f"{preset.name}-layers{args.layers}",
                                     n_layers=args.layers)  # fmt: skip
    path = args.output or default_path(preset, args.seed)
    if path.exists() and not args.force:
        print(f"{path} exists (--force rewrites it)", file=sys.stderr)
        return 0
    r = write_family_gguf(preset, path, args.seed, _ProgressLine(preset.name))
    print(f"wrote {r.path}: {_fmt(r.file_bytes)}, experts {_fmt(r.expert_bytes)}, "
          f"{_fmt(r.routed_bytes_per_token)} routed per token, {r.wall_s:.1f} s")  # fmt: skip
    return 0


__all__ = ["F32", "FAMILY_PRESETS", "FamilyPreset", "ensure_family_preset", "write_family_gguf"]

if __name__ == "__main__":
    sys.exit(main())
