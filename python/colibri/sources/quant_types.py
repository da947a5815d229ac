"""Tensor element types, from the core's own table (``csrc/quant/dtype.cpp``).

The core lists every type it knows with its GGML type id, block size, bytes per block and
role (``_core.quant.type_names`` / ``type_info``). Python reads that table once, here,
instead of keeping copies: a weight type added to the core is known to every source,
to the container schema and to ``colibri convert`` without a Python edit.

* :data:`WEIGHT_TYPES`: the types a model file may store tensors in (GGUF, native
  containers), in the core's order, which is the order messages list them in. Not the
  core's activation formats (Q8_1, Q8_K) nor FP8 e4m3, which is read only with its block
  scales (``Fp8TensorInfo``).
* :data:`BLOCK_SIZES`: ``(elements per block, bytes per block)`` of each weight type.
* :func:`ggml_type`: a GGUF tensor's GGML type id -> ``(name, block, bytes)``. Ids the
  core has no weight type for (TQ1_0, I8, ...) come from the ``gguf`` package, so a
  header naming one is still sized and the refusal names the type.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import cache

from .._core import quant as _quant
from ..errors import ModelFormatError, UnsupportedError
from .paths import clip, shown

_INFO = {name: _quant.type_info(name) for name in _quant.type_names()}

WEIGHT_TYPES: tuple[str, ...] = tuple(_quant.type_names("weight"))
BLOCK_SIZES: Mapping[str, tuple[int, int]] = {
    n: (int(_INFO[n]["block_size"]), int(_INFO[n]["type_size"])) for n in WEIGHT_TYPES
}
# GGML type id -> weight type name (the core's ids are GGML's).
_BY_GGML_ID = {int(_INFO[n]["id"]): n for n in WEIGHT_TYPES}


def bytes_per_element(name: str) -> int:
    """Bytes per element of an unblocked type (F32, F16, BF16, F8_E4M3)."""
    info = _INFO[name]
    if info["block_size"] != 1:
        raise ValueError(f"{name} is a block type")
    return int(info["type_size"])


def ggml_type(type_id: int) -> tuple[str, int, int] | None:
    """(name, elements per block, bytes per block) of a GGML type id; None if unknown."""
    name = _BY_GGML_ID.get(type_id)
    if name is not None:
        return (name, *BLOCK_SIZES[name])
    return _gguf_package_type(type_id)


@cache
def _gguf_package_type(type_id: int) -> tuple[str, int, int] | None:
    try:
        import gguf

        qt = gguf.GGMLQuantizationType(type_id)
        block, size = gguf.GGML_QUANT_SIZES[qt]
    except (ImportError, ValueError, KeyError):
        return None
    return (qt.name, int(block), int(size))


class _GGMLTypes(Mapping[int, tuple[str, int, int]]):
    """Every GGML type id known to the core or to the ``gguf`` package, read on first use
    (importing ``gguf`` takes a while, and reading a header needs only :func:`ggml_type`)."""

    @property
    def _table(self) -> dict[int, tuple[str, int, int]]:
        return _all_ggml_types()

    def __getitem__(self, type_id: int) -> tuple[str, int, int]:
        return self._table[type_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)


@cache
def _all_ggml_types() -> dict[int, tuple[str, int, int]]:
    ids = set(_BY_GGML_ID)
    try:
        import gguf

        ids |= {int(t) for t in gguf.GGML_QUANT_SIZES}
    except ImportError:
        pass
    out = {i: ggml_type(i) for i in sorted(ids)}
    return {i: info for i, info in out.items() if info is not None}


GGML_TYPES: Mapping[int, tuple[str, int, int]] = _GGMLTypes()


def tensor_nbytes(dtype: str, shape: Sequence[int], name: str = "") -> int:
    """Bytes a tensor of this type and shape occupies (rows of blocks for quantized types)."""
    if dtype not in BLOCK_SIZES:
        raise UnsupportedError(f"tensor {shown(name)}: element type {dtype} is not supported")
    block, size = BLOCK_SIZES[dtype]
    n = 1
    for d in shape:
        n *= int(d)
    cols = int(shape[-1]) if shape else 1
    if cols % block:
        raise ModelFormatError(
            f"tensor {shown(name)}: row length {cols} is not a multiple of the {dtype} "
            f"block size {block}"
        )
    return n // block * size


def check_dtype(name: str, dtype: str, where: object) -> None:
    if dtype not in WEIGHT_TYPES:
        raise UnsupportedError(
            f"{where}: tensor {shown(name)} has element type {clip(dtype)}, which colibri "
            f"cannot read yet "
            f"(supported: {', '.join(WEIGHT_TYPES)}). Use a GGUF quantized to one of those, "
            f"or the original Hugging Face checkpoint."
        )
