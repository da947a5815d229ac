"""Tiny random DeepSeek / GLM-family checkpoints (transformers 5.24) and their GGUF files
written by llama.cpp's own converter.

One variant per case the acceptance names (vocab 256, hidden 64, 3 trunk layers with the
first dense, 4 heads):

==================  ===============================================================
variant             what it exercises
==================  ===============================================================
deepseek_v3         q-LoRA, n_group 4 / topk_group 2, YaRN with mscale_all_dim, MTP
kimi_k2             deepseek_v3 shaped like Kimi-K2: n_group 1, 64 experts, top-8
deepseek_v2_lite    no q-LoRA, softmax "greedy", 2 shared experts
deepseek_v2_glg     softmax "group_limited_greedy" (n_group 4, topk_group 2)
deepseek_v32        MLA + DSA indexer (index_topk 8 < the 32-token test input)
glm_moe_dsa         MLA + DSA with a "shared" indexer layer, MTP
glm4_moe            GQA, partial rotary 0.5, QK-norm, q/k/v bias, MTP
glm4_moe_lite       MLA via mlp_layer_types
==================  ===============================================================

Weights have a larger spread than transformers' init (as in modelfactory), and
``e_score_correction_bias`` is random (transformers initializes it to zeros, which would
hide selection bugs). ``config.json`` carries ``scoring_func``/``topk_method`` as the real
checkpoints do (save_pretrained leaves them out, and without them llama.cpp's converter
writes softmax gating). MTP variants get one multi-token-prediction layer in the
checkpoint (``model.layers.3.*``: a decoder layer plus eh_proj, enorm, hnorm,
shared_head.norm; transformers ignores these keys when it loads the trunk).

GGUF files come from llama.cpp's ``convert_hf_to_gguf.py`` (the llama-cpp-python 0.3.36
sdist's ``vendor/llama.cpp``, found through :func:`llama_cpp_dir`) run on the checkpoint,
with a placeholder vocabulary (tiny models have no tokenizer). Everything is cached under
``build/test-models/deepseek-<version>/``.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

from support.fetched_data import missing

FACTORY_VERSION = "2"
REPO = Path(__file__).resolve().parents[2]
VOCAB = 256
N_LAYERS = 3
LLAMA_CPP_VERSION = "0.3.36"

_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=N_LAYERS, num_attention_heads=4,
    intermediate_size=96, moe_intermediate_size=32, max_position_embeddings=256,
    rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=0,
)  # fmt: skip
_MLA: dict[str, Any] = dict(
    kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_key_value_heads=4,
)  # fmt: skip
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
         "original_max_position_embeddings": 64}  # fmt: skip

# variant -> (transformers class, config kwargs, config.json extras, has MTP layer)
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any], bool]] = {
    "deepseek_v3": ("DeepseekV3", dict(
        **_MLA, q_lora_rank=24, n_routed_experts=16, num_experts_per_tok=4, n_group=4,
        topk_group=2, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, rope_interleave=True, rope_parameters=_YARN,
    ), {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, True),
    "kimi_k2": ("DeepseekV3", dict(
        **_MLA, q_lora_rank=24, n_routed_experts=64, num_experts_per_tok=8, n_group=1,
        topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.827, norm_topk_prob=True,
    ), {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, False),
    "deepseek_v2_lite": ("DeepseekV2", dict(
        **_MLA, q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=2, first_k_dense_replace=1, routed_scaling_factor=1.0,
        norm_topk_prob=False, topk_method="greedy", n_group=1, topk_group=1,
        rope_parameters={**_YARN, "mscale": 0.707, "mscale_all_dim": 0.707},
    ), {"scoring_func": "softmax", "topk_method": "greedy"}, False),
    "deepseek_v2_glg": ("DeepseekV2", dict(
        **_MLA, q_lora_rank=24, n_routed_experts=16, num_experts_per_tok=3,
        n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=1.5,
        norm_topk_prob=False, topk_method="group_limited_greedy", n_group=4, topk_group=2,
    ), {"scoring_func": "softmax", "topk_method": "group_limited_greedy"}, False),
    "deepseek_v32": ("DeepseekV32", dict(
        **_MLA, q_lora_rank=24, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
        topk_group=1, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
        index_n_heads=16, index_head_dim=16, index_topk=8,
    ), {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, False),
    "glm_moe_dsa": ("GlmMoeDsa", dict(
        **_MLA, q_lora_rank=24, n_routed_experts=8, num_experts_per_tok=2, n_group=1,
        topk_group=1, n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
        index_n_heads=16, index_head_dim=16, index_topk=8,
        indexer_types=["full", "shared", "full"],
    ), {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "num_nextn_predict_layers": 1},
        True),
    "glm4_moe": ("Glm4Moe", dict(
        num_key_value_heads=2, head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
        n_group=1, topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=1.0, norm_topk_prob=True, use_qk_norm=True, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5},
    ), {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, True),
    "glm4_moe_lite": ("Glm4MoeLite", dict(
        **_MLA, q_lora_rank=24, n_routed_experts=8, num_experts_per_tok=2, n_group=1,
        topk_group=1, n_shared_experts=1, routed_scaling_factor=1.8, norm_topk_prob=True,
        mlp_layer_types=["dense", "sparse", "sparse"],
    ), {"scoring_func": "sigmoid", "topk_method": "noaux_tc", "first_k_dense_replace": 1}, False),
}
FAMILY = {"deepseek_v3": "deepseek_v3", "kimi_k2": "deepseek_v3", "deepseek_v2_lite": "deepseek_v2",
          "deepseek_v2_glg": "deepseek_v2", "deepseek_v32": "deepseek_v32",
          "glm_moe_dsa": "glm_moe_dsa", "glm4_moe": "glm4_moe",
          "glm4_moe_lite": "glm4_moe_lite"}  # fmt: skip
# GGUF architecture llama.cpp's converter writes for each family.
GGUF_ARCH = {"deepseek_v3": "deepseek2", "deepseek_v2": "deepseek2", "deepseek_v32": "deepseek32",
             "glm_moe_dsa": "glm-dsa", "glm4_moe": "glm4moe",
             "glm4_moe_lite": "deepseek2"}  # fmt: skip
GGUF_TYPES = ("F32", "Q8_0")


def _config(variant: str, n_layers: int = N_LAYERS) -> transformers.PretrainedConfig:
    cls, kw, _, _ = VARIANTS[variant]
    kw = {**_COMMON, **kw, "num_hidden_layers": n_layers}
    if "mlp_layer_types" in kw:
        kw["mlp_layer_types"] = kw["mlp_layer_types"] + ["sparse"] * (n_layers - N_LAYERS)
    if "indexer_types" in kw:
        kw["indexer_types"] = kw["indexer_types"] + ["full"] * (n_layers - N_LAYERS)
    return getattr(transformers, cls + "Config")(**kw)


def _randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))


def build_hf_model(variant: str, seed: int = 0, n_layers: int = N_LAYERS) -> torch.nn.Module:
    torch.manual_seed(seed)
    cls = getattr(transformers, VARIANTS[variant][0] + "ForCausalLM")
    model = cls(_config(variant, n_layers)).eval()
    _randomize(model, seed + 1)
    return model


def _mtp_tensors(variant: str, seed: int) -> dict[str, torch.Tensor]:
    """Layer N_LAYERS of a deeper twin, plus the nextn projections, as a DeepSeek / GLM
    checkpoint stores its MTP layer."""
    twin = build_hf_model(variant, seed + 100, N_LAYERS + 1)
    p = f"model.layers.{N_LAYERS}."
    with tempfile.TemporaryDirectory() as tmp:  # the on-disk layout (experts one by one)
        twin.save_pretrained(tmp, safe_serialization=True)
        out = {k: v.clone() for k, v in load_file(str(Path(tmp) / "model.safetensors")).items()
               if k.startswith(p)}  # fmt: skip
    gen = torch.Generator().manual_seed(seed + 200)
    h = _COMMON["hidden_size"]
    out[p + "eh_proj.weight"] = 0.15 * torch.randn(h, 2 * h, generator=gen)
    for n in ("enorm", "hnorm", "shared_head.norm"):
        out[p + n + ".weight"] = 1.0 + 0.1 * torch.randn(h, generator=gen)
    return out


# --------------------------------------------------------------------------- llama.cpp


def llama_cpp_dir() -> Path | None:
    """llama.cpp's sources from the llama-cpp-python sdist: $COLIBRI_LLAMA_CPP, or the sdist
    scripts/fetch_test_data.py downloads into build/test-data/sdist/ (unpacked there on first
    use, as scripts/make_gguf_fixtures.py does), or an older build/vendor/ copy."""
    env = os.environ.get("COLIBRI_LLAMA_CPP")
    cands = [Path(env)] if env else []
    sdist = f"llama_cpp_python-{LLAMA_CPP_VERSION}"
    sdist_dir = REPO / "build" / "test-data" / "sdist"
    fetched = sdist_dir / sdist / "vendor" / "llama.cpp"
    archive = sdist_dir / f"{sdist}.tar.gz"
    if not (fetched / "convert_hf_to_gguf.py").is_file() and archive.is_file():
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers()
                       if "/vendor/llama.cpp/" in m.name and ".." not in m.name
                       and (m.isfile() or m.isdir())]  # fmt: skip
            tmp = Path(tempfile.mkdtemp(prefix=".llama-cpp-", dir=sdist_dir))
            try:
                tar.extractall(tmp, members=members, filter="data")
                if not fetched.parent.parent.exists():
                    os.replace(tmp / sdist, sdist_dir / sdist)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    cands += [fetched, REPO / "build" / "vendor" / sdist / "vendor" / "llama.cpp"]
    for c in cands:
        if (c / "convert_hf_to_gguf.py").is_file():
            return c
    return None


def require_llama_cpp() -> Path:
    """llama_cpp_dir(), or MissingTestData saying how to get it (the run stops, nothing
    skips; COLIBRI_LLAMA_CPP may also name an unpacked llama.cpp tree)."""
    root = llama_cpp_dir()
    if root is None:
        missing("llama.cpp's convert_hf_to_gguf.py (the llama-cpp-python sdist)",
                REPO / "build" / "test-data" / "sdist")
    return root


# Runs the converter with a placeholder vocabulary: every text-model class's set_vocab
# writes the same tiny SentencePiece-style list the other test models use.
_BOOTSTRAP = r"""
import sys
root, argv = sys.argv[1], sys.argv[2:]
sys.path.insert(0, root)
sys.path.insert(1, root + "/gguf-py")
import gguf
import conversion.deepseek  # architecture modules register their classes on import
import conversion.glm
import conversion.gpt_oss
import conversion.kimi_linear
import conversion.mimo
from conversion import base

