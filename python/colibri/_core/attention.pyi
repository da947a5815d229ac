"""
Attention kernels (tests and benchmarks).
"""
from __future__ import annotations
import numpy
import numpy.typing
import typing
__all__: list[str] = ['block_keys', 'chunk_keys', 'run', 'workspace_floats']
def block_keys() -> int:
    ...
def chunk_keys() -> int:
    ...
def run(q: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], k: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], v: typing.Annotated[numpy.typing.ArrayLike, numpy.float32] | None = None, dv: typing.SupportsInt | typing.SupportsIndex = 0, pos0: typing.SupportsInt | typing.SupportsIndex = 0, scale: typing.SupportsFloat | typing.SupportsIndex = 1.0, kv_type: str = 'F32', isa: str | None = None, threads: typing.SupportsInt | typing.SupportsIndex = 1, key_index: typing.Annotated[numpy.typing.ArrayLike, numpy.int32] | None = None, key_offsets: typing.Annotated[numpy.typing.ArrayLike, numpy.int64] | None = None, window: typing.SupportsInt | typing.SupportsIndex = 0, sinks: typing.Annotated[numpy.typing.ArrayLike, numpy.float32] | None = None) -> numpy.typing.NDArray[numpy.float32]:
    """
    out[n_queries, n_heads, dv] = softmax(scale q k^T) v, causal from pos0 (query t sees keys 0..pos0+t) or over key_index[key_offsets[t]:key_offsets[t+1]]. q: [n_queries, n_heads, dk]; k: [positions, n_kv_heads, dk]; v: [positions, n_kv_heads, dv], or None for the first dv values of each key row. Keys and values are stored at kv_type first. isa: None (best), 'reference' (naive, double) or an ISA name. window > 0: query t sees only the last window positions up to its own (causal only). sinks: [n_heads] logits joining each softmax's denominator.
    """
def workspace_floats(n_heads: typing.SupportsInt | typing.SupportsIndex, dk: typing.SupportsInt | typing.SupportsIndex, dv: typing.SupportsInt | typing.SupportsIndex, threads: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Most floats of working memory a run needs (the budget mirrors it).
    """
