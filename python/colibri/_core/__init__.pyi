# Type stubs for the native module colibri._core (generated with pybind11-stubgen, then
# checked by hand). Regenerate after changing csrc/bindings/.
"""
colibri native core (C++). Use the colibri Python package; this module is internal.
"""
from __future__ import annotations
import collections.abc
import numpy
import numpy.typing
import typing
from . import quant
__all__: list[str] = ['ActPrecision', 'Engine', 'Extent', 'ModelSpec', 'QkNorm', 'Session', 'TensorSpec', 'ThreadPool', 'ThreadPoolStats', 'ThreadSettings', 'WaitPolicy', 'quant']
class WaitPolicy:
    """
    How the compute team waits between parallel regions of a computation.
    
    Members:
    
      SPIN : busy-wait (lowest latency; burns a core per thread)
    
      PASSIVE : sleep on a condition variable
    
      HYBRID : spin for spin_us microseconds, then sleep
    """
    HYBRID: typing.ClassVar[WaitPolicy]
    PASSIVE: typing.ClassVar[WaitPolicy]
    SPIN: typing.ClassVar[WaitPolicy]
    __members__: typing.ClassVar[dict[str, WaitPolicy]]
    @typing.overload
    def __eq__(self, other: WaitPolicy) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: WaitPolicy) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class ThreadSettings:
    """
    Team size (caller included), wait policy and hybrid spin time.
    """
    __hash__: typing.ClassVar[None] = None  # type: ignore[assignment]
    policy: WaitPolicy
    def __eq__(self, arg0: object) -> bool:
        ...
    def __init__(self, n_threads: typing.SupportsInt | typing.SupportsIndex = 1, policy: WaitPolicy = ..., spin_us: typing.SupportsInt | typing.SupportsIndex = 100) -> None:
        ...
    def __repr__(self) -> str:
        ...
    @property
    def n_threads(self) -> int:
        ...
    @n_threads.setter
    def n_threads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def spin_us(self) -> int:
        ...
    @spin_us.setter
    def spin_us(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class ThreadPoolStats:
    """
    Counters since creation or reset_stats().
    """
    def __repr__(self) -> str:
        ...
    def as_dict(self) -> dict[str, int]:
        ...
    @property
    def caller_sleeps(self) -> int:
        ...
    @property
    def inline_regions(self) -> int:
        ...
    @property
    def regions(self) -> int:
        ...
    @property
    def scopes(self) -> int:
        ...
    @property
    def sleeps(self) -> int:
        ...
    @property
    def starved(self) -> int:
        ...
class ThreadPool:
    """
    The compute team. The calling thread is member 0; settings take effect at once; outside a computation every worker sleeps.
    """
    @typing.overload
    def __init__(self, settings: ThreadSettings) -> None:
        ...
    @typing.overload
    def __init__(self, n_threads: typing.SupportsInt | typing.SupportsIndex = 1, policy: WaitPolicy = ..., spin_us: typing.SupportsInt | typing.SupportsIndex = 100) -> None:
        ...
    @typing.overload
    def configure(self, settings: ThreadSettings) -> None:
        """
        Applies new settings at once (resizes the team, changes the policy).
        """
    @typing.overload
    def configure(self, *, n_threads: typing.Any = None, policy: typing.Any = None, spin_us: typing.Any = None) -> None:
        """
        Changes only the settings given.
        """
    def coverage(self, n: typing.SupportsInt | typing.SupportsIndex, grain: typing.SupportsInt | typing.SupportsIndex) -> tuple[list[int], list[int], int]:
        """
        Test helper: returns (visits per index, indices per member, largest chunk).
        """
    def nested(self, n_outer: typing.SupportsInt | typing.SupportsIndex, n_inner: typing.SupportsInt | typing.SupportsIndex) -> int:
        """
        Test helper: nested regions; returns n_outer * n_inner (-1 if an inner region saw another member index than its outer one).
        """
    def raise_at(self, n: typing.SupportsInt | typing.SupportsIndex, grain: typing.SupportsInt | typing.SupportsIndex, index: typing.SupportsInt | typing.SupportsIndex, kind: str = 'runtime') -> None:
        """
        Test helper: a region whose fn throws at `index` (kind: runtime -> RuntimeError, value -> ValueError, io -> colibri.errors.ModelIOError).
        """
    def reset_stats(self) -> None:
        ...
    def run_regions(self, n_regions: typing.SupportsInt | typing.SupportsIndex, work_ns_per_index: typing.SupportsInt | typing.SupportsIndex, n_indices: typing.SupportsInt | typing.SupportsIndex, grain: typing.SupportsInt | typing.SupportsIndex = 1, gap_ns: typing.SupportsInt | typing.SupportsIndex = 0, sleep_ns: typing.SupportsInt | typing.SupportsIndex = 0) -> int:
        """
        Test helper: synthetic regions of busy work in one ComputeScope; returns the number of indices executed (n_regions * n_indices).
        """
    def stats(self) -> ThreadPoolStats:
        ...
    @property
    def settings(self) -> ThreadSettings:
        ...
    @property
    def size(self) -> int:
        """
        team size, the caller included
        """
class ActPrecision:
    """
    Members:
    
      int8
    
      float32
    """
    __members__: typing.ClassVar[dict[str, ActPrecision]]
    float32: typing.ClassVar[ActPrecision]
    int8: typing.ClassVar[ActPrecision]
    @typing.overload
    def __eq__(self, other: ActPrecision) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: ActPrecision) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class QkNorm:
    """
    Members:
    
      none
    
      head
    
      full
    """
    __members__: typing.ClassVar[dict[str, QkNorm]]
    full: typing.ClassVar[QkNorm]
    head: typing.ClassVar[QkNorm]
    none: typing.ClassVar[QkNorm]
    @typing.overload
    def __eq__(self, other: QkNorm) -> bool:
        ...
    @typing.overload
    def __eq__(self, other: typing.Any) -> bool:
        ...
    def __getstate__(self) -> int:
        ...
    def __hash__(self) -> int:
        ...
    def __index__(self) -> int:
        ...
    def __init__(self, value: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __int__(self) -> int:
        ...
    @typing.overload
    def __ne__(self, other: QkNorm) -> bool:
        ...
    @typing.overload
    def __ne__(self, other: typing.Any) -> bool:
        ...
    def __repr__(self) -> str:
        ...
    def __setstate__(self, state: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def __str__(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def value(self) -> int:
        ...
class Extent:
    def __init__(self, file: typing.SupportsInt | typing.SupportsIndex, offset: typing.SupportsInt | typing.SupportsIndex, length: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def file(self) -> int:
        ...
    @file.setter
    def file(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def length(self) -> int:
        ...
    @length.setter
    def length(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def offset(self) -> int:
        ...
    @offset.setter
    def offset(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class TensorSpec:
    def __init__(self, name: str, dtype: str, shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], extents: collections.abc.Sequence[Extent], rope_unpermute_heads: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def shape(self) -> list[int]:
        ...
class ModelSpec:
    arch: str
    attention_bias: bool
    norm_topk_prob: bool
    qk_norm: QkNorm
    tie_word_embeddings: bool
    def __init__(self) -> None:
        ...
    @property
    def attention_scale(self) -> float:
        ...
    @attention_scale.setter
    def attention_scale(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def context_length(self) -> int:
        ...
    @context_length.setter
    def context_length(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def head_dim(self) -> int:
        ...
    @head_dim.setter
    def head_dim(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def hidden_size(self) -> int:
        ...
    @hidden_size.setter
    def hidden_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def intermediate_size(self) -> int:
        ...
    @intermediate_size.setter
    def intermediate_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def moe_intermediate_size(self) -> int:
        ...
    @moe_intermediate_size.setter
    def moe_intermediate_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def moe_layers(self) -> list[int]:
        ...
    @moe_layers.setter
    def moe_layers(self, arg0: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex]) -> None:
        ...
    @property
    def n_experts(self) -> int:
        ...
    @n_experts.setter
    def n_experts(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def n_experts_per_tok(self) -> int:
        ...
    @n_experts_per_tok.setter
    def n_experts_per_tok(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def n_heads(self) -> int:
        ...
    @n_heads.setter
    def n_heads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def n_kv_heads(self) -> int:
        ...
    @n_kv_heads.setter
    def n_kv_heads(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def n_layers(self) -> int:
        ...
    @n_layers.setter
    def n_layers(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def rms_norm_eps(self) -> float:
        ...
    @rms_norm_eps.setter
    def rms_norm_eps(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def rope_attention_factor(self) -> float:
        ...
    @rope_attention_factor.setter
    def rope_attention_factor(self, arg0: typing.SupportsFloat | typing.SupportsIndex) -> None:
        ...
    @property
    def rope_inv_freq(self) -> list[float]:
        ...
    @rope_inv_freq.setter
    def rope_inv_freq(self, arg0: collections.abc.Sequence[typing.SupportsFloat | typing.SupportsIndex]) -> None:
        ...
    @property
    def shared_expert_intermediate_size(self) -> int:
        ...
    @shared_expert_intermediate_size.setter
    def shared_expert_intermediate_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def vocab_size(self) -> int:
        ...
    @vocab_size.setter
    def vocab_size(self, arg0: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class Engine:
    activation_precision: ActPrecision
    def __init__(self, spec: ModelSpec, tensors: collections.abc.Sequence[TensorSpec], files: collections.abc.Sequence[str], threads: ThreadSettings) -> None:
        ...
    def thread_stats(self) -> ThreadPoolStats:
        ...
    def reset_thread_stats(self) -> None:
        ...
    def configure_threads(self, settings: ThreadSettings) -> None:
        ...
    @property
    def spec(self) -> ModelSpec:
        ...
    @property
    def thread_settings(self) -> ThreadSettings:
        ...
    @property
    def weight_bytes(self) -> int:
        ...
class Session:
    def __init__(self, engine: Engine, context_length: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def forward(self, ids: typing.Annotated[numpy.typing.ArrayLike, numpy.int32], all_logits: bool = False) -> numpy.typing.NDArray[numpy.float32]:
        ...
    def last_routing(self) -> numpy.typing.NDArray[numpy.int32]:
        ...
    def reset(self) -> None:
        ...
    def rollback(self, n: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def context_length(self) -> int:
        ...
    @property
    def n_tokens(self) -> int:
        ...
