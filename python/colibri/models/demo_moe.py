"""A demonstration Mixture-of-Experts model made from a dense Llama GGUF.

:func:`make_demo_moe` rewrites a dense ``llama`` GGUF (SmolLM2-135M-Instruct is the one
colibri uses) as a llama.cpp-style Mixtral GGUF:

* metadata: every key/value of the source, byte for byte (tokenizer, chat template, ...),
  plus ``llama.expert_count`` and ``llama.expert_used_count``;
* in every layer the dense FFN (``blk.N.ffn_gate``, ``ffn_up``, ``ffn_down``) becomes
  ``n_experts`` routed experts, stacked as ``blk.N.ffn_{gate,up,down}_exps`` (GGML ne =
  ``[cols, rows, n_experts]``), each expert a byte copy of the dense matrices in their
  original quantized type (no requantization);
* a random F32 router ``blk.N.ffn_gate_inp`` (``[n_experts, hidden]``, normal with std
  ``1/sqrt(hidden)``, seeded);
* every other tensor copied unchanged, in the source's order.

Mixtral-style routing takes the softmax of the router logits, keeps the top-k and
renormalizes their weights to sum to 1, so the layer computes ``sum_i w_i * FFN(x)``,
which is ``FFN(x)`` up to float rounding, while the router picks different experts token
by token. Two router layouts:

``router="paired"`` (the default; needs ``top_k == 2`` and an even ``n_experts``)
    Experts ``2j`` and ``2j+1`` share one random router row. Their logits are then equal,
    the top-2 is always one such pair, each gets weight exactly 0.5, and
    ``0.5*y + 0.5*y == y`` exactly: the model computes the dense model's logits bit for
    bit under every setting (activation precision included), while the pair chosen
    changes from token to token. This is the named ``smollm2-moe-demo`` model.
``router="random"``
    An independent random row per expert: any top-k pair can be chosen, and the output
    equals the dense one only up to float rounding. With int8 activations (the default
    ``EngineConfig.activation_precision``) a last-bit difference can flip an activation's
    rounding and grow into a visible logit change, so greedy text may diverge; with
    float32 activations it matches in practice.

Two expert layouts (the ``experts`` argument):

``experts="copies"`` (the default, the named model)
    Every expert is a byte copy of the dense FFN (above).
``experts="halves"`` (needs ``router="paired"``)
    The two experts of a pair hold complementary halves of the dense FFN's neurons (in
    groups of 32), with ``ffn_down`` doubled exactly, and each pair of each layer its own
    random split (:mod:`colibri.models.demo_halves`). The pair's mixture, ``0.5 * 2 FFN_A +
    0.5 * 2 FFN_B``, is the dense FFN up to the order of one float addition, and the
    experts of a layer are all different: an expert mixed up with another pair's shows in
    the logits. ``llama.feed_forward_length`` is the half width.

It is a test and demonstration model, not a trained MoE: its experts are copies or halves of
one FFN and its router is noise. ``docs/demo-moe.md`` says more.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import ConfigError, ModelFormatError, ModelNotFoundError, UnsupportedError
from . import demo_halves

__all__ = ["DEMO_N_EXPERTS", "DEMO_TOP_K", "make_demo_moe"]

DEMO_N_EXPERTS = 8
"""Routed experts per layer of the named demo model (``smollm2-moe-demo``)."""

DEMO_TOP_K = 2
"""Experts used per token by the named demo model."""

_FFN = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)\.weight$")
_KIND_ORDER = ("gate", "up", "down")

# Called after each layer is written: (layers done, layers in total).
Progress = Callable[[int, int], None]

RouterLayout = Literal["paired", "random"]
ExpertLayout = Literal["copies", "halves"]


def _check_args(n_experts: int, top_k: int, seed: int, router: str, experts: str) -> None:
    for name, v in (("n_experts", n_experts), ("top_k", top_k), ("seed", seed)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"make_demo_moe: {name} must be an integer, got {v!r}")
    if not 1 <= n_experts <= 256:
        raise ConfigError(f"make_demo_moe: n_experts {n_experts} is out of range; allowed 1..256")
    if not 1 <= top_k <= n_experts:
        raise ConfigError(
            f"make_demo_moe: top_k {top_k} is out of range; allowed 1..n_experts ({n_experts})"
        )
    if seed < 0:
        raise ConfigError(f"make_demo_moe: seed must be >= 0, got {seed}")
    if router not in ("paired", "random"):
        raise ConfigError(f"make_demo_moe: router {router!r} is not allowed; use 'paired' "
                          "or 'random'")
    if router == "paired" and (top_k != 2 or n_experts % 2):
        raise ConfigError(
            f"make_demo_moe: router='paired' needs top_k == 2 and an even n_experts (got "
            f"top_k {top_k}, n_experts {n_experts}); use router='random' otherwise"
        )
    if experts not in ("copies", "halves"):
        raise ConfigError(f"make_demo_moe: experts {experts!r} is not allowed; use 'copies' "
                          "or 'halves'")
    if experts == "halves" and router != "paired":
        raise ConfigError("make_demo_moe: experts='halves' needs router='paired' (each pair "
                          "holds two halves with weight 0.5 each)")


def _copy_metadata(reader: Any, writer: Any, src: Path, skip: tuple[str, ...] = ()) -> None:
    """Every key/value of `reader` into `writer` (but `skip`), raw strings as bytes (exact
    copy)."""
    import gguf

    vt = gguf.GGUFValueType
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in skip:
            continue  # the header fields; the writer adds the architecture itself
        if key == "general.alignment":
            writer.add_custom_alignment(int(field.contents()))
            continue
        types = list(field.types)
        main = types[0]
        if main == vt.STRING:
            writer.add_key_value(key, bytes(field.parts[field.data[0]]), vt.STRING)
        elif main == vt.ARRAY:
            if len(types) != 2:
                raise UnsupportedError(f"{src}: nested metadata array {key!r} cannot be copied")
            if not field.data:
                continue  # gguf's writer cannot write an empty array; readers default it
            if types[1] == vt.STRING:
                items: list[Any] = [bytes(field.parts[i]) for i in field.data]
            else:
                items = list(field.contents())
            writer.add_key_value(key, items, vt.ARRAY, sub_type=types[1])
        else:
            writer.add_key_value(key, field.contents(), main)


def make_demo_moe(
    src_gguf: str | os.PathLike[str],
    dst_gguf: str | os.PathLike[str],
    n_experts: int = DEMO_N_EXPERTS,
    top_k: int = DEMO_TOP_K,
    seed: int = 0,
    *,
    router: RouterLayout = "paired",
    experts: ExpertLayout = "copies",
    progress: Progress | None = None,
) -> Path:
    """Writes the demo MoE made from the dense Llama GGUF `src_gguf` to `dst_gguf`.

    Every expert of layer N is a byte copy of the source's dense FFN of layer N; the router
    ``blk.N.ffn_gate_inp`` is random (``numpy.random.default_rng(seed)``, normal with std
    ``1/sqrt(hidden)``, layer after layer), with one row per pair of experts repeated
    twice when `router` is ``"paired"`` (see the module docstring). With ``experts="halves"``
    the experts of a pair hold complementary halves of the FFN instead (the split drawn from
    ``numpy.random.default_rng([seed, 1])``, pair after pair, layer after layer; the
    routers are the same as with copies). `progress` is called
    after each layer. The file is written to a temporary name beside `dst_gguf` and renamed
    into place, so a reader never sees a partial file. Returns `dst_gguf`.

    Raises ModelNotFoundError when `src_gguf` is missing, ModelFormatError when it is not a
    dense ``llama`` GGUF with a gate/up/down FFN in every layer, ConfigError for bad
    `n_experts`/`top_k`/`seed`/`router`/`experts`.
    """
    import gguf

    _check_args(n_experts, top_k, seed, router, experts)
    src, dst = Path(src_gguf), Path(dst_gguf)
    if not src.is_file():
        raise ModelNotFoundError(f"demo MoE source {str(src)!r} does not exist")
    try:
        reader = gguf.GGUFReader(src)
    except Exception as exc:  # the reader raises ValueError, IndexError, struct errors...
        raise ModelFormatError(f"{src}: not a readable GGUF file ({exc})") from exc
    arch_field = reader.fields.get("general.architecture")
    arch = str(arch_field.contents()) if arch_field is not None else "<missing>"
    if arch != "llama":
        raise ModelFormatError(
            f"{src}: the demo MoE is made from a dense 'llama' GGUF, this one is {arch!r}"
        )
    if "llama.expert_count" in reader.fields and int(
        reader.fields["llama.expert_count"].contents() or 0
    ):
        raise ModelFormatError(f"{src}: already a mixture of experts (llama.expert_count > 0)")
    n_layers = int(reader.fields["llama.block_count"].contents())
    hidden = int(reader.fields["llama.embedding_length"].contents())

    tensors = {t.name: t for t in reader.tensors}
    for i in range(n_layers):
        for kind in _KIND_ORDER:
            if f"blk.{i}.ffn_{kind}.weight" not in tensors:
                raise ModelFormatError(f"{src}: layer {i} has no dense ffn_{kind} tensor")

    rng = np.random.default_rng(seed)
    rows = n_experts // 2 if router == "paired" else n_experts
    routers = []
    for _ in range(n_layers):
        r = (rng.standard_normal((rows, hidden)) / math.sqrt(hidden)).astype(np.float32)
        routers.append(np.repeat(r, 2, axis=0) if router == "paired" else r)

    # The output tensors, in the source's order; a layer's FFN group is replaced, where its
    # first dense FFN tensor was, by the router and the three stacks.
    def stored(t: Any) -> Callable[[], np.ndarray[Any, Any]]:
        return lambda: np.asarray(t.data)

    def router_of(layer: int) -> Callable[[], np.ndarray[Any, Any]]:
        return lambda: routers[layer]

    def stack(t: Any) -> Callable[[], np.ndarray[Any, Any]]:
        def get() -> np.ndarray[Any, Any]:
            data = np.asarray(t.data)
            return np.ascontiguousarray(np.broadcast_to(data, (n_experts, *data.shape)))

        return get

    ffn = int(tensors["blk.0.ffn_gate.weight"].shape[1])
    n_groups = ffn // demo_halves.GROUP
    splits: list[list[tuple[Any, Any]]] = []
    if experts == "halves":
        if ffn % (2 * demo_halves.GROUP):
            raise UnsupportedError(f"{src}: FFN width {ffn} does not split into two halves of "
                                   f"whole {demo_halves.GROUP}-neuron groups")
        split_rng = np.random.default_rng([seed, 1])
        splits = [demo_halves.halves(n_groups, n_experts // 2, split_rng)
                  for _ in range(n_layers)]

    def halves_of(t: Any, layer: int, kind: str) -> Callable[[], np.ndarray[Any, Any]]:
        def get() -> np.ndarray[Any, Any]:
            data, qtype = np.asarray(t.data), t.tensor_type.name
            parts = []
            for e in range(n_experts):
                groups = splits[layer][e // 2][e % 2]
                parts.append(demo_halves.doubled_down_columns(data, qtype, groups, n_groups)
                             if kind == "down" else demo_halves.neuron_rows(data, groups))
            return np.ascontiguousarray(np.stack(parts))

        return get

    plan: list[tuple[str, Callable[[], np.ndarray[Any, Any]], Any]] = []
    done: set[int] = set()
    for t in reader.tensors:
        m = _FFN.match(t.name)
        if m is None:
            plan.append((t.name, stored(t), t.tensor_type))
            continue
        layer = int(m.group(1))
        if layer in done:
            continue
        done.add(layer)
        plan.append((f"blk.{layer}.ffn_gate_inp.weight", router_of(layer),
                     gguf.GGMLQuantizationType.F32))
        for kind in _KIND_ORDER:
            dense = tensors[f"blk.{layer}.ffn_{kind}.weight"]
            get = halves_of(dense, layer, kind) if experts == "halves" else stack(dense)
            plan.append((f"blk.{layer}.ffn_{kind}_exps.weight", get, dense.tensor_type))

    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(None, "llama")
        if experts == "halves":  # llama.cpp reads the expert width from this key
            _copy_metadata(reader, writer, src, skip=("llama.feed_forward_length",))
            writer.add_feed_forward_length(ffn // 2)
        else:
            _copy_metadata(reader, writer, src)
        writer.add_expert_count(n_experts)
        writer.add_expert_used_count(top_k)
        for name, get, qtype in plan:
            data = get()
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, raw_dtype=qtype)
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        layers_written = 0
        for name, get, _ in plan:
            writer.write_tensor_data(get())
            if progress is not None and name.endswith("ffn_down_exps.weight"):
                layers_written += 1
                progress(layers_written, n_layers)
        writer.close()
        os.replace(tmp, dst)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return dst
