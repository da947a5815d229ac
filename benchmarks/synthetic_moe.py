"""Synthetic MoE models with random weights, shaped like real ones, for streaming benchmarks.

Writes ``qwen3moe`` GGUF files that llama.cpp and colibri both load: llama.cpp's metadata
keys and tensor names (per-head QK-norm ``attn_q_norm``/``attn_k_norm``, stacked
``ffn_{gate,up,down}_exps``, router ``ffn_gate_inp``, NEOX RoPE, no Q/K row permutation),
Q4_0 matrices (experts, attention, embeddings, LM head), F32 norms and routers, and a small
byte-level BPE tokenizer (``gpt2`` model, ``qwen2`` pre-tokenizer: 256 byte tokens, a few
merges, the Qwen chat specials, the rest of the vocabulary ``[PADn]`` unused tokens, as in
Qwen's own GGUFs) with a ChatML template.

The weights are random but not degenerate: Q4_0 blocks with uniform random nibbles and
per-block fp16 scales chosen so every matrix has a standard deviation of about
``1/sqrt(columns)`` (activations stay O(1) through the layers), RMSNorm weights ``1 +- 0.1``,
and a normal router (standard deviation ``1/sqrt(hidden)``) so the chosen experts vary from
token to token. Everything is a function of ``(preset, seed)``: each tensor draws from its
own generator seeded with the seed and the tensor's name, in fixed-size chunks, so a file is
reproducible byte for byte and its layers are independent of the layer count.

Writing streams tensor by tensor in chunks of at most 18 MiB (header through
``gguf.GGUFWriter``, data written directly), so peak memory does not depend on the model
size. The file is written under a temporary name and renamed into place when complete.

    python benchmarks/synthetic_moe.py --list
    python benchmarks/synthetic_moe.py moe-8g                  # build/bench-data/...gguf
    python benchmarks/synthetic_moe.py tiny -o /tmp/tiny.gguf --seed 3 --json

From Python::

    from synthetic_moe import PRESETS, ensure_preset, write_synthetic_gguf
    path = ensure_preset("small")           # writes it on first use, then reuses the file

The same weights as a colibri native container come from ``colibri convert`` of this GGUF.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np
import numpy.typing as npt

GENERATOR_VERSION = 2
REPO = Path(__file__).resolve().parent.parent
if str(REPO / "benchmarks") not in sys.path:  # its sibling synthetic_routing.py
    sys.path.insert(0, str(REPO / "benchmarks"))
DEFAULT_DIR = REPO / "build" / "bench-data"

Q4_0 = gguf.GGMLQuantizationType.Q4_0
F32 = gguf.GGMLQuantizationType.F32
MXFP4 = gguf.GGMLQuantizationType.MXFP4
MXFP4_BLOCK_BYTES = 17  # E8M0 exponent + 16 bytes of FP4 (E2M1) nibbles, 32 weights
# Standard deviation of ggml's doubled E2M1 table (0, 1, 2, 3, 4, 6, 8, 12 and negatives)
# over uniform codes; a block's values are table * 2^(e - 128).
_MXFP4_STD = float(np.sqrt(2 * (1 + 4 + 9 + 16 + 36 + 64 + 144) / 16))
QK4_0 = 32  # weights per Q4_0 block
Q4_0_BLOCK_BYTES = 18  # fp16 scale + 16 bytes of nibbles
CHUNK_BLOCKS = 1 << 20  # Q4_0 blocks generated at a time: 18 MiB
CHUNK_F32 = 1 << 22  # F32 values generated at a time: 16 MiB
# Q4_0 weights are d * (q - 8) with q uniform in 0..15 here: E[(q - 8)^2] = 21.5, and |d| is
# d_base * U(0.5, 1.5) with E[U^2] = 13/12, so the weights' standard deviation is
# d_base * sqrt(21.5 * 13 / 12).
_Q4_STD = float(np.sqrt(21.5 * 13.0 / 12.0))


@dataclass(frozen=True)
class Preset:
    """The shape of a synthetic Qwen3-MoE model (every layer is an MoE layer)."""

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
    context_length: int = 40960
    routing: str = "local"  # synthetic_routing.REGIMES
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    description: str = ""

    def __post_init__(self) -> None:
        for what, cols in (
            ("hidden", self.hidden),
            ("n_heads * head_dim", self.n_heads * self.head_dim),
            ("expert_ffn", self.expert_ffn),
        ):
            if cols % QK4_0:
                raise ValueError(f"{self.name}: {what} = {cols} is not a multiple of {QK4_0}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: {self.n_heads} heads over {self.n_kv_heads} KV heads")
        if not 0 < self.top_k <= self.n_experts:
            raise ValueError(f"{self.name}: top-k {self.top_k} of {self.n_experts} experts")
        if self.vocab < min_vocab():
            raise ValueError(f"{self.name}: vocab {self.vocab} < {min_vocab()} (bytes + specials)")

    # ----------------------------------------------------------------- derived sizes

    @property
    def bytes_per_expert(self) -> int:
        """Bytes of one routed expert: gate + up + down, Q4_0."""
        return 3 * q4_0_nbytes(self.expert_ffn * self.hidden)

    @property
    def expert_bytes(self) -> int:
        """Bytes of all routed experts."""
        return self.n_layers * self.n_experts * self.bytes_per_expert

    @property
    def routed_bytes_per_token(self) -> int:
        """Expert bytes one token touches: top-k x layers x bytes per expert."""
        return self.top_k * self.n_layers * self.bytes_per_expert

    def tensors(self) -> list[TensorSpec]:
        """Every tensor, in file order (llama.cpp's converter order: layer by layer)."""
        h, hd, e, f = self.hidden, self.head_dim, self.n_experts, self.expert_ffn
        q, kv = self.n_heads * hd, self.n_kv_heads * hd
        out = [TensorSpec("token_embd.weight", (self.vocab, h), "q4_0", 1.0)]
        for i in range(self.n_layers):
            b = f"blk.{i}."
            out += [
                TensorSpec(b + "attn_norm.weight", (h,), "norm"),
                TensorSpec(b + "attn_q.weight", (q, h), "q4_0", h**-0.5),
                TensorSpec(b + "attn_k.weight", (kv, h), "q4_0", h**-0.5),
                TensorSpec(b + "attn_v.weight", (kv, h), "q4_0", h**-0.5),
                TensorSpec(b + "attn_output.weight", (h, q), "q4_0", q**-0.5),
                TensorSpec(b + "attn_q_norm.weight", (hd,), "norm"),
                TensorSpec(b + "attn_k_norm.weight", (hd,), "norm"),
                TensorSpec(b + "ffn_norm.weight", (h,), "norm"),
                TensorSpec(b + "ffn_gate_inp.weight", (e, h), "router", h**-0.5),
                TensorSpec(b + "ffn_gate_exps.weight", (e, f, h), "q4_0", h**-0.5),
                TensorSpec(b + "ffn_down_exps.weight", (e, h, f), "q4_0", f**-0.5),
                TensorSpec(b + "ffn_up_exps.weight", (e, f, h), "q4_0", h**-0.5),
            ]
        out += [
            TensorSpec("output_norm.weight", (h,), "norm"),
            TensorSpec("output.weight", (self.vocab, h), "q4_0", h**-0.5),
        ]
        from synthetic_routing import shape_specs

        return shape_specs(out, self.routing, h)

    def summary(self) -> dict[str, Any]:
        tensors = self.tensors()
        total = sum(t.nbytes for t in tensors)
        return {
            "preset": self.name,
            "routing": self.routing,
            "layers": self.n_layers,
            "hidden": self.hidden,
            "heads": self.n_heads,
            "kv_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "experts": self.n_experts,
            "top_k": self.top_k,
            "expert_ffn": self.expert_ffn,
            "vocab": self.vocab,
            "tensors": len(tensors),
            "tensor_bytes": total,
            "expert_bytes": self.expert_bytes,
            "resident_bytes": total - self.expert_bytes,
            "bytes_per_expert": self.bytes_per_expert,
            "routed_bytes_per_token": self.routed_bytes_per_token,
        }


Kind = Literal["q4_0", "mxfp4", "norm", "router"]


@dataclass(frozen=True)
class TensorSpec:
    name: str  # GGUF name
    shape: tuple[int, ...]  # NumPy / PyTorch order (GGML ne reversed)
    kind: Kind  # q4_0 / mxfp4 matrix, F32 RMSNorm weight, F32 router (or any F32 vector)
    std: float = 0.0  # target standard deviation of the weights (matrices, router)
    zero_rows: int = 0  # routing regime: the last rows of each matrix are zero
    col_scale: tuple[int, float, float] | None = None  # regime: (width, outside, inside)

    @property
    def n(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        if self.kind == "mxfp4":
            return self.n // QK4_0 * MXFP4_BLOCK_BYTES
        return q4_0_nbytes(self.n) if self.kind == "q4_0" else 4 * self.n

    @property
    def ggml_type(self) -> gguf.GGMLQuantizationType:
        return {"q4_0": Q4_0, "mxfp4": MXFP4}.get(self.kind, F32)


def q4_0_nbytes(n_weights: int) -> int:
    return n_weights // QK4_0 * Q4_0_BLOCK_BYTES


# --------------------------------------------------------------------------- tokenizer

# A few byte-level BPE merges (GPT-2 symbols, "Ġ" is a space), so the vocabulary has merges
# (llama.cpp requires tokenizer.ggml.merges for gpt2) and common words tokenize shorter.
_MERGES = (
    ("h", "e"), ("Ġ", "t"), ("Ġ", "a"), ("i", "n"), ("r", "e"), ("o", "n"), ("Ġt", "he"),
    ("e", "r"), ("Ġ", "s"), ("Ġ", "w"), ("o", "r"), ("a", "t"), ("e", "n"), ("Ġ", "c"),
    ("i", "s"), ("i", "t"), ("a", "n"), ("Ġ", "o"), ("Ġ", "f"), ("e", "d"),
)  # fmt: skip
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_symbols() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable symbol of each byte value 0..255."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    sym = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in sym:
            sym[b] = chr(256 + extra)
            extra += 1
    return [sym[b] for b in range(256)]


def min_vocab() -> int:
    return 256 + len(_MERGES) + len(_SPECIALS)


def vocabulary(n: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of an ``n``-token byte-level BPE vocabulary."""
    tokens = _byte_symbols() + [a + b for a, b in _MERGES]
    types = [1] * len(tokens)  # NORMAL
    tokens += list(_SPECIALS)
    types += [3] * len(_SPECIALS)  # CONTROL
    pad = n - len(tokens)
    if pad < 0:
        raise ValueError(f"vocab {n} < {len(tokens)}")
    tokens += [f"[PAD{i}]" for i in range(len(tokens), n)]
    types += [5] * pad  # UNUSED, as the padding of Qwen's GGUF vocabularies
    return tokens, types, [f"{a} {b}" for a, b in _MERGES]


def special_ids() -> dict[str, int]:
    base = 256 + len(_MERGES)
    return {s: base + i for i, s in enumerate(_SPECIALS)}


# Qwen3-30B-A3B (config.json of Qwen/Qwen3-30B-A3B): 48 layers, hidden 2048, 32 query heads
# and 4 KV heads of 128, 128 experts of width 768, top-8, vocab 151936, rope theta 1e6.
_QWEN3_30B = dict(
    hidden=2048, n_heads=32, n_kv_heads=4, head_dim=128, n_experts=128, top_k=8, expert_ffn=768
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "tiny", n_layers=4, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32, n_experts=16,
            top_k=4, expert_ffn=64, vocab=512, context_length=4096,
            description="tests: 16 experts x 4 layers, 1.1 MB",
        ),
        Preset(
            "tiny-k", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, n_experts=8,
            top_k=2, expert_ffn=256, vocab=512, context_length=4096,
            description="tests: every row a multiple of 256 (K-quants apply to all), 3.9 MB",
        ),
        Preset(
            "wide", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, head_dim=32,
            n_experts=128, top_k=8, expert_ffn=64, vocab=512, context_length=4096,
            description="tests: 128 experts x 2 layers (a real model's expert count), 3.7 MB",
        ),
        Preset(
            "small", n_layers=18, hidden=1024, n_heads=16, n_kv_heads=4, head_dim=64,
            n_experts=64, top_k=8, expert_ffn=512, vocab=32768,
            description="about 1 GB of experts (0.95 GiB), quick to write and stream",
        ),
        Preset(
            "moe-8g", n_layers=26, vocab=151936, **_QWEN3_30B,
            description="Qwen3-30B-A3B shapes, 26 of its 48 layers: 8.8 GB of experts",
        ),
        Preset(
            "qwen3-30b-a3b", n_layers=48, vocab=151936, **_QWEN3_30B,
            description="Qwen3-30B-A3B's real shapes (full vocab): 16.3 GB of experts",
        ),
    )
}  # fmt: skip


# --------------------------------------------------------------------------- weights


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def tensor_chunks(spec: TensorSpec, seed: int) -> Iterator[npt.NDArray[Any]]:
    """The tensor's bytes, in chunks of at most 18 MiB (deterministic in (spec, seed))."""
    if spec.zero_rows or spec.col_scale is not None:
        from synthetic_routing import reshape_chunks

        plain = dataclasses.replace(spec, zero_rows=0, col_scale=None)
        yield from reshape_chunks(spec, tensor_chunks(plain, seed))
        return
    rng = _rng(seed, spec.name)
    if spec.kind == "q4_0":
        blocks = spec.n // QK4_0
        d_base = spec.std / _Q4_STD
        block_t = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
        for start in range(0, blocks, CHUNK_BLOCKS):
            nb = min(CHUNK_BLOCKS, blocks - start)
            words = rng.integers(0, 1 << 32, size=-(-nb * Q4_0_BLOCK_BYTES // 4), dtype=np.uint32)
            raw = words.view(np.uint8)[: nb * Q4_0_BLOCK_BYTES]
            buf = raw.view(block_t)
            # Scales d_base * [0.5, 1.5) with a random sign. The sign matters: q - 8 has mean
            # -0.5, so with positive scales every matrix carries a rank-one part along the
            # all-ones vectors that grows layer after layer until every token has the same
            # hidden state and the same experts. Random signs cancel it.
            u = rng.random(nb, dtype=np.float32)
            u *= 2.0
            u -= 1.0  # [-1, 1)
            scale = np.copysign(np.abs(u) + 0.5, u)
            scale *= d_base
            buf["d"] = scale.astype(np.float16)
            yield raw
    elif spec.kind == "mxfp4":
        yield from _mxfp4_chunks(spec, rng)
    elif spec.kind == "norm":
        yield (1.0 + 0.1 * rng.standard_normal(spec.n, dtype=np.float32)).astype("<f4")
    else:  # router
        for start in range(0, spec.n, CHUNK_F32):
            n = min(CHUNK_F32, spec.n - start)
            yield (spec.std * rng.standard_normal(n, dtype=np.float32)).astype("<f4")


def _mxfp4_chunks(spec: TensorSpec, rng: np.random.Generator) -> Iterator[npt.NDArray[Any]]:
    """MXFP4 blocks: uniform random nibbles (the table is symmetric, so no rank-one drift)
    and a power-of-two scale per block, half the blocks at ``e`` and half at ``e - 1``, with
    ``e`` chosen so the matrix's standard deviation is about ``spec.std``."""
    blocks = spec.n // QK4_0
    e = int(np.ceil(128 + np.log2(spec.std / _MXFP4_STD)))
    for start in range(0, blocks, CHUNK_BLOCKS):
        nb = min(CHUNK_BLOCKS, blocks - start)
        words = rng.integers(0, 1 << 32, size=-(-nb * MXFP4_BLOCK_BYTES // 4), dtype=np.uint32)
        raw = words.view(np.uint8)[: nb * MXFP4_BLOCK_BYTES]
        raw.reshape(nb, MXFP4_BLOCK_BYTES)[:, 0] = e - (raw[::MXFP4_BLOCK_BYTES] & 1)
        yield raw


# --------------------------------------------------------------------------- writer


@dataclass(frozen=True)
class WriteReport:
    path: Path
    preset: str
    seed: int
    file_bytes: int
    tensor_bytes: int
    expert_bytes: int
    bytes_per_expert: int
    routed_bytes_per_token: int
    wall_s: float
    peak_rss_bytes: int  # the process's peak resident set size after writing (VmHWM)
    rss_before_bytes: int  # current RSS just before writing started

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["path"] = str(self.path)
        return d


Progress = Callable[[int, int, str], None]


def _rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss_bytes() -> int:
    """This process's peak RSS: VmHWM on Linux (ru_maxrss survives exec: a child started
    from a big process would report its parent's size), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(kb) * (1 if sys.platform == "darwin" else 1024)


def add_tokenizer(w: gguf.GGUFWriter, vocab: int, pad: bool = False) -> None:
    """The byte-level BPE tokenizer of an ``vocab``-token synthetic model (every writer's)."""
    tokens, types, merges = vocabulary(vocab)
    ids = special_ids()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(ids["<|endoftext|>"])
    w.add_eos_token_id(ids["<|im_end|>"])
    if pad:
        w.add_pad_token_id(ids["<|endoftext|>"])
    w.add_add_bos_token(False)


def _writer(preset: Preset, path: Path, seed: int) -> gguf.GGUFWriter:
    arch = gguf.MODEL_ARCH.QWEN3MOE
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(f"colibri-synthetic-{preset.name}-s{seed}")
    w.add_description(
        f"colibri synthetic MoE (random weights, generator v{GENERATOR_VERSION}, "
        f"preset {preset.name}, seed {seed}"
        + (f", routing {preset.routing}" if preset.routing != "local" else "")
        + "); benchmarks/synthetic_moe.py"
    )
    w.add_context_length(preset.context_length)
    w.add_embedding_length(preset.hidden)
    w.add_block_count(preset.n_layers)
    w.add_feed_forward_length(preset.top_k * preset.expert_ffn)
    w.add_head_count(preset.n_heads)
    w.add_head_count_kv(preset.n_kv_heads)
    w.add_rope_freq_base(preset.rope_theta)
    w.add_layer_norm_rms_eps(preset.rms_eps)
    w.add_expert_count(preset.n_experts)
    w.add_expert_used_count(preset.top_k)
    w.add_key_length(preset.head_dim)
    w.add_value_length(preset.head_dim)
    w.add_expert_feed_forward_length(preset.expert_ffn)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_tokenizer(w, preset.vocab, pad=True)
    w.add_chat_template(CHAT_TEMPLATE)
    for t in preset.tensors():
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.ggml_type)
    return w


def write_synthetic_gguf(
    preset: Preset | str,
    path: str | os.PathLike[str],
    seed: int = 0,
    progress: Progress | None = None,
) -> WriteReport:
    """Write ``preset`` with weights drawn from ``seed`` to ``path`` (atomically)."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    specs = p.tensors()
    total = sum(t.nbytes for t in specs)
    rss_before = _rss_now()
    t0 = time.perf_counter()
    w = _writer(p, tmp, seed)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None and len(w.fout) == 1
        f = w.fout[0]
        align = w.data_alignment
        done = 0
        for t in specs:
            f.write(bytes(-f.tell() % align))  # GGUFWriter.write_padding, as it computes offsets
            n = 0
            for chunk in tensor_chunks(t, seed):
                f.write(chunk.data)
                n += chunk.nbytes
                done += chunk.nbytes
                if progress is not None:
                    progress(done, total, t.name)
            if n != t.nbytes:
                raise AssertionError(f"{t.name}: wrote {n} bytes, expected {t.nbytes}")
        f.write(bytes(-f.tell() % align))
        f.flush()
        os.fsync(f.fileno())  # on disk before it gets its name (and in the timing)
        w.close()
        os.replace(tmp, out)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise
    wall = time.perf_counter() - t0
    return WriteReport(
        path=out,
        preset=p.name,
        seed=seed,
        file_bytes=out.stat().st_size,
        tensor_bytes=total,
        expert_bytes=p.expert_bytes,
        bytes_per_expert=p.bytes_per_expert,
        routed_bytes_per_token=p.routed_bytes_per_token,
        wall_s=wall,
        peak_rss_bytes=peak_rss_bytes(),
        rss_before_bytes=rss_before,
    )


def default_path(preset: Preset | str, seed: int = 0, root: Path | None = None) -> Path:
    name = preset if isinstance(preset, str) else preset.name
    if not isinstance(preset, str) and preset.routing != "local":
        name += f"-{preset.routing}"  # local keeps the file name it always had
    return (root or DEFAULT_DIR) / f"synthetic-{name}-v{GENERATOR_VERSION}-s{seed}.Q4_0.gguf"


def with_routing(preset: Preset | str, routing: str) -> Preset:
    """The preset (a name or a Preset) in a routing regime (synthetic_routing.REGIMES)."""
    from synthetic_routing import regime

    p = PRESETS[preset] if isinstance(preset, str) else preset
    return dataclasses.replace(p, routing=regime(routing).name)


def ensure_preset(
    preset: Preset | str,
    seed: int = 0,
    root: Path | None = None,
    progress: Progress | None = None,
) -> Path:
    """The preset's file under ``root`` (build/bench-data/), written on first use. The
    DeepSeek-V3 / GLM-4.5-shaped presets (synthetic_deepseek.FAMILY_PRESETS) and the
    gpt-oss-shaped ones (synthetic_gpt_oss.GPT_OSS_PRESETS) too."""
    from synthetic_deepseek import FAMILY_PRESETS, FamilyPreset, ensure_family_preset
    from synthetic_gpt_oss import GPT_OSS_PRESETS, GptOssPreset, ensure_gpt_oss_preset

    if isinstance(preset, FamilyPreset) or (isinstance(preset, str) and preset in FAMILY_PRESETS):
        return ensure_family_preset(preset, seed, root, progress)
    if isinstance(preset, GptOssPreset) or (isinstance(preset, str) and preset in GPT_OSS_PRESETS):
        return ensure_gpt_oss_preset(preset, seed, root, progress)
    path = default_path(preset, seed, root)
    if not path.is_file():
        write_synthetic_gguf(preset, path, seed, progress)
    return path


# --------------------------------------------------------------------------- CLI


def _fmt(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


class _ProgressLine:
    """A progress line on stderr: rewritten in place on a terminal, every 10 s otherwise."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.last = -1e9

    def __call__(self, done: int, total: int, name: str) -> None:
        now = time.perf_counter()
        if done < total and now - self.last < (0.5 if self.tty else 10.0):
            return
        self.last = now
        rate = done / max(now - self.t0, 1e-9)
        line = (
            f"{self.label}: {_fmt(done)} / {_fmt(total)} ({100 * done / total:.0f}%), "
            f"{rate / 1e6:.0f} MB/s, {name}"
        )
        end = "\n" if (not self.tty or done >= total) else ""
        sys.stderr.write(("\r\033[K" if self.tty else "") + line + end)
        sys.stderr.flush()


def _list() -> None:
    from synthetic_deepseek import main as family_list

    _list_qwen()
    print("DeepSeek-V3 / GLM-4.5-shaped presets (benchmarks/synthetic_deepseek.py):")
    family_list(["--list"])


def _list_qwen() -> None:
    cols = ("preset", "layers", "experts", "top_k", "expert_ffn", "vocab")
    print(
        f"{'preset':<15}{'layers':>7}{'experts':>8}{'top-k':>6}{'ffn':>6}{'vocab':>8}"
        f"{'experts':>12}{'per expert':>13}{'per token':>12}{'file':>12}"
    )
    for p in PRESETS.values():
        s = p.summary()
        print(
            "".join(
                f"{s[c]:<15}" if c == "preset" else f"{s[c]:>{w}}"
                for c, w in zip(cols, (15, 7, 8, 6, 6, 8), strict=True)
            )
            + f"{_fmt(s['expert_bytes']):>12}{_fmt(s['bytes_per_expert']):>13}"
            f"{_fmt(s['routed_bytes_per_token']):>12}{_fmt(s['tensor_bytes']):>12}"
            f"   {p.description}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("preset", nargs="?", choices=sorted(PRESETS), help="what to write")
    ap.add_argument("-o", "--output", type=Path, help="GGUF path (default: build/bench-data/)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="override the preset's layer count")
    ap.add_argument("--vocab", type=int, help="override the preset's vocabulary size")
    ap.add_argument("--routing", default="local", choices=("local", "realistic", "uniform"),
                    help="routing regime (benchmarks/synthetic_routing.py)")
    ap.add_argument("--force", action="store_true", help="rewrite an existing file")
    ap.add_argument("--list", action="store_true", help="list the presets and their sizes")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    if args.list or args.preset is None:
        _list()
        return 0
    preset = with_routing(args.preset, args.routing)
    changes: dict[str, Any] = {}
    if args.layers is not None:
        changes["n_layers"] = args.layers
    if args.vocab is not None:
        changes["vocab"] = args.vocab
    if changes:
        suffix = "".join(f"-{k.removeprefix('n_')}{v}" for k, v in changes.items())
        preset = dataclasses.replace(preset, name=preset.name + suffix, **changes)
    path = args.output or default_path(preset, args.seed)
    if path.exists() and not args.force:
        print(f"{path} exists (--force rewrites it)", file=sys.stderr)
        if args.json:
            print(json.dumps({"path": str(path), **preset.summary()}, indent=2))
        return 0
    free = os.statvfs(path.parent if path.parent.exists() else Path.cwd())
    need = sum(t.nbytes for t in preset.tensors())
    if free.f_bavail * free.f_frsize < need + (1 << 30):
        print(f"not enough free disk for {_fmt(need)} at {path.parent}", file=sys.stderr)
        return 1
    report = write_synthetic_gguf(preset, path, args.seed, _ProgressLine(f"{preset.name}"))
    if args.json:
        print(json.dumps({**report.as_dict(), **preset.summary()}, indent=2))
    else:
        print(
            f"wrote {report.path}: {_fmt(report.file_bytes)} ({report.file_bytes:,} bytes), "
            f"experts {_fmt(report.expert_bytes)}, {_fmt(report.bytes_per_expert)} per "
            f"expert, {_fmt(report.routed_bytes_per_token)} routed per token; "
            f"{report.wall_s:.1f} s, peak RSS {_fmt(report.peak_rss_bytes)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
