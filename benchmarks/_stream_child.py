"""The child process of bench_streaming.py: loads one engine (colibri or llama.cpp) inside
the parent's memory cgroup, runs the cold and the warm request, prints ``@@RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import _cgroup as cg

RESULT_MARK = "@@RESULT "


def _io_read_bytes() -> int:
    """Bytes this process (all threads) had the block layer read (/proc/self/io)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _argmax(logits: Any) -> int:
    import numpy as np

    return int(np.argmax(logits))


def engine_config(spec: dict[str, Any]) -> Any:
    """The colibri EngineConfig a child loads a colibri spec with."""
    import colibri
    from colibri.settings import config as ccfg

    def cls(name: str) -> Any:
        return getattr(colibri, name, None) or getattr(ccfg, name)

    kw: dict[str, Any] = {
        "threads": cls("ThreadConfig")(n=spec["threads"], wait_policy=spec["wait_policy"]),
        "context_length": spec["ctx"],
    }
    if spec.get("ram_budget") is not None:
        kw["ram_budget"] = spec["ram_budget"]
    if spec.get("io") is not None:
        kw["io"] = cls("IOConfig")(**spec["io"])
    if spec.get("cache") is not None:
        kw["cache"] = cls("CacheConfig")(**spec["cache"])
    return cls("EngineConfig")(**kw)


def planned_cache_slots(spec: dict[str, Any]) -> int:
    """The expert cache slots a child of this colibri spec will get, from the model's
    manifest and the spec's budget, without loading any weight (colibri.engine.streaming.
    plan_from_manifest; the load redoes the split with the core's figures, and the children
    record theirs in ``memory.cache_slots``)."""
    from colibri.engine.core_spec import resolved_context_length
    from colibri.engine.streaming import plan_from_manifest
    from colibri.sources import open_model_source

    engine = engine_config(spec)
    manifest = open_model_source(Path(spec["path"]))
    ctx = resolved_context_length(manifest.config, engine)
    return int(plan_from_manifest(manifest, engine, ctx).cache_slots)


class _Colibri:
    def __init__(self, spec: dict[str, Any]) -> None:
        import colibri

        self.path = spec["path"]
        self.model = colibri.Model.load(spec["path"], engine=engine_config(spec))
        self.session: Any = None

    def snapshot(self) -> tuple[Any, Any]:
        st = self.model.stats()
        return getattr(st, "experts", None), getattr(st, "phases", None)

    def forward_snapshot(self) -> Any:
        """The session's own counters: its forwards' deltas only, not the time between."""
        fs = getattr(self.session, "forward_stats", None)
        return fs()[0] if fs is not None else None

    def start(self, prompt: list[int]) -> Any:
        self.session = self.model.session()
        return self.session.forward(prompt)

    def step(self, tok: int) -> Any:
        return self.session.forward([tok])

    def start_trace(self) -> None:
        core = getattr(self.model, "_core", None)
        if core is not None and hasattr(core, "start_io_trace"):  # an older core: no trace
            core.start_io_trace(1 << 20)

    def trace_summary(self, window: tuple[float, float]) -> dict[str, Any] | None:
        import _iotrace

        core = getattr(self.model, "_core", None)
        if core is None or not hasattr(core, "io_trace"):
            return None
        trace = core.io_trace()
        dump = os.environ.get("BENCH_IO_TRACE_DIR")  # raw traces for offline analysis
        if dump:
            import numpy as np

            name = f"trace-{os.getpid()}-{time.strftime('%H%M%S')}-{window[0]:.3f}.npz"
            np.savez(Path(dump) / name, window=np.array(window),
                     **{f"col_{k}": v for k, v in trace.items()})
        return _iotrace.summarize(trace, window, workers=core.io_workers)

    def extra(self) -> dict[str, Any]:
        st = self.model.stats()
        mem = getattr(st, "memory", None)
        return {"memory": mem.to_dict() if mem is not None else None,
                "wait_policy": str(getattr(st, "wait_policy", "") or "") or None,
                "io": str(getattr(st, "io", "") or "") or None}


