"""Typed engine settings.

Every setting is a field of a frozen dataclass, validated when the object is built: an
unknown name or a bad value raises :class:`colibri.errors.ConfigError` (a ``ValueError``)
whose message names the field and says what is allowed. Strings are accepted wherever an
enum is expected (``wait_policy="spin"``). Objects never change; ``cfg.replace(...)``
returns a new, validated one. Nothing here reads the environment.

Each field is declared once, as a :class:`~colibri.settings.table.Setting` (its check,
default, one-line doc, flag and the core's copy); construction, validation, ``to_dict``,
``from_dict``, ``replace``, ``repr``, the command-line flags and the core's copy are
derived from it (settings/table.py), and a test checks docs/tuning.md has a row for it.
The defaults, and why, are documented in ``docs/tuning.md``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import Enum
from typing import Any, ClassVar, Literal

from ..errors import ConfigError
from ..sizes import format_bytes, parse_bytes
from .cluster import CLUSTER, ClusterConfig
from .fields import (
    BOOL,
    MAX_RAM_BUDGET,
    RAM_BUDGET,
    SIZE,
    _int,
    count_or_auto,
    enum_of,
    fraction,
    int_or_auto,
    ints,
    one_of,
    optional_ints,
    optional_path,
    sub_config,
)
from .gpu import GPUConfig
from .paths import default_history_dir
from .spec import SPEC, DrafterName, SpecConfig
from .table import Flag, Setting, Settings

__all__ = [
    "DEFAULT_CONTEXT_CAP",
    "DEFAULT_PREFILL_CHUNK",
    "MAX_IO_WORKERS",
    "MAX_PIN_FRACTION",
    "MAX_RAM_BUDGET",
    "MAX_SPIN_US",
    "MAX_THREADS",
    "ActivationPrecision",
    "CacheConfig",
    "CachePolicy",
    "Checksums",
    "ClusterConfig",
    "Device",
    "EngineConfig",
    "GPUConfig",
    "IOConfig",
    "KvCacheType",
    "SpecConfig",
    "ThreadConfig",
    "WaitPolicy",
    "default_history_dir",
    "format_bytes",
    "parse_bytes",
]

MAX_THREADS = 1024
"""Largest team size the core accepts (csrc/threadpool: kMaxThreads)."""

MAX_SPIN_US = 1_000_000
"""Largest hybrid spin time in microseconds (csrc/threadpool: kMaxSpinUs), i.e. 1 s."""

DEFAULT_CONTEXT_CAP = 4096
"""KV-cache positions used when ``context_length`` is None and the model allows more."""

DEFAULT_PREFILL_CHUNK = 512
"""Tokens per prefill chunk (EngineConfig.prefill_chunk): large enough that the matrix
products run at full speed, small enough that Ctrl-C and progress come every fraction of
a second."""

MAX_IO_WORKERS = 64
"""Largest expert-read worker pool (IOConfig.workers)."""

MAX_PIN_FRACTION = 0.9
"""Largest share of the expert cache learned pins may take (CacheConfig.pin_fraction): at
least 10 % always stays with the LRU part, so an expert the history never saw still fits."""


class WaitPolicy(str, Enum):
    """How the compute threads wait between the parallel regions of one computation.

    Outside a computation (between calls) every policy sleeps: an idle model uses no CPU.
    """

    SPIN = "spin"
    """Busy-wait. Lowest hand-off latency; each waiting thread keeps a core at 100 %."""
    PASSIVE = "passive"
    """Sleep on a condition variable. No CPU while waiting; a wake-up costs ~5-50 µs."""
    HYBRID = "hybrid"
    """Spin for ``spin_us`` microseconds, then sleep."""
    AUTO = "auto"
    """Chosen by the core for the run: PASSIVE when decode is disk-bound (experts streamed
    from SSD, the compute mostly waits for reads) or the host is Apple Silicon; SPIN or
    HYBRID when compute-bound (every expert resident). The choice made is reported in the
    model's and each generation's stats (``wait_policy``)."""


WaitPolicyName = Literal["spin", "passive", "hybrid", "auto"]


class CachePolicy(str, Enum):
    """Which expert the RAM-budgeted expert cache drops when it needs a slot."""

    LRU = "lru"
    """Least recently used."""
    LFRU = "lfru"
    """Frequency-aware LRU: among the least recently used, an expert used often survives
    one used once. Routing is skewed (a few experts per layer take most tokens), so this
    keeps the hot experts through a burst of one-off ones."""
    PINNED = "pinned"
    """Experts that the routing history of earlier runs shows to be hot are pinned (up to
    ``CacheConfig.pin_fraction`` of the cache); the rest of the cache is LRU."""


Checksums = Literal["first", "always", "off"]
"""When a native container's crc32 are verified: the first read of each blob (and again
after its file changed), every read, or never (IOConfig.checksums; docs/reliability.md)."""


# "auto" picks float32 activations for models whose weights are at most this many bytes:
# models of up to ~1.5B parameters at 4-5 bits, where the int8 rounding's noise flips
# answers (SmolLM2 answers "What is the capital of France?" wrongly with int8) and a token
# costs little either way; int8 above it (docs/tuning.md, "Activation precision").
AUTO_FLOAT32_MAX_WEIGHT_BYTES = 1 << 30


class ActivationPrecision(str, Enum):
    """How activations meet quantized weights (every block type) in matrix products.
    Float weights (F32, F16, BF16) always meet float32 activations."""

    AUTO = "auto"
    """``float32`` for a model whose weights take at most 1 GiB, ``int8`` for larger ones.
    Resolved at load (:meth:`EngineConfig.resolve_activation_precision`): the loaded
    model's ``engine_config`` holds the choice."""
    INT8 = "int8"
    """Round each activation row to 8-bit blocks and use integer dot products (AVX-512
    VNNI / AVX2), as llama.cpp does. The fastest; logits differ from an F32 evaluation of
    the dequantized weights by the activation rounding (~1-4 % relative on SmolLM2)."""
    FLOAT32 = "float32"
    """Dequantize each weight row and use float dot products, as transformers does with a
    GGUF. Matches it to float rounding; slower (docs/tuning.md)."""