def placeholder_vocab(self):
    n = self.hparams["vocab_size"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<tok{i}>" for i in range(3, n)]
    w = self.gguf_writer
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n)
    w.add_token_types([2, 3, 3] + [1] * (n - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

for mod in list(sys.modules.values()):
    if getattr(mod, "__name__", "").startswith("conversion"):
        for obj in list(vars(mod).values()):
            if isinstance(obj, type) and issubclass(obj, base.TextModel):
                obj.set_vocab = placeholder_vocab
sys.argv = ["convert_hf_to_gguf.py", *argv]
import runpy
runpy.run_path(root + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def convert_with_llama_cpp(
    hf_dir: Path, out: Path, outtype: str, extra: tuple[str, ...] = ()
) -> None:
    """llama.cpp's convert_hf_to_gguf.py on a checkpoint (raises when unavailable/failing)."""
    root = require_llama_cpp()
    # Architecture classes register when their module is imported; the bootstrap imports
    # the DeepSeek and GLM ones, patches set_vocab, then runs the converter's main.
    cmd = [sys.executable, "-c", _BOOTSTRAP, str(root), str(hf_dir), "--outfile", str(out),
           "--outtype", outtype.lower(), *extra]  # fmt: skip
    env = dict(os.environ)
    env.pop("NO_LOCAL_GGUF", None)  # the converter's own gguf-py, not the installed package
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0 or not out.is_file():
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({r.returncode}):\n{r.stderr[-3000:]}")


# --------------------------------------------------------------------------- cache


@dataclass(frozen=True)
class TinyDeepseek:
    variant: str
    family: str
    hf_dir: Path
    gguf: dict[str, Path]  # "F32" / "Q8_0" -> file (written when with_gguf)
    has_mtp: bool

    def __hash__(self) -> int:
        return hash((self.variant, self.hf_dir))


def cache_root() -> Path:
    base = Path(os.environ.get("COLIBRI_TEST_MODELS", REPO / "build" / "test-models"))
    key = f"deepseek-v{FACTORY_VERSION}-tf{transformers.__version__}-torch{torch.__version__}"
    return base / key.replace("+", "_")


def _write_checkpoint(variant: str, d: Path, seed: int = 0) -> None:
    model = build_hf_model(variant, seed)
    model.save_pretrained(d, safe_serialization=True)
    cfg_path = d / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(VARIANTS[variant][2])
    if VARIANTS[variant][3]:
        cfg["num_nextn_predict_layers"] = 1
        sd = load_file(str(d / "model.safetensors"))
        sd.update(_mtp_tensors(variant, seed))
        save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
    cfg_path.write_text(json.dumps(cfg, indent=2))


def build_tiny(variant: str, root: Path | None = None, with_gguf: bool = True) -> TinyDeepseek:
    root = root or cache_root()
    d = root / variant
    fam = FAMILY[variant]
    ggufs = {t: d / f"{variant}-{t}.gguf" for t in GGUF_TYPES}
    tiny = TinyDeepseek(variant, fam, d / "hf", ggufs, VARIANTS[variant][3])
    if not (d / "DONE").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{variant}-", dir=root))
        try:
            _write_checkpoint(variant, tmp / "hf")
            (tmp / "DONE").write_text("ok\n")
            try:
                os.replace(tmp, d)
            except OSError:
                if not (d / "DONE").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if with_gguf:
        for t, p in ggufs.items():
            if not p.is_file():
                part = p.with_suffix(f".{os.getpid()}.part")
                convert_with_llama_cpp(tiny.hf_dir, part, t)
                os.replace(part, p)
    return tiny


def config_variant(tiny: TinyDeepseek, dst: Path, **changes: object) -> Path:
    """The checkpoint with config.json changed (a value of None removes the key); weights
    copied: a symlink out of a model's directory is refused."""
    dst.mkdir()
    for f in tiny.hf_dir.iterdir():
        if f.name != "config.json":
            shutil.copy(f, dst / f.name)
    cfg = json.loads((tiny.hf_dir / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@functools.cache
def transformers_model(hf_dir: str) -> torch.nn.Module:
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    return model.eval()


def prompt_ids(n: int = 32, seed: int = 1234) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, VOCAB, size=n)]


# --------------------------------------------------------------------------- dequantized

# HF checkpoint name (layer part) -> the GGUF tensor llama.cpp writes it as: a transcription
# of llama.cpp's tensor map for these architectures (gguf-py's tensor_mapping.py), kept
# apart from colibri's own source code so a wrong name in one does not hide in the other.
_HF_TO_GGUF = [
    (r"input_layernorm\.weight", "attn_norm"),
    (r"post_attention_layernorm\.weight", "ffn_norm"),
    (r"self_attn\.q_proj\.(weight|bias)", "attn_q"),
    (r"self_attn\.k_proj\.(weight|bias)", "attn_k"),
    (r"self_attn\.v_proj\.(weight|bias)", "attn_v"),
    (r"self_attn\.q_norm\.weight", "attn_q_norm"),
    (r"self_attn\.k_norm\.weight", "attn_k_norm"),
    (r"self_attn\.q_a_proj\.weight", "attn_q_a"),
    (r"self_attn\.q_a_layernorm\.weight", "attn_q_a_norm"),
    (r"self_attn\.q_b_proj\.weight", "attn_q_b"),
    (r"self_attn\.kv_a_proj_with_mqa\.weight", "attn_kv_a_mqa"),
    (r"self_attn\.kv_a_layernorm\.weight", "attn_kv_a_norm"),
    (r"self_attn\.o_proj\.weight", "attn_output"),
    (r"self_attn\.indexer\.wq_b\.weight", "indexer.attn_q_b"),
    (r"self_attn\.indexer\.wk\.weight", "indexer.attn_k"),
    (r"self_attn\.indexer\.k_norm\.(weight|bias)", "indexer.k_norm"),
    (r"self_attn\.indexer\.weights_proj\.weight", "indexer.proj"),
    (r"mlp\.(gate|up|down)_proj\.weight", "ffn_{0}"),
    (r"mlp\.gate\.weight", "ffn_gate_inp"),
    (r"mlp\.gate\.e_score_correction_bias", "exp_probs_b"),
    (r"mlp\.shared_experts\.(gate|up|down)_proj\.weight", "ffn_{0}_shexp"),
]


def _gguf_tensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF, dequantized to float32, in PyTorch axis order."""
    import gguf

    reader = gguf.GGUFReader(path)
    return {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type)
        .reshape(tuple(reversed(t.shape.tolist()))).astype(np.float32)
        for t in reader.tensors
    }


def dequantized_hf_dir(tiny: TinyDeepseek, qtype: str) -> Path:
    """The checkpoint with every trunk weight replaced by the ``qtype`` GGUF's, dequantized:
    transformers on it computes what the quantized file computes with exact activations.
    (MTP layers, which the trunk does not run, are left out.)"""
    import re

    out = tiny.hf_dir.parent / f"hf-dequant-{qtype}"
    if (out / "DONE").is_file():
        return out
    g = _gguf_tensors(tiny.gguf[qtype])
    new: dict[str, torch.Tensor] = {}
    top = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    for name, arr in load_file(str(tiny.hf_dir / "model.safetensors")).items():
        if name in top:
            val = g[top[name]]
        else:
            m = re.match(r"model\.layers\.(\d+)\.(.*)", name)
            assert m, name
            b, rest = int(m.group(1)), m.group(2)
            if b >= N_LAYERS:
                continue
            if rest == "self_attn.kv_b_proj.weight":
                kb, vb = g[f"blk.{b}.attn_k_b.weight"], g[f"blk.{b}.attn_v_b.weight"]
                val = np.concatenate([kb.transpose(0, 2, 1), vb], axis=1).reshape(-1, kb.shape[1])
            elif em := re.match(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", rest):
                val = g[f"blk.{b}.ffn_{em.group(2)}_exps.weight"][int(em.group(1))]
            else:
                for pat, fmt in _HF_TO_GGUF:
                    if pm := re.fullmatch(pat, rest):
                        suffix = ".bias" if rest.endswith("bias") else ".weight"
                        stem = fmt.format(*pm.groups())
                        key = f"blk.{b}.{stem}{suffix}"
                        if tiny.family == "glm4_moe" and stem == "ffn_norm":
                            key = f"blk.{b}.post_attention_norm.weight"
                        break
                else:
                    raise KeyError(f"no GGUF tensor for {name}")
                val = g[key]
        new[name] = torch.from_numpy(np.ascontiguousarray(val.reshape(arr.shape)))
    tmp = Path(tempfile.mkdtemp(prefix=f".deq-{qtype}-", dir=tiny.hf_dir.parent))
    try:
        save_file(new, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(tiny.hf_dir / "config.json", tmp / "config.json")
        (tmp / "DONE").write_text("ok\n")
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "DONE").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
