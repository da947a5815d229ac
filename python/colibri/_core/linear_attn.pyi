"""
The delta rule's kernels (tests and benchmarks).
"""
from __future__ import annotations
import numpy
import numpy.typing
import typing
__all__: list[str] = ['active_isa', 'delta_rule', 'set_isa']
def active_isa() -> str:
    """
    The ISA of the kernels models run now.
    """
def delta_rule(q: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], k: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], v: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], beta: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], g: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], S: typing.Annotated[numpy.typing.ArrayLike, numpy.float32], chunked: bool = False, isa: str | None = None) -> tuple[numpy.typing.NDArray[numpy.float32], numpy.typing.NDArray[numpy.float32]]:
    """
    One head of the delta rule over n tokens (recurrent, or chunked in 64-token chunks) at isa's kernels (None: the model's): returns (outputs (n, dv), the state after). g: the log decays, (n,) one per token (Gated DeltaNet) or (n, dk) one per key channel (Kimi Delta Attention).
    """
def set_isa(isa: str) -> None:
    """
    Makes isa's kernels the ones every model in this process runs (benchmarks; the same bits on every ISA).
    """
