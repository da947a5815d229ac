"""``colibri info``: what a model is, from its header only (no weights are loaded)."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from typing import Any, TextIO

from ..settings.config import EngineConfig
from ..sources import Manifest

INFO_SCHEMA = "colibri.info/1"

_EXPERT = re.compile(r"^blk\.(\d+)\.ffn_(?:gate|up|down)_exps\.(\d+)$")


def _plain(value: Any) -> Any:
    """JSON-ready copies of config values (tuples -> lists, NumPy scalars -> numbers)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def model_info(manifest: Manifest) -> dict[str, Any]:
    """The record ``colibri info --json`` prints (schema in docs/cli.md)."""
    cfg = manifest.config
    md = manifest.metadata
    params = nbytes = 0
    by_type: dict[str, dict[str, int]] = {}
    routed_params = routed_bytes = 0
    # (layer, expert) -> [parameters, bytes] of one routed expert's three matrices
    experts: dict[tuple[int, int], list[int]] = {}
    for t in manifest.tensors.values():
        n = math.prod(t.shape)
        params += n
        nbytes += t.nbytes
        entry = by_type.setdefault(t.dtype, {"tensors": 0, "parameters": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["parameters"] += n
        entry["bytes"] += t.nbytes
        m = _EXPERT.match(t.name)
        if m:
            routed_params += n
            routed_bytes += t.nbytes
            e = experts.setdefault((int(m.group(1)), int(m.group(2))), [0, 0])
            e[0] += n
            e[1] += t.nbytes

    if manifest.source == "gguf":
        source_arch = str(md.get("general.architecture", ""))
        name = md.get("general.name")
    else:
        archs = md.get("architectures") or [""]
        source_arch = str(archs[0])
        name = md.get("_name_or_path") or None

    moe: dict[str, Any] | None = None
    if cfg.n_experts > 0:
        layers = sorted({layer for layer, _ in experts})
        first = [experts[k] for k in sorted(experts) if k[0] == layers[0]] if layers else []
        per_layer_active = {
            layer: cfg.n_experts_per_tok * max(p for (ly, _), (p, _b) in experts.items()
                                                if ly == layer)
            for layer in layers
        }
        moe = {
            "moe_layers": sum(cfg.moe_layers),
            "dense_layers": cfg.n_layers - sum(cfg.moe_layers),
            "experts_per_layer": cfg.n_experts,
            "experts_per_token": cfg.n_experts_per_tok,
            "norm_topk_prob": cfg.norm_topk_prob,
            "expert_ffn": cfg.moe_intermediate_size,
            "shared_expert_ffn": cfg.shared_expert_intermediate_size,
            "parameters_per_expert": first[0][0] if first else 0,
            "bytes_per_expert": first[0][1] if first else 0,
            "routed_parameters": routed_params,
            "routed_bytes": routed_bytes,
            "resident_bytes": nbytes - routed_bytes,
            "active_parameters": params - routed_params + sum(per_layer_active.values()),
        }

    # A native container keeps the kind of model it was converted from in `source`.
    container = manifest.path.is_dir() and (manifest.path / "manifest.json").is_file()
    return {
        "schema": INFO_SCHEMA,
        "path": str(manifest.path),
        "format": "container" if container else manifest.source,
        "source": manifest.source,
        "files": [str(f) for f in manifest.files],
        "file_bytes": sum(os.stat(f).st_size for f in manifest.files),
        "name": str(name) if name is not None else None,
        "architecture": cfg.arch,
        "source_architecture": source_arch,
        "parameters": params,
        "tensors": len(manifest.tensors),
        "tensor_bytes": nbytes,
        "quantization": dict(sorted(by_type.items(), key=lambda kv: -kv[1]["bytes"])),
        "context_length": cfg.max_position_embeddings,
        "default_context_length": EngineConfig().resolve_context_length(
            cfg.max_position_embeddings
        ),
        "moe": moe,
        "config": _plain(dataclasses.asdict(cfg)),
    }


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit} ({n:,})"
    return str(n)


_SOURCE_NAMES = {"gguf": "GGUF", "hf": "Hugging Face checkpoint"}


def _format_name(info: Mapping[str, Any]) -> str:
    source = _SOURCE_NAMES.get(info["source"], str(info["source"]))
    if info.get("format") == "container":
        return f"colibri container, converted from a {source}"
    return source


def print_info(info: Mapping[str, Any], out: TextIO) -> None:
    c = info["config"]
    kind = "MoE" if info["moe"] else "dense"
    files = len(info["files"])
    rows = [
        ("model", info["path"]),
        ("format", f"{_format_name(info)} ({info['source_architecture'] or '?'}), "
                   f"{_size(info['file_bytes'])} in {files} file{'s' * (files != 1)}"),
        ("name", info["name"] or "-"),
        ("architecture", f"{info['architecture']} ({kind})"),
        ("parameters", _count(info["parameters"])),
        ("weights", f"{_size(info['tensor_bytes'])} in {info['tensors']} tensors"),
        ("context", f"{info['context_length']} tokens (colibri's KV cache: "
                    f"{info['default_context_length']} by default, --context-length to change)"),
        ("shape", f"{c['n_layers']} layers, hidden {c['hidden_size']}, {c['n_heads']} heads / "
                  f"{c['n_kv_heads']} KV heads x {c['head_dim']}, vocab {c['vocab_size']}"
                  + (f", FFN {c['intermediate_size']}" if c["intermediate_size"] else "")),
        ("rope", f"theta {c['rope_theta']:g}"
                 + (f", scaling {c['rope_scaling']}" if c["rope_scaling"] else "")),
    ]
    width = max(len(k) for k, _ in rows) + 2
    for k, v in rows:
        out.write(f"{k:<{width}}{v}\n")
    out.write("quantization\n")
    out.write(f"  {'type':<6}{'tensors':>9}{'parameters':>16}{'bytes':>16}\n")
    for dtype, e in info["quantization"].items():
        out.write(f"  {dtype:<6}{e['tensors']:>9}{e['parameters']:>16,}{e['bytes']:>16,}\n")
    moe = info["moe"]
    if moe:
        share = moe["routed_bytes"] / info["tensor_bytes"] if info["tensor_bytes"] else 0.0
        mrows = [
            ("experts per layer", f"{moe['experts_per_layer']} (in {moe['moe_layers']} of "
                                  f"{c['n_layers']} layers)"),
            ("used per token", f"{moe['experts_per_token']}"
                               + (" (weights renormalized)" if moe["norm_topk_prob"] else "")),
            ("expert FFN width", str(moe["expert_ffn"])
                                 + (f", shared expert {moe['shared_expert_ffn']}"
                                    if moe["shared_expert_ffn"] else "")),
            ("bytes per expert", f"{_size(moe['bytes_per_expert'])} "
                                 f"({moe['bytes_per_expert']:,}; gate + up + down)"),
            ("routed experts", f"{_size(moe['routed_bytes'])} ({share:.0%} of the weights)"),
            ("resident part", _size(moe["resident_bytes"])),
            ("active params", _count(moe["active_parameters"]) + " per token"),
        ]
        out.write("mixture of experts\n")
        w = max(len(k) for k, _ in mrows) + 2
        for k, v in mrows:
            out.write(f"  {k:<{w}}{v}\n")