class _Llama:
    def __init__(self, spec: dict[str, Any]) -> None:
        import llama_cpp
        import llama_cpp.llama_cpp as low

        default = low.llama_model_default_params

        def no_repack() -> Any:  # Llama() calls the submodule's function: patch it there
            p = default()
            p.use_extra_bufts = False
            return p

        low.llama_model_default_params = no_repack
        self.llama_cpp = llama_cpp
        self.path = spec["path"]
        self.llm = llama_cpp.Llama(
            model_path=spec["path"], n_ctx=spec["ctx"], n_batch=spec["ctx"],
            n_threads=spec["threads"], n_threads_batch=spec["threads"], use_mmap=True,
            use_mlock=False, verbose=False,
        )
        if spec.get("madvise_random"):
            self._madvise_random(spec["path"])

    @staticmethod
    def _madvise_random(path: str) -> None:
        """madvise(MADV_RANDOM) on llama.cpp's mappings of the model: no readahead on its
        page faults (a tuning llama.cpp does not do itself)."""
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        real = os.path.realpath(path)
        for line in Path("/proc/self/maps").read_text().splitlines():
            f = line.split(maxsplit=5)
            if len(f) == 6 and os.path.realpath(f[5]) == real:
                lo, hi = (int(x, 16) for x in f[0].split("-"))
                if libc.madvise(lo, hi - lo, 1) != 0:  # MADV_RANDOM
                    raise OSError(ctypes.get_errno(), "madvise(MADV_RANDOM) failed")

    def snapshot(self) -> tuple[Any, Any]:
        return None, None

    def forward_snapshot(self) -> Any:
        return None

    def _logits(self) -> Any:
        import numpy as np

        ptr = self.llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.llm.n_vocab(),))

    def start(self, prompt: list[int]) -> Any:
        self.llm.reset()
        self.llm.eval(prompt)
        return self._logits()

    def step(self, tok: int) -> Any:
        self.llm.eval([tok])
        return self._logits()

    def extra(self) -> dict[str, Any]:
        return {}


def _delta(a: Any, b: Any) -> dict[str, Any] | None:
    if a is None or b is None:
        return None
    d: dict[str, Any] = b.minus(a).to_dict()
    return d


def breakdown(experts: dict[str, Any], n_decode: int) -> dict[str, float]:
    """Per decode token, from the engine's activity clock (ExpertStats): ms with a read on
    the device, ms computing (the forward thread, less its waits for experts), ms with
    neither (sampling, Python between steps, gaps), and the wall ms they cover. Disk-busy
    and compute overlap: disk + compute + neither - overlap = wall."""
    ms = 1e3 / n_decode
    wall = experts["wall_seconds"]
    return {"disk_busy_ms": experts["disk_busy_seconds"] * ms,
            "compute_ms": experts["compute_seconds"] * ms,
            "overlap_ms": experts["io_and_compute_seconds"] * ms,
            "neither_ms": experts["neither_seconds"] * ms, "wall_ms": wall * ms,
            "neither_frac": experts["neither_seconds"] / wall}