class KvCacheType(str, Enum):
    """How a session's KV cache stores keys and values (``EngineConfig.kv_cache_type``)."""

    AUTO = "auto"
    """F32 when the exact path is in use (float weights: an F32/F16/BF16 checkpoint, or
    ``activation_precision="float32"``), F16 otherwise (llama.cpp's default). Resolved by
    :meth:`EngineConfig.resolve_kv_cache_type`."""
    F32 = "f32"
    """4 bytes a value: exact; what the oracle tests use."""
    F16 = "f16"
    """2 bytes a value: half the memory and bandwidth of F32; mean KL divergence from the
    F32 cache 1e-6 on SmolLM2 (docs/tuning.md), far below the weights' quantization."""
    BF16 = "bf16"
    """2 bytes a value with F32's range and 8 significant bits: KLD 6e-5 on SmolLM2."""
    Q8_0 = "q8_0"
    """34 bytes per 32 values (8-bit blocks with a half-precision scale, GGUF's Q8_0):
    ~27% of F32; KLD 7e-4 on SmolLM2. Needs head dims that are multiples of 32."""


KvCacheTypeName = Literal["auto", "f32", "f16", "bf16", "q8_0"]

Device = Literal["cpu", "gpu", "auto"]
"""Where the model computes (``EngineConfig.device``; docs/gpu.md): ``"cpu"``, ``"gpu"``
(the linear layers on a WebGPU adapter, the rest on the CPU) or ``"auto"`` (the CPU until a
GPU is measured faster: today always the CPU)."""



# --- settings -----------------------------------------------------------------------------

STREAMING_FLAGS = "expert streaming (MoE models)"
"""The --help group of the flags of the streaming tier (IOConfig, CacheConfig, ram_budget)."""


def _team_size(n: int | None) -> int:
    """ThreadConfig.n resolved: `n`, or the performance-core count when None."""
    if n is not None:
        return n
    from ..hardware import performance_cores

    return min(performance_cores(), MAX_THREADS)


def _auto_as_minus_one(value: int | Literal["auto"]) -> int:
    """The core's code for "auto" (csrc/model/expert_store.hpp: kAutoWorkers, kAutoInFlight)."""
    return -1 if value == "auto" else value


