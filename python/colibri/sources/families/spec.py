"""What a family module declares (:class:`Family`) and what the format readers hand its
functions (:class:`HFInput`, :class:`GGUFInput`).

The readers (hf_config.py, gguf_source.py) parse the format and read what every family
reads the same way (vocabulary, widths, heads, RoPE, norms' epsilon, token ids: ``base``);
the family turns the rest of the metadata into a ModelConfig and names its tensors.
docs/format.md, "Adding a family", says how the parts fit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fields import ConfigFields, GGUFFields
from ..manifest import AttentionKind, Extent, ModelConfig, RouterKind, TensorInfo

# A Hugging Face tensor name (fullmatch) -> the canonical name, a format string of the
# pattern's groups ("blk.{0}.attn_{1}").
NameRule = tuple[re.Pattern[str], str]


@dataclass(frozen=True)
class HFInput:
    """A config.json as the HF reader hands it to :attr:`Family.hf_config`."""

    arch: str  # the family member model_type / architectures named (ModelConfig.arch)
    cfg: Mapping[str, Any]  # config.json
    d: Path  # the checkpoint directory
    names: frozenset[str]  # every tensor name in the checkpoint
    fields: ConfigFields  # typed reads of cfg
    # What every family reads the same way, as ModelConfig fields: vocab_size,
    # hidden_size, n_layers, n_heads, n_kv_heads, head_dim, rms_norm_eps, rope_theta,
    # rope_scaling, max_position_embeddings, tie_word_embeddings, bos/eos token ids.
    base: Mapping[str, Any]


@dataclass(frozen=True)
class GGUFInput:
    """A GGUF header as the GGUF reader hands it to :attr:`Family.gguf_config`."""

    arch: str  # general.architecture (the metadata keys' prefix)
    meta: GGUFFields  # typed reads of the key/values
    tensors: Mapping[str, TensorInfo]  # canonical names, experts one per expert
    where: Path  # the file
    # As HFInput.base, without head_dim; n_layers is the whole block_count.
    base: Mapping[str, Any]


def plain_gguf_name(
    arch: str, name: str, shape: tuple[int, ...]
) -> tuple[str, tuple[int, ...]]:
    """llama.cpp's tensor names are canonical once ``.weight`` is dropped."""
    return (name[: -len(".weight")] if name.endswith(".weight") else name), shape


@dataclass(frozen=True)
class Family:
    """Everything colibri knows about one model family, as data and small functions."""

    name: str  # the module's name
    archs: tuple[str, ...]  # the ModelConfig.arch values it produces
    # What the core runs for it (csrc/model/): attention kinds and routing rules its
    # configs may name (check_config refuses any other).
    attention: tuple[AttentionKind, ...]
    routers: tuple[RouterKind, ...]
    # Hugging Face: config.json model_type / architectures[i] -> arch; tensor names; the
    # config normalization.
    hf_model_types: Mapping[str, str]
    hf_arch_classes: Mapping[str, str]
    hf_names: Sequence[NameRule]
    hf_config: Callable[[HFInput], ModelConfig]
    # GGUF: general.architecture values; the config normalization; tensor name (and
    # shape) -> canonical; the architectures whose Q/K rows llama.cpp's converter
    # permutes for its interleaved RoPE (those tensors get rope_unpermute_heads).
    gguf_architectures: tuple[str, ...]
    gguf_config: Callable[[GGUFInput], ModelConfig]
    gguf_name: Callable[[str, str, tuple[int, ...]], tuple[str, tuple[int, ...]]] = (
        plain_gguf_name
    )
    gguf_permuted: tuple[str, ...] = ()
    # attention.head_count_kv may list per-layer counts that differ (MiMo-V2-Flash's full
    # and sliding layers): GGUFInput.base takes layer 0's, gguf_config reads the list.
    gguf_kv_heads_by_layer: bool = False
    # GGUF tensors the core reads cut or named by the config (Qwen3-Next's fused
    # projections): (tensors by canonical name, config, file) -> the tensors to check.
    gguf_tensors: Callable[
        [dict[str, TensorInfo], ModelConfig, Path], dict[str, TensorInfo]
    ] | None = None
    # Multi-token-prediction layers, counted before the layer-count check: HF, the layers
    # past num_hidden_layers the checkpoint carries (cfg, n_layers, names, dir) -> count;
    # GGUF, the "{arch}.<key>" that says how many of block_count's layers are MTP layers
    # (a file may declare them without carrying them).
    hf_mtp_layers: Callable[[Mapping[str, Any], int, Iterable[str], Path], int] | None = None
    gguf_mtp_key: str | None = None
    # MLA's kv_b_proj in HF checkpoints (one per layer, group 1 the layer): split into
    # attn_k_b / attn_v_b (units.split_kv_b).
    hf_kv_b: re.Pattern[str] | None = None
    # Routed experts a Hugging Face checkpoint stores in a layout the engine cannot read
    # through extents (gpt-oss's fused, transposed, interleaved ones): (stored tensors,
    # files, config, dir) -> (canonical expert tensors, the stored names they replace, a
    # side file they point into, index len(files); None when they need none).
    hf_experts: Callable[
        [Mapping[str, tuple[str, tuple[int, ...], Extent]], Sequence[Path], ModelConfig, Path],
        tuple[dict[str, TensorInfo], frozenset[str], Path | None],
    ] | None = None
    # Multimodal checkpoints whose text model colibri runs (Qwen3.5-MoE): the config.json
    # key whose object holds the text model's settings (read over the top level), and the
    # stored tensor name -> the name a text-only checkpoint gives it, or None for a tensor
    # of another modality (skipped).
    hf_text_config: str | None = None
    hf_rename: Callable[[str], str | None] | None = None
    # config.json's rope_parameters are keyed by layer type (MiMo-V2-Flash): the shared
    # reader leaves them to the family's hf_config instead of refusing them.
    hf_rope_by_layer_type: bool = False
    # Tensors a GGUF stores in a type the core does not read (DeepSeek-V4's I32 hash
    # tables): the stored names that match are set aside before the type check and handed,
    # with the config, to gguf_side (file, {stored name: (type, shape, extent)}, config) ->
    # (canonical tensors, a side file they point into, index 1; None when they need none).
    gguf_side_names: re.Pattern[str] | None = None
    gguf_side: Callable[
        [Path, Mapping[str, tuple[str, tuple[int, ...], Extent]], ModelConfig],
        tuple[dict[str, TensorInfo], Path | None],
    ] | None = None
