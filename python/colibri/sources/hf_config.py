"""A Hugging Face ``config.json`` (plus the tensor names of its checkpoint) -> ModelConfig.

The family is found by ``model_type`` or ``architectures`` (families/); what every family
reads the same way is read here (vocabulary, widths, heads, RMSNorm epsilon, RoPE, context
length, tied embeddings, token ids), the layer count is checked against the tensors
present (multi-token-prediction layers included) before anything loops over it, and the
family module normalizes the rest.

RoPE settings live in ``rope_parameters`` ({"rope_theta", "rope_type", ...}) in
transformers 5; older files have top-level ``rope_theta`` and ``rope_scaling``. Both are
read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError, UnsupportedError
from .families import HFInput, hf_family
from .fields import ConfigFields, as_float, bad
from .manifest import ModelConfig
from .paths import ModelDir
from .validate import check_layer_count

# DeepSeek-V4's released checkpoints name their layers without the leading "model.".
_HF_LAYER = re.compile(r"^(?:model\.)?layers\.(\d{1,9})\.")


def _rope(cfg: Mapping[str, Any], where: Path) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from transformers 5's ``rope_parameters`` or the older top-level
    ``rope_theta`` + ``rope_scaling``; scaling is None for plain RoPE, else a dict with
    ``rope_type`` (never the old ``type`` key) and the variant's parameters (typed and
    range-checked with the config, :func:`~.validate.check_rope_scaling`)."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise bad(where, "rope_parameters", params, "an object")
    if isinstance(params.get("main"), dict):  # DeepSeek-V4: its sliding layers' ("main") RoPE
        params = params["main"]
    if any(isinstance(v, dict) for v in params.values()):
        raise UnsupportedError(f"{where}: per-layer-type RoPE parameters are not supported")
    theta = as_float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)), "rope_theta",
                     where, lo=0.0, lo_open=True)  # fmt: skip
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        return theta, None
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "type")}
    scaling["rope_type"] = kind
    if kind in ("llama3", "yarn", "longrope"):
        scaling.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    return theta, scaling


def _eos_ids(cfg: Mapping[str, Any], root: ModelDir) -> tuple[int, ...]:
    ids: list[int] = []
    sources: list[Any] = [cfg.get("eos_token_id")]
    gen = root.optional("generation_config.json", "generation config")
    if gen is not None:
        try:
            doc = json.loads(gen.read_bytes())
            sources.append(doc.get("eos_token_id") if isinstance(doc, dict) else None)
        except (OSError, ValueError, RecursionError):
            pass
    for v in sources:
        for x in v if isinstance(v, list) else [v]:
            if isinstance(x, int) and not isinstance(x, bool) and x >= 0 and x not in ids:
                ids.append(x)
    return tuple(ids)


def hf_config(
    cfg: Mapping[str, Any], d: Path, tensor_names: set[str], root: ModelDir | None = None
) -> ModelConfig:
    """Normalize a config.json (plus what the weights show) into a ModelConfig."""
    fam, arch = hf_family(cfg, d)
    if fam.hf_text_config and fam.hf_text_config in cfg:
        text = cfg[fam.hf_text_config]
        if not isinstance(text, dict):
            raise ModelFormatError(f"{d / 'config.json'}: {fam.hf_text_config} is not an object")
        cfg = {**cfg, **text}
    where = d / "config.json"
    f = ConfigFields(cfg, where)
    hidden = f.int("hidden_size")
    n_layers = f.int("num_hidden_layers")
    n_heads = f.int("num_attention_heads")
    vocab = f.int("vocab_size")
    # Before anything loops over the layers: the count must be the layers present (the
    # family's multi-token-prediction layers after them included).
    n_mtp = fam.hf_mtp_layers(cfg, n_layers, tensor_names, d) if fam.hf_mtp_layers else 0
    check_layer_count(n_layers + n_mtp, tensor_names, "num_hidden_layers", where, _HF_LAYER)
    n_kv = f.int("num_key_value_heads", n_heads)
    head_dim = f.int("head_dim", hidden // n_heads)
    # A family reading per-layer-type RoPE sets rope_theta / rope_scaling itself.
    rope_cfg = {k: v for k, v in cfg.items() if k != "rope_parameters"} \
        if fam.hf_rope_by_layer_type else cfg  # fmt: skip
    theta, scaling = _rope(rope_cfg, where)
    bos = cfg.get("bos_token_id")
    eps = cfg.get("rms_norm_eps")
    base: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=hidden, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=n_kv, head_dim=head_dim,
        rms_norm_eps=1e-6 if eps is None else as_float(eps, "rms_norm_eps", where, lo=0.0),
        rope_theta=theta, max_position_embeddings=f.int("max_position_embeddings", 0, lo=0),
        tie_word_embeddings=f.bool("tie_word_embeddings")
        or "lm_head.weight" not in tensor_names,
        rope_scaling=scaling,
        bos_token_id=bos if isinstance(bos, int) and not isinstance(bos, bool) and bos >= 0
        else None,
        eos_token_ids=_eos_ids(cfg, root or ModelDir(d)),
    )  # fmt: skip
    return fam.hf_config(HFInput(arch, cfg, d, frozenset(tensor_names), f, base))