class ThreadConfig(Settings):
    """The compute team: how many threads run a forward pass and how they wait.

    ``ThreadConfig(n=None, wait_policy="auto", spin_us=100)`` is the default: one thread
    per performance core; the core waits passively when the decode is disk-bound and
    spins (at most ``spin_us`` between regions, under hybrid) when it is compute-bound.
    """

    n: Setting[int | None, int | None] = Setting(
        optional_ints(1, MAX_THREADS, "threads", "one per performance core"), default=None,
        doc="compute threads", core="n_threads", to_core=_team_size,
        flag=Flag("-t", "--threads", metavar="N", parse=int,
                  default_text="the performance cores"))
    """Team size, the calling thread included, 1..MAX_THREADS. ``None`` = the number of
    performance cores this process may use (:func:`colibri.hardware.performance_cores`: physical
    cores, no SMT siblings, no efficiency cores, within the affinity mask and CPU quota)."""

    wait_policy: Setting[WaitPolicy | WaitPolicyName, WaitPolicy] = Setting(
        enum_of(WaitPolicy), default=WaitPolicy.AUTO, core="policy",
        doc="how threads wait between parallel regions",
        flag=Flag("--wait-policy", choices=("auto", "spin", "passive", "hybrid"),
                  default_text="auto: passive when disk-bound, spinning when compute-bound"))
    """How threads wait between the parallel regions of one computation (see WaitPolicy);
    between calls every policy sleeps. Default AUTO: the core picks PASSIVE when the run is
    disk-bound (a spinning team takes the cores the I/O workers need: 2.2x slower decode in
    the seed report) or on Apple Silicon, and a spinning policy when compute-bound; the
    choice is in the stats. HYBRID is the fast spinning hand-off between back-to-back
    regions without burning cores through long waits; SPIN suits a dedicated,
    compute-bound x86 host; PASSIVE suits GPU offload and shared machines (docs/tuning.md,
    with the seed figures)."""

    spin_us: Setting[int, int] = Setting(
        ints(0, MAX_SPIN_US, "microseconds"), default=100, core="spin_us",
        doc="hybrid (and auto while it uses hybrid): how long a waiting thread spins before "
            "it sleeps")
    """HYBRID only: microseconds a waiting thread spins before it sleeps, 0..MAX_SPIN_US.
    Default 100 µs, the order of a sleep plus wake-up: spinning about as long as blocking
    would cost never costs more than ~2x the best choice made in hindsight, and a wait for
    the disk or the GPU (milliseconds) stops burning the cores the I/O threads and the
    GPU's power budget need. 0 behaves like PASSIVE."""

    def team_size(self) -> int:
        """The team size to use: ``n``, or the performance-core count when n is None."""
        return _team_size(self.n)


class CacheConfig(Settings):
    """The RAM-budgeted expert cache: which experts stay when room runs out.

    Its size is not set here: it is what ``EngineConfig.ram_budget`` leaves after the
    resident weights, the KV cache and the work buffers (:mod:`colibri.engine.budget`).
    """

    flag_group: ClassVar[str] = STREAMING_FLAGS

    policy: Setting[CachePolicy | Literal["lru", "lfru", "pinned"], CachePolicy] = Setting(
        enum_of(CachePolicy), default=CachePolicy.LFRU, core="policy",
        doc="which expert the cache drops: lru, lfru (frequency-aware), pinned (pins learned "
            "from earlier runs + LRU)",
        flag=Flag("--cache-policy"))
    """Eviction policy (see :class:`CachePolicy`). Default LFRU: routing is skewed, and a
    frequency-aware LRU keeps the hot experts through bursts of rarely used ones."""

    pin_fraction: Setting[float, float] = Setting(
        fraction(MAX_PIN_FRACTION), default=0.5, core="pin_fraction",
        doc="pinned only: the share of the cache's slots the learned pins may take")
    """PINNED only: the share of the cache's slots that learned pins may take, 0..0.9
    (MAX_PIN_FRACTION). Default 0.5: half the cache for the experts the history shows to
    be hot, half LRU for what the current prompt needs. 0 pins nothing (plain LRU)."""

    history: Setting[bool, bool] = Setting(
        BOOL, default=True,
        doc="count which experts each token routes to and save the counts when the model is "
            "closed")
    """Record which experts each token routes to and save the counts per model when the
    model is closed (default True); PINNED learns its pins from them. Only counts are kept
    (experts x layers integers), never tokens or text."""

    history_path: Setting[str | os.PathLike[str] | None, str | None] = Setting(
        optional_path("a file per model under ~/.cache/colibri/routing/"), default=None,
        doc="the routing-history file; None: one file per model under "
            "~/.cache/colibri/routing/")
    """The routing-history file. ``None`` (default): a file per model under
    :func:`default_history_dir` (``~/.cache/colibri/routing/``). A leading ``~`` is
    expanded when the file is used."""

    preload: Setting[bool, bool] = Setting(
        BOOL, default=False, doc="read every expert at load when the cache can hold them all")
    """Read every expert at load when the cache can hold them all (default False: experts
    are read on first use, so a load is quick and a short run reads only what it routes
    to). True trades load time for no first-use stalls; ignored when they do not fit."""