def _request(eng: Any, ids: list[int], n_prompt: int, n_decode: int,
             forced: bool) -> dict[str, Any]:
    """One request: prefill ``ids[:n_prompt]``, then `n_decode` steps, each feeding the
    argmax (greedy) or, when `forced`, the passage's next id; times and counters."""
    prompt, feed = ids[:n_prompt], ids[n_prompt:n_prompt + n_decode]
    ex0, _ = eng.snapshot()
    io0, t0 = _io_read_bytes(), time.perf_counter()
    logits = eng.start(prompt)
    t1, io1, cpu1 = time.perf_counter(), _io_read_bytes(), _cpu_seconds()
    dev1, q1 = cg.device_counters(eng.path), cg.device_queue(eng.path)
    ex1, ph1 = eng.snapshot()
    t_trace = None
    if hasattr(eng, "start_trace"):  # colibri: every expert read of the decode, timed
        eng.start_trace()
        t_trace = time.monotonic()  # the trace's clock
    fw1 = eng.forward_snapshot()
    toks = []
    for i in range(n_decode):
        tok = _argmax(logits)  # computed in both modes, so both cost the same
        toks.append(tok)
        logits = eng.step(feed[i] if forced else tok)
    t2, io2, cpu2 = time.perf_counter(), _io_read_bytes(), _cpu_seconds()
    t_end = time.monotonic()
    dev2, q2 = cg.device_counters(eng.path), cg.device_queue(eng.path)
    ex2, ph2 = eng.snapshot()
    fw2 = eng.forward_snapshot()
    dec_s = t2 - t1
    out: dict[str, Any] = {
        "prefill_s": t1 - t0, "prefill_tok_s": len(prompt) / (t1 - t0),
        "decode_s": dec_s, "decode_tok_s": n_decode / dec_s,
        "decode_cpu_per_wall": (cpu2 - cpu1) / dec_s,
        "prefill_io_read_bytes": io1 - io0, "decode_io_read_bytes": io2 - io1,
        "io_read_bytes_per_token": (io2 - io1) / n_decode,
        "argmax_tokens": toks, "fed_tokens": feed if forced else toks,
        "experts": _delta(ex1, ex2), "phases": _delta(ph1, ph2),
        "prefill_experts": _delta(ex0, ex1),
    }
    if dev1 is not None and dev2 is not None:  # the whole device: other processes too
        out["device_read_bytes_per_s"] = (dev2[0] - dev1[0]) / dec_s
        out["device_busy"] = (dev2[1] - dev1[1]) / 1e3 / dec_s
    if q1 is not None and q2 is not None and q2[0] > q1[0]:  # requests, as the device saw them
        reqs = q2[0] - q1[0]
        out["device_requests_per_token"] = reqs / n_decode
        out["device_ms_per_request"] = (q2[1] - q1[1]) / reqs
        out["device_in_flight"] = (q2[1] - q1[1]) / 1e3 / dec_s
    if t_trace is not None:
        out["io_trace"] = eng.trace_summary((t_trace, t_end))
    if out["experts"] is not None:
        out["bytes_read_per_token"] = out["experts"]["bytes_read"] / n_decode
    if out["phases"] is not None:
        out["expert_wait_ms_per_token"] = 1e3 * out["phases"]["expert_wait"] / n_decode
    ex = out["experts"]
    if ex is not None and ex.get("wall_seconds"):  # a core with the activity clock
        out["breakdown"] = breakdown(ex, n_decode)
        if fw1 is not None and fw2 is not None and hasattr(fw2, "neither_seconds"):
            # inside the forwards (the session's own deltas) vs between them (sampling,
            # Python): where a "neither" gap sits
            inside = (fw2.neither_seconds - fw1.neither_seconds) * 1e3 / n_decode
            out["breakdown"].update(neither_in_forward_ms=inside,
                                    neither_between_ms=out["breakdown"]["neither_ms"] - inside)
    return out


def child_main(spec: dict[str, Any]) -> None:
    """Loads one engine, runs the cold and the warm request, prints @@RESULT json."""
    t0 = time.perf_counter()
    eng: Any = _Colibri(spec) if spec["engine"] == "colibri" else _Llama(spec)
    result: dict[str, Any] = {"load_s": time.perf_counter() - t0,
                              "load_io_read_bytes": _io_read_bytes()}
    if spec.get("warmup_ids"):  # resident runs: touch (nearly) every expert first
        eng.start(spec["warmup_ids"])
        result["warmup_tokens"] = len(spec["warmup_ids"])
    for name, ids in zip(("cold", "warm"), spec["requests"], strict=True):
        result[name] = _request(eng, ids, spec["prompt"], spec["decode"],
                                spec["decode_mode"] == "forced")
    result.update(eng.extra())
    if spec.get("save_history"):  # Model.close() adds this run's routing to the history
        eng.model.close()
    result["vm_hwm"] = cg.proc_status_bytes("VmHWM")
    result["rss_anon"] = cg.proc_status_bytes("RssAnon")
    result["rss_file"] = cg.proc_status_bytes("RssFile")
    print(RESULT_MARK + json.dumps(result), flush=True)


# =========================================================================== parent side