class IOConfig(Settings):
    """How routed experts are read from disk."""

    flag_group: ClassVar[str] = STREAMING_FLAGS

    workers: Setting[int | Literal["auto"], int | Literal["auto"]] = Setting(
        int_or_auto(0, MAX_IO_WORKERS, 'threads (or "auto")'), default=2,
        core="workers", to_core=_auto_as_minus_one,
        doc="threads reading experts from disk, 0 = read on the compute thread, auto = the "
            "knee of a read-depth curve measured at load",
        flag=Flag("--io-workers", metavar="N|auto", parse=count_or_auto))
    """Threads that read experts (= reads in flight), 0..MAX_IO_WORKERS (64), or
    ``"auto"``: at load, time cold reads of the model's own experts into the expert
    cache's slots at 1, 2, 4 and 8 reads in flight (about 0.2 s) and use the knee, the
    smallest depth within 90% of the best (``Model.stats().io``). Default 2, measured: on the
    2-core development VM streaming moe-8g, 1-2 workers decoded 9.1-9.8 tok/s and 4-8
    workers 6.8-7.6 (docs/benchmarks-log.md): each worker checks crc32s and starts prefetches
    that cannot be cancelled once running, which takes CPU and bandwidth from the compute
    team and the demand reads. A fast NVMe drive with cores to spare may want 4-8.
    0 reads synchronously on the compute thread (no overlap; for debugging and for
    measuring what the overlap buys)."""

    direct: Setting[bool, bool] = Setting(
        BOOL, default=True, core="direct",
        doc="read experts with O_DIRECT, bypassing the page cache; falls back to buffered "
            "reads where unsupported",
        flag=Flag("--direct"))
    """Read with O_DIRECT into aligned buffers (default True): the expert cache is the
    cache, so bypassing the page cache avoids holding every expert twice and keeps the
    process inside its RAM budget. Where the OS or file system refuses O_DIRECT (tmpfs,
    macOS, some network file systems), reads fall back to buffered I/O by themselves."""

    prefetch: Setting[bool, bool] = Setting(
        BOOL, default=True, core="prefetch",
        doc="predict and start reading the next layer's experts early",
        flag=Flag("--prefetch"))
    """Predict the next layer's experts by applying its router to the current hidden state
    and start reading them early (default True). Cancellable and never blocking; wrong
    guesses cost bandwidth only. Without it every miss is a stall."""

    checksums: Setting[Checksums, Checksums] = Setting(
        one_of("first", "always", "off"), default="first", core="checksums",
        doc="when a native container's crc32 are verified: first read of each blob (and "
            "after its file changed), every read, or never")
    """When a native container's crc32 are verified (GGUF and safetensors have none).
    Dense tensors are verified at load unless ``"off"``. Expert blobs: ``"first"``
    (default) on each blob's first read into the cache, and again on the next read of
    every blob once the file's size, inode, mtime or ctime changed (a rewrite, a
    truncation, an in-place edit) — one crc32 pass per expert per run on an unchanged
    file; ``"always"`` on every read from disk, re-reads after eviction included (also
    catches damage the file system does not see, such as bit rot; one crc32 pass per
    read); ``"off"`` never. Exact guarantees: docs/reliability.md."""

    first_layer_guess: Setting[bool, bool] = Setting(
        BOOL, default=True, core="first_layer_guess",
        doc="with --prefetch: also guess the first MoE layer's experts just before its "
            "attention runs",
        flag=Flag("--first-layer-guess"))
    """With ``prefetch``: guess the first MoE layer's experts too (default True). Nothing
    before it has a router to look ahead with, so without this the disk idles from the last
    layer's reads of one token to the first layer's router of the next (the LM head,
    sampling, embedding, the first attention). Just before that layer's attention, the
    guess runs its norm and routing rule on the residual stream there plus the previous
    token's attention part, and prefetches the result under its own governor
    (docs/streaming.md, "First-layer guess"). A prefetch only: the same bits either way."""

    max_in_flight: Setting[int | Literal["auto"], int | Literal["auto"]] = Setting(
        int_or_auto(0, MAX_IO_WORKERS, 'reads (0: no cap, or "auto")'), default=0,
        core="max_in_flight", to_core=_auto_as_minus_one,
        doc="expert reads on the device at once, apart from the workers; 0 = no cap, auto = "
            "the best depth of a read-depth curve measured at load",
        flag=Flag("--io-max-in-flight", metavar="N|auto", parse=count_or_auto))
    """Expert reads on the device at once, apart from ``workers`` (0..MAX_IO_WORKERS;
    default 0 = no cap: each worker has one read on the device and a demand read that no
    worker has started runs on the compute thread beside them, so 2 workers keep 2-3 in
    flight). With a cap, a worker takes the next read only when fewer than the cap are on
    the device, the crc32 check of a finished read runs after its place is freed (2 workers
    with a cap of 1 keep one read on the device while the other checks the last one), and
    a demand read the compute waits for takes the next free place ahead of every queued
    prefetch. ``"auto"``: at load, time cold reads at 1, 2, 4 and 8 reads in flight (the
    same measurement as ``workers="auto"``) and cap at the depth with the best bandwidth
    (within 3%: the smaller one); some virtio disks are fastest with one read in flight
    (docs/benchmarks-log.md, sessions 25-26). The cap in use and the curve are in
    ``Model.stats().io``; ``ExpertStats.cap_waits`` counts demand reads that waited for a
    place, ``busy_seconds`` the time with a read on the device. Only which read runs when
    changes: the same bits either way."""

    prefetch_min_accuracy: Setting[float, float] = Setting(
        fraction(1.0), default=0.55, kw_only=True, core="prefetch_min_accuracy",
        doc="pause prefetching while less than this share of its recent guesses were used "
            "(it resumes 0.1 above); 0 = never pause",
        flag=Flag("--prefetch-min-accuracy", metavar="P", parse=float))
    """The prefetch governors' threshold, 0..1 (the lookahead's, and apart the first-layer
    guess's): each scores its last 128 candidates (predicted experts that were not cached:
    did the layer route to them?) and, after 32, pauses its reads while the share routed to
    is below this, resuming at 0.10 more (at most 1). Default 0.55, the break-even measured
    on the development VM's disk (docs/streaming.md, "Prefetch policy"): a wrong guess costs
    a read of the device's time and a slot. A drive with bandwidth to spare loses little on
    a wrong guess and may want less (0 never pauses); a slow or shared one may want more.
    Only which reads start early changes: the same bits either way."""


class EngineConfig(Settings):
    """Everything that shapes how a model runs. Outputs are the same bits under every
    setting here except ``activation_precision``, which picks the arithmetic."""

    threads: Setting[ThreadConfig | Mapping[str, Any] | None, ThreadConfig] = Setting(
        sub_config(ThreadConfig), default=None, doc="the compute team")
    """The compute team (size and wait policy). A mapping is accepted and converted."""

    context_length: Setting[int | None, int | None] = Setting(
        optional_ints(1, 1 << 30, "positions", "the model's maximum, at most 4096"),
        default=None, doc="KV-cache positions",
        flag=Flag("-c", "--context-length", metavar="N", parse=int,
                  default_text="the model's context, at most 4096"))
    """KV-cache positions per session, >= 1. ``None`` = the model's maximum context capped
    at DEFAULT_CONTEXT_CAP (4096), so a 128k-context model does not reserve a 128k cache
    unless asked to. See :meth:`resolve_context_length`."""

    activation_precision: Setting[ActivationPrecision | str, ActivationPrecision] = Setting(
        enum_of(ActivationPrecision), default=ActivationPrecision.AUTO,
        doc="int8: llama.cpp's arithmetic, fastest; float32: transformers' (changes the "
            "numbers); auto: float32 for models of at most 1 GiB of weights, else int8",
        flag=Flag("--activation-precision"))
    """``"auto"`` (default: ``"float32"`` for models of at most 1 GiB of weights,
    ``"int8"`` above), ``"int8"`` (llama.cpp's arithmetic) or ``"float32"``
    (transformers'). Unlike the other settings this one changes the numbers (see
    :class:`ActivationPrecision`); the result is still bit-identical across threads and
    policies for each choice."""

    ram_budget: Setting[int | str | None, int | None] = Setting(
        RAM_BUDGET, default=None,
        doc="RAM for the whole engine: weights, KV cache, buffers and the expert cache, e.g. "
            "12GiB, 1.5GB, 800M",
        flag=Flag("--ram-budget", metavar="SIZE", group=STREAMING_FLAGS,
                  default_text="available memory less 10% or 512 MiB"))
    """Bytes of RAM for the whole engine: resident (dense) weights + one session's KV cache
    + work buffers + the expert cache, which gets what is left (:func:`colibri.engine.budget.
    plan_budget`). Given as bytes or a size text (``"12GiB"``, ``"1.5GB"``, ``"800M"``; see
    :func:`parse_bytes`), stored as int bytes. ``None`` (default): the memory this process
    may use (:func:`colibri.hardware.available_memory`: MemAvailable and the cgroup limit)
    minus a safety margin of 10 % or 512 MiB, whichever is larger. A budget too small for
    the resident part raises ConfigError at load, saying the minimum."""

    io: Setting[IOConfig | Mapping[str, Any] | None, IOConfig] = Setting(
        sub_config(IOConfig), default=None, doc="how experts are read")
    """Expert reads: workers, O_DIRECT, prefetch, checksums. A mapping is accepted."""

    cache: Setting[CacheConfig | Mapping[str, Any] | None, CacheConfig] = Setting(
        sub_config(CacheConfig), default=None, doc="the expert cache")
    """The expert cache's policy, routing history and preload. A mapping is accepted."""

    prompt_cache: Setting[int | str, int] = Setting(
        SIZE, default=0, doc="bytes for the prompt cache (0: off)")
    """Bytes for the prompt cache (``Model.prompt_cache``): the KV state of recent
    generations kept so that a later call sharing a token prefix (the next turn of a chat,
    a common system prompt) reuses it instead of prefilling it again. Part of
    ``ram_budget`` (taken before the expert cache). Given like ``ram_budget`` (``"1GiB"``);
    0 (default) turns it off."""

    prefill_chunk: Setting[int | None, int | None] = Setting(
        optional_ints(1, 1 << 30, "tokens", "the whole prompt in one batch"),
        default=DEFAULT_PREFILL_CHUNK,
        doc="prompt tokens per prefill chunk; Ctrl-C and the progress line are served "
            "between chunks",
        flag=Flag("--prefill-chunk", metavar="N", parse=int))
    """Tokens per prefill chunk, >= 1 (default 512); ``None`` = the whole prompt in one
    batch. A long prompt runs in chunks so that Ctrl-C and progress callbacks are served
    between them and the work buffers stay the size of one chunk; the logits are the same
    bits either way. See docs/tuning.md."""

    kv_cache_type: Setting[KvCacheType | KvCacheTypeName, KvCacheType] = Setting(
        enum_of(KvCacheType), default=KvCacheType.AUTO,
        doc="how sessions store keys and values")
    """How the KV cache stores keys and values: ``"auto"`` (default: ``"f32"`` on the exact
    path, float weights or float32 activations; ``"f16"`` otherwise), ``"f32"``, ``"f16"``,
    ``"bf16"`` or ``"q8_0"``. The budget counts the KV cache at this type. Changes the
    numbers slightly (not for f32); bit-identical across threads and batching for each."""

    spec: Setting[SpecConfig | Mapping[str, Any] | DrafterName | None, SpecConfig] = Setting(
        SPEC, default=None, doc="speculative decoding for every generation of the model")
    """Speculative decoding for every generation of the model (default off); a call's
    ``spec=`` overrides it. Never changes the tokens (see docs/speculative.md)."""

    device: Setting[Device, Device] = Setting(
        one_of("cpu", "gpu", "auto"), default="cpu", kw_only=True,
        doc="where the model computes: cpu; gpu (the linear layers on a WebGPU adapter, "
            "the rest on the CPU); auto (the CPU until a GPU is measured faster)",
        flag=Flag("--device"))
    """``"cpu"`` (default), ``"gpu"`` or ``"auto"``. ``"gpu"`` runs the linear layers
    (attention projections, dense FFN, shared experts, LM head) on the adapter ``gpu``
    chooses and everything else on the CPU (docs/gpu.md); with no usable adapter the load
    raises :class:`colibri.errors.GPUUnavailableError` naming what is missing. ``"auto"``
    is the CPU today: no GPU has been measured faster than the CPU path yet, and a software
    adapter (lavapipe) never is. The GPU products use float32 activations, whatever
    ``activation_precision`` says, so the numbers differ from the CPU's by the summation
    order (and, under int8, by the activation rounding the GPU does not do)."""

    gpu: Setting[GPUConfig | Mapping[str, Any] | None, GPUConfig] = Setting(
        sub_config(GPUConfig), default=None, kw_only=True,
        doc="with device=\"gpu\": which adapter and how much of its memory")
    """The GPU's settings (:class:`GPUConfig`: the adapter, a memory budget for the
    uploaded weights); used with ``device="gpu"``. A mapping is accepted."""

    cluster: Setting[ClusterConfig | Mapping[str, Any] | None, ClusterConfig | None] = Setting(
        CLUSTER, default=None, kw_only=True,
        doc="routed experts computed by expert workers on a Ray cluster (None: all here)")
    """Routed experts computed by expert workers on a Ray cluster (docs/cluster.md):
    ``None`` (default) computes every expert in this process. A mapping is accepted. The
    outputs are the same bits either way."""

    def resolve_activation_precision(self, weight_bytes: int) -> ActivationPrecision:
        """``activation_precision`` unless it is ``"auto"``, which gives ``float32`` for a
        model of at most AUTO_FLOAT32_MAX_WEIGHT_BYTES of weights and ``int8`` above."""
        if self.activation_precision is not ActivationPrecision.AUTO:
            return self.activation_precision
        small = weight_bytes <= AUTO_FLOAT32_MAX_WEIGHT_BYTES
        return ActivationPrecision.FLOAT32 if small else ActivationPrecision.INT8

    def resolve_kv_cache_type(self, float_weights: bool) -> str:
        """The KV-cache type to use: ``kv_cache_type`` unless it is ``"auto"``, which gives
        ``"f32"`` on the exact path (`float_weights`: every matrix of the model is F32, F16
        or BF16; or float32 activations) and ``"f16"`` otherwise. Call it on a config whose
        ``activation_precision`` is resolved (not ``"auto"``)."""
        if self.kv_cache_type is not KvCacheType.AUTO:
            return str(self.kv_cache_type.value)
        exact = float_weights or self.activation_precision is ActivationPrecision.FLOAT32
        return "f32" if exact else "f16"

    def resolve_context_length(self, model_max: int) -> int:
        """KV-cache positions for a model whose maximum context is `model_max`.

        None gives ``min(model_max, DEFAULT_CONTEXT_CAP)``; an explicit value larger than
        the model's maximum raises ConfigError (positions past it were never trained).
        """
        model_max = _int("model maximum context", model_max, 1, 1 << 30, "positions")
        if self.context_length is None:
            return min(model_max, DEFAULT_CONTEXT_CAP)
        if self.context_length > model_max:
            raise ConfigError(
                f"EngineConfig.context_length: {self.context_length} exceeds the model's "
                f"maximum context of {model_max}; use at most {model_max} (or None)"
            )
        return self.context_length
