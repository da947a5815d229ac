"""Streaming decode on a model 4x larger than its RAM budget: colibri vs llama.cpp, the
disk-bound bound, and one-variable sweeps of the expert store's settings.

Every measurement runs in a fresh child process (this script with ``--child``) inside a
memory cgroup whose limit caps the child's RSS and page cache together, after
``sync; echo 3 > /proc/sys/vm/drop_caches`` (docs/benchmarks.md, "Streaming under a RAM
budget vs llama.cpp"; needs root). A child loads the model, then makes two requests, each on a new
session:

* **cold**: the first request of the process: page cache dropped, expert cache empty;
* **warm**: a second request on another text in the same process, so the expert cache
  (colibri) or the page cache inside the cgroup (llama.cpp) holds what the first request
  left there, within the same limit.

A request prefills ``--prompt`` token ids of a text passage (the same ids for both engines,
tokenized once by llama.cpp) and decodes ``--decode`` more. Decoding is "forced" by
default: each step computes the argmax but feeds the passage's next token, because greedy
decoding of random weights falls into loops of one repeated token, whose routing repeats
and flatters every cache (``--decode-mode greedy`` measures that). Decode tok/s is wall
time over the decode loop only.

The bound: ``tok/s <= disk B/s / bytes per token``, with ``bytes read / decode tokens``
from colibri's stats (the block layer's count from /proc/self/io for llama.cpp). The disk
figure is measured with **the engine's own read path** (_diskbound.py: ReadPool.bench with
huge-page slabs, O_DIRECT, cold reads of one expert slot at random slot-aligned offsets of
the file the run streams, landing in as many distinct slabs as the expert cache under test
has slots, in turn: ``--bound-slabs``, default auto; 0 is the pre-session-27 method, one
slab per read in flight, which a virtio disk serves 7-25% faster than the decode's
hundreds of distinct slots; ``--reference-slabs 0`` samples the old way too, beside each
sample, for comparison), before the first child and after every child: a burst of
``--disk-bytes`` at 1, 2, 4, 8 and 16 reads in flight, then a sustained read of
``--sustained-bytes`` (about what one decode request reads) at each of
``--sustained-depths``; **the bound is the best per-depth median of the sustained samples
of the run** (_diskbound.DiskBound says why; the best burst with ``--sustained-bytes 0``;
``--yardstick-gbs`` fixes it instead), applied to every child at the end, and the decode is
also given against the best sustained sample, the best burst and the bursts' median.
Every colibri request records its reads' trace (_iotrace.py: reads running at once, time
with none, queueing; ``BENCH_IO_TRACE_DIR`` keeps the raw traces).
The device bound is measured with fio (_fio.py: installed with apt-get when missing; random
O_DIRECT reads of the expert size at 1, 2, 4, 8 in flight, huge-page buffers where the
machine gives them) and every table gives the decode's read rate as a % of each bound,
named: "% of engine-path bound" and "% of fio device bound". Every colibri row also gives
the engine's per-token breakdown (ms with a read on the device / computing / neither).
"disk busy %" is the device's own busy time over the decode (/proc/diskstats; every
process on the machine counts). Each configuration runs ``--repeats`` children (>= 5 to
quote), quoted as median (min-max); when two ranges overlap the benchmark says the spread
is too large to rank them. Hit rates: "in RAM" (already read when needed) and "incl. in
flight" (a prefetch still reading counts). The synthetic model's routing regime is
``--routing`` (default realistic; synthetic_routing.py). The parent prints tables and writes
``benchmarks/results/streaming-*.json``.

    sudo PYTHONPATH=python:build/dev/bench .venv/bin/python benchmarks/bench_streaming.py
    ... --only compare --repeats 3 --decode 32
    ... --only sweep-workers,sweep-wait-disk,sweep-wait-resident,demo

Parts (``--only``, comma-separated; default all): compare, sweep-workers, sweep-direct,
sweep-prefetch, sweep-cache, sweep-wait-disk, sweep-wait-resident, demo. The disk-bound
parts use ``--preset`` (moe-8g: written by synthetic_moe.py and converted to a native
container under build/bench-data/ when missing) in a cgroup of ``--budget-frac`` of its
GGUF (colibri's ram_budget is that less ``--margin``); the resident wait-policy run uses
``--resident-preset`` with every expert preloaded; "demo" streams smollm2-moe-demo with a
small budget and runs it resident.

"compare" runs its rows with the same token ids, the same threads and the same number
of decode tokens (``--compare-decode``): colibri on its native container, colibri on the
very GGUF file llama.cpp reads (the same bytes, three expert tensors per expert instead of
one blob), and llama.cpp in each ``--llama-variants`` configuration: read_ahead_kb 128 or
the machine's (set on the disk for that child, always restored), with or without
MADV_RANDOM on its mapping (llama-cpp-python has no option for it: the child calls
madvise itself after load). The best llama.cpp row is the baseline. llama.cpp runs with
``use_extra_bufts = False`` (else it copies the whole model into anonymous memory and the
cgroup kills it; docs/benchmarks.md, "Synthetic MoE presets"), ``use_mmap=True``: it
streams through mmap and the page cache, its designed way.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _cgroup as cg
import _diskbound as db
from _common import RESULTS_DIR, git_commit, machine
from _fio import fio_bound
from _stream_child import RESULT_MARK, child_main, planned_cache_slots
from _stream_report import (
    _jsonable,
    bound_table,
    compare_summary,
    finish_parts,
    run_configs,
)

REPO = Path(__file__).resolve().parent.parent
BENCH_DATA = REPO / "build" / "bench-data"
PARTS = ("compare", "sweep-workers", "sweep-direct", "sweep-prefetch", "sweep-cache",
         "sweep-wait-disk", "sweep-wait-resident", "demo")
# Text passages, tokenized once per model by llama.cpp (vocab only), so both engines get the
# same ids. A request prefills a passage's first --prompt tokens and then decodes --decode
# more: by default "forced", feeding the passage's next tokens (each step still computes
# the argmax), because greedy decoding of random weights falls into loops of one repeated
# token whose routing repeats too, which would flatter every cache. A and B are the cold
# and the warm request; C and D train the routing history ("pinned") and warm up resident
# runs, so no measured text is ever learned from.
PASSAGES = (
    "The river had carved its way through the valley for ten thousand years, and the town "
    "that grew along its banks learned to read the water the way other towns read the sky. "
    "Fishermen argued about currents over breakfast; children raced paper boats past the "
    "mill; the old bridge, rebuilt three times, still carried carts of apples every autumn. "
    "In spring the water rose to the third step of the church, and everyone pretended that "
    "this was normal, because it had always been normal, and because the bakery stayed open.",
    "Streaming experts from disk changes what a language model costs: the weights no longer "
    "have to fit in memory, only the ones a token needs right now. A cache keeps the popular "
    "experts close, a prefetcher guesses the next layer's choices, and the disk does the "
    "rest, so the question becomes how many bytes each token reads and how fast they arrive. "
    "Measure it in a memory cgroup, drop the page cache first, repeat every run three times, "
    "and compare engines side by side, because the disk of a shared machine never sits still.",
    "Once upon a time, in a land of many experts, every token chose its own path through the "
    "layers, and the cache remembered the popular ones. Merchants counted coins at the gate, "
    "scribes copied letters by candlelight, and the library's shelves bent under atlases of "
    "coastlines nobody had sailed. Each morning the bells rang twice, once for the market "
    "and once for the tide, and the harbour master wrote both times down in a green ledger "
    "that his grandmother had bought from a travelling stationer before the great storm.",
    "Quarterly figures arrived late again: revenue up four percent, shipping costs down, and "
    "a warehouse in the north still waiting for its new roof. The committee asked for charts, "
    "then for fewer charts, then for the original spreadsheet, which nobody could find until "
    "an intern noticed it attached to a reply sent at midnight by the finance director. "
    "By then the roof had been repaired twice, the charts had been printed in colour, and "
    "the minutes recorded a unanimous decision to revisit the matter at the next meeting.",
)


# =========================================================================== pure helpers

def parse_child_output(stdout: str) -> dict[str, Any] | None:
    """The JSON of the last ``@@RESULT {...}`` line a child printed, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            out: dict[str, Any] = json.loads(line[len(RESULT_MARK):])
            return out
    return None


def select_parts(only: str | None) -> list[str]:
    """The parts to run, in PARTS order; ValueError names an unknown one."""
    if not only:
        return list(PARTS)
    want = [p.strip() for p in only.split(",") if p.strip()]
    for p in want:
        if p not in PARTS:
            raise ValueError(f"unknown part {p!r}; choose from {', '.join(PARTS)}")
    return [p for p in PARTS if p in want]


class Runner:
    """Runs children in cgroups, measures the disk, keeps every result in one JSON doc."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.doc: dict[str, Any] = {"benchmark": "streaming", "git_commit": git_commit(),
                                    "machine": machine(), "args": vars(args), "disk": [],
                                    "parts": {}}
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        self.path = RESULTS_DIR / f"streaming-{time.strftime('%Y%m%d-%H%M%S')}.json"
        self.env = dict(os.environ)
        self.env.setdefault("PYTHONPATH", f"{REPO / 'python'}:{REPO / 'build/dev/bench'}")
        self.yardstick: float | None = None  # --yardstick-gbs: a fixed bound
        self.bound: db.DiskBound | None = None
        # Destination slabs of the disk samples (DiskBound.slabs), set per disk-bound part
        # from --bound-slabs: "auto" is the expert cache's slot count of the part's budget.
        self.slabs = 0
        self.reference: db.DiskBound | None = None  # --reference-slabs

    def save(self) -> None:
        self.path.write_text(json.dumps(self.doc, separators=(",", ":"), default=_jsonable))

    def resolve_slabs(self, spec: dict[str, Any], what: str) -> int:
        """Sets and returns the slabs the next disk bound reads into: --bound-slabs, or with
        "auto" the expert cache's slots of the colibri `spec` (its budget / slot size), so
        the bound reads into as many distinct pages as the decode does. Recorded in the
        JSON under ``bound_slabs[what]``."""
        want = getattr(self.args, "bound_slabs", 0)
        self.slabs = planned_cache_slots(spec) if want == "auto" else int(want)
        self.doc.setdefault("bound_slabs", {})[what] = {"setting": want, "slabs": self.slabs}
        self.log(f"disk bound of {what}: reads into {self.slabs or 'one per read in flight'} "
                 f"huge-page slab{'s' if self.slabs != 1 else ''}"
                 + (" (the expert cache's slots)" if want == "auto" else ""))
        return self.slabs

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def disk(self, path: Path, chunk: int, label: str) -> float:
        """Samples the engine's read path on `path` now (reads of `chunk`, each queue
        depth); recorded in the run's DiskBound. Returns this sample's best, B/s."""
        def new(slabs: int) -> db.DiskBound:
            return db.DiskBound(
                str(path), chunk, total=self.args.disk_bytes,
                sustained_total=getattr(self.args, "sustained_bytes", 0),
                sustained_depths=tuple(getattr(self.args, "sustained_depths",
                                               db.SUSTAINED_DEPTHS)),
                slabs=slabs)

        ref_slabs = getattr(self.args, "reference_slabs", None)
        if self.bound is None or self.bound.path != str(path):
            self.bound = new(self.slabs)
            self.doc.setdefault("disk_bounds", []).append(self.bound)
            if ref_slabs is not None:
                self.reference = new(ref_slabs)
                self.doc.setdefault("reference_bounds", []).append(self.reference)
        # --reference-slabs: the same sample into another slab count, right before or
        # after (alternating), so the two methods see the same minutes of the disk
        ref = self.reference if ref_slabs is not None else None
        ref_first = ref is not None and len(ref.samples) % 2 == 1
        if ref is not None and ref_first:
            ref.sample(label)
        best = self.bound.sample(label) * 1e9
        if ref is not None and not ref_first:
            ref.sample(label)
        f = self.bound.figures()
        sus = f"sustained best {f['sustained_best']:.2f}, " if f["sustained_best"] else ""
        rtxt = ""
        if ref is not None and ref.bound_gbs:
            rtxt = (f"; reference into {ref.slabs or 'one per read in flight'} slabs: bound "
                    f"{ref.bound_gbs:.2f}, this run's so far {self.bound.bound_gbs or 0:.2f}")
        self.log(f"disk {label}: burst {best / 1e9:.2f} GB/s (engine read path, huge pages, "
                 f"{cg.fmt_bytes(chunk)} reads; {sus}burst best {f['burst_best']:.2f}{rtxt})")
        return best

    def bound_bps(self) -> float | None:
        """The bound in B/s: --yardstick-gbs if given, else the best sample so far."""
        if self.yardstick:
            return self.yardstick
        g = self.bound.bound_gbs if self.bound is not None else None
        return g * 1e9 if g else None

    def child(self, spec: dict[str, Any], limit: int, cold: bool = True) -> dict[str, Any]:
        """One child in a fresh cgroup of `limit` bytes (page cache dropped first)."""
        dropped = cg.drop_caches() if cold else False
        load_before = os.getloadavg()[0]
        t0 = time.perf_counter()
        with db.readahead(spec["path"], spec.get("read_ahead_kb")), \
                cg.MemoryCgroup("colibri-bench", limit) as group:
            # A row may set environment variables of its own (spec["env"]): another build
            # of the core side by side (PYTHONPATH), an experiment's switch.
            env = {**self.env, **spec.get("env", {})}
            try:
                proc = group.run([sys.executable, __file__, "--child", json.dumps(spec)],
                                 timeout=self.args.child_timeout, env=env, cwd=REPO,
                                 stderr=subprocess.PIPE)
                rc, out, err = proc.returncode, proc.stdout, proc.stderr or ""
            except subprocess.TimeoutExpired as e:
                rc, out, err = -1, (e.stdout or b"").decode() if isinstance(e.stdout, bytes) \
                    else (e.stdout or ""), "timeout"
            res = parse_child_output(out) or {"error": err[-2000:], "returncode": rc}
            res.update(cgroup_limit=limit, cgroup_peak=group.peak_bytes(),
                       oom_kills=group.oom_kills(), caches_dropped=dropped,
                       wall_s=time.perf_counter() - t0, returncode=rc,
                       loadavg_1min=(load_before, os.getloadavg()[0]),
                       read_ahead_kb=db.read_ahead_kb(spec["path"]))
        tag = {k: spec[k] for k in ("engine", "wait_policy", "read_ahead_kb",
                                    "madvise_random") if k in spec}
        tag.update({k: spec[k] for k in ("io", "cache") if spec.get(k)})
        if "error" in res:
            self.log(f"child FAILED {tag}: rc={rc} oom={res['oom_kills']} {res['error'][-400:]}")
        else:
            self.log(f"child {tag}: decode cold {res['cold']['decode_tok_s']:.3g} "
                     f"warm {res['warm']['decode_tok_s']:.3g} tok/s, "
                     f"peak {cg.fmt_bytes(res['cgroup_peak'] or 0)}")
        return res


def check_slabs(r: Runner) -> None:
    """The expert cache slots the colibri children reported (``memory.cache_slots``) beside
    the slabs the bound read into: with ``--bound-slabs auto`` they should agree (the plan
    from the manifest against the load's, from the core's figures); logged when not."""
    seen: dict[str, list[int]] = {}
    for part, body in r.doc["parts"].items():
        if not isinstance(body, dict) or not body.get("disk_bound"):
            continue
        for rs in body.get("runs", {}).values():
            for res in rs:
                slots = (res.get("memory") or {}).get("cache_slots")
                if slots is not None:
                    seen.setdefault(part, []).append(int(slots))
    r.doc["children_cache_slots"] = {p: sorted(set(v)) for p, v in seen.items()}
    if r.args.bound_slabs != "auto":
        return
    for part, slots in r.doc["children_cache_slots"].items():
        what = "demo" if part == "demo" else r.args.preset
        want = r.doc.get("bound_slabs", {}).get(what, {}).get("slabs")
        if slots != [want]:
            r.log(f"note: {part}'s children had {slots} cache slots; its bound read into "
                  f"{want} slabs")


def _passage_ids(gguf: Path, need: int) -> list[list[int]]:
    """PASSAGES tokenized by llama.cpp (vocab only); each must have `need` tokens. Without
    llama-cpp-python, colibri's tokenizer of the GGUF (which tokenizes as llama.cpp does)."""
    try:
        import llama_cpp
    except ImportError:
        from colibri.tokenizers import Tokenizer

        tok = Tokenizer.from_gguf(gguf)
        out = [tok.encode(t, add_special_tokens=False, special=False) for t in PASSAGES]
    else:
        v = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
        out = [v.tokenize(t.encode(), add_bos=False) for t in PASSAGES]
    for ids in out:
        if len(ids) < need:
            raise SystemExit(f"a passage has {len(ids)} tokens, fewer than {need}")
    return out


def _container(gguf: Path) -> Path:
    """The native container of `gguf` in build/bench-data (``colibri convert`` it first
    when missing)."""
    dst = BENCH_DATA / (gguf.name.split(".Q")[0].removesuffix(".MXFP4.gguf") + ".colibri")
    if not (dst / "manifest.json").exists():
        env = dict(os.environ)
        env.setdefault("PYTHONPATH", f"{REPO / 'python'}:{REPO / 'build/dev/bench'}")
        subprocess.run([sys.executable, "-m", "colibri", "convert", "-q", str(gguf), str(dst)],
                       check=True, env=env)
    return dst


def _synthetic(name: str, routing: str = "local") -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from synthetic_moe import PRESETS, ensure_preset, with_routing

    if name in PRESETS:
        return Path(ensure_preset(with_routing(name, routing)))
    from synthetic_gpt_oss import GPT_OSS_PRESETS

    if name in GPT_OSS_PRESETS:
        return ensure_preset(dataclasses.replace(GPT_OSS_PRESETS[name], routing=routing))
    from synthetic_deepseek import FAMILY_PRESETS, family_with_routing

    return Path(ensure_preset(family_with_routing(FAMILY_PRESETS[name], routing)))


def llama_rows(variants: str, make: Any, path: Path) -> list[tuple[str, dict[str, Any]]]:
    """llama.cpp rows from ``--llama-variants``: ``machine`` or a read_ahead_kb figure,
    ``+random`` for MADV_RANDOM on its mapping of the model."""
    machine_kb = db.read_ahead_kb(path)
    rows = []
    for v in (x.strip() for x in variants.split(",") if x.strip()):
        kb_txt, _, rnd = v.partition("+")
        kb = machine_kb if kb_txt == "machine" else int(kb_txt)
        label = f"llama.cpp ra={kb} KiB" + (" MADV_RANDOM" if rnd else "")
        rows.append((label, make(read_ahead_kb=kb, madvise_random=bool(rnd))))
    return rows


def _expert_chunk(container: Path) -> int:
    m = json.loads((container / "manifest.json").read_text())
    return max(4096, max(e["length"] for e in m["experts"]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--only", help=f"comma-separated parts: {', '.join(PARTS)}")
    ap.add_argument("--preset", default="moe-8g", help="synthetic preset, disk-bound runs")
    ap.add_argument("--resident-preset", default="small",
                    help="synthetic preset for the resident (compute-bound) wait-policy run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--compare-decode", type=int, default=8,
                    help="decode tokens per request of every compare row (llama.cpp thrashes "
                         "its page cache at ~0.1 tok/s in the cgroup)")
    ap.add_argument("--yardstick-gbs", type=float,
                    help="a fixed disk bound in GB/s (default: the best sample of the engine's "
                         "read path in this run, before and after every child)")
    ap.add_argument("--routing", default="realistic", choices=("local", "realistic", "uniform"),
                    help="routing regime of the synthetic preset (synthetic_routing.py)")
    ap.add_argument("--resident-decode", type=int, default=64,
                    help="decode tokens per request in the resident and demo runs")
    ap.add_argument("--decode-mode", choices=["forced", "greedy"], default="forced",
                    help="feed the passage's next tokens (default) or the argmax")
    ap.add_argument("--llama-variants", default="machine,machine+random,128,128+random",
                    help="compare: llama.cpp configurations, read_ahead_kb (machine: as set) "
                         "and +random for MADV_RANDOM on its model mapping")
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-frac", type=float, default=0.25,
                    help="cgroup limit as a fraction of the GGUF file (both engines)")
    ap.add_argument("--margin", default="320MiB",
                    help="colibri ram_budget = cgroup limit - margin (interpreter, libraries)")
    ap.add_argument("--workers", type=lambda v: v if v == "auto" else int(v), default=4,
                    help="base I/O workers (a count or auto)")
    ap.add_argument("--prefetch-off-row", action="store_true",
                    help="compare: add colibri with prefetch off (same run, alternating)")
    ap.add_argument("--max-in-flight", type=lambda v: v if v == "auto" else int(v), default=0,
                    help="base IOConfig.max_in_flight (reads on the device at once; 0: no cap)")
    ap.add_argument("--in-flight-row", type=lambda v: v if v == "auto" else int(v),
                    help="compare: a 'colibri, max_in_flight=V' row (same run, alternating)")
    ap.add_argument("--guess-off-row", action="store_true",
                    help="compare: a 'colibri, first-layer guess off' row (IOConfig."
                         "first_layer_guess=False, the lookahead still on)")
    ap.add_argument("--base-build", type=Path,
                    help="compare: a 'colibri, base build' row running another build of the "
                         "core (build/dev/<name>) side by side")
    ap.add_argument("--no-gguf-row", action="store_true",
                    help="compare: skip the colibri-on-the-same-GGUF row")
    ap.add_argument("--wait-policy", default="auto", help="base wait policy")
    ap.add_argument("--cache-policy", default="lfru", help="base cache policy")
    ap.add_argument("--resident-budget", default="3GiB")
    ap.add_argument("--demo-budget", default="160MiB",
                    help="ram_budget of the streamed demo MoE (cgroup: this + margin)")
    ap.add_argument("--demo-resident-budget", default="1GiB")
    ap.add_argument("--disk-bytes", type=cg.parse_size, default="512MiB",
                    help="bytes per queue depth per disk sample")
    ap.add_argument("--sustained-bytes", type=cg.parse_size, default="4GiB",
                    help="bytes of each sustained disk sample per depth (about one decode "
                         "request's reads; the bound is their best per-depth median); 0: "
                         "bursts only, the bound is then the best burst")
    ap.add_argument("--sustained-depths", type=lambda v: tuple(int(x) for x in v.split(",")),
                    default=db.SUSTAINED_DEPTHS, help="reads in flight of the sustained samples")
    ap.add_argument("--bound-slabs", type=lambda v: v if v == "auto" else int(v),
                    default="auto",
                    help="huge-page slabs the disk samples read into, in turn; auto "
                         "(default): the expert cache's slot count under the run's budget, "
                         "so the samples read into as many distinct pages as a decode does; "
                         "0: one per read in flight (the bound before session 27)")
    ap.add_argument("--reference-slabs", type=int,
                    help="also sample the disk into this many slabs (0: one per read in "
                         "flight, the old bound) beside every bound sample, alternating "
                         "which goes first; reported as the reference bound, never used")
    ap.add_argument("--no-fio", dest="fio", action="store_false",
                    help="skip the fio device bound (installed with apt-get when missing)")
    ap.add_argument("--child-timeout", type=float, default=1200)
    ap.add_argument("--colibri-source", choices=["container", "gguf"], default="container")
    ap.add_argument("--summarize", metavar="JSON",
                    help="print the disk-bound table of an earlier run's JSON and exit")
    args = ap.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return
    if args.summarize:
        bound_table(json.loads(Path(args.summarize).read_text()))
        return
    parts = select_parts(args.only)
    # SIGTERM unwinds like an exception, so read_ahead_kb and the cgroup are restored.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    r = Runner(args)
    margin = cg.parse_size(args.margin)
    base_io = {"workers": args.workers, "direct": True, "prefetch": True}
    if args.max_in_flight != 0:
        base_io["max_in_flight"] = args.max_in_flight
    base_cache = {"policy": args.cache_policy, "history": False}
    need = args.prompt + max(args.decode, args.resident_decode)

    def spec(engine: str, path: Path, passages: list[list[int]], **kw: Any) -> dict[str, Any]:
        d = {"engine": engine, "path": str(path), "threads": args.threads, "ctx": 256,
             "prompt": args.prompt, "decode": args.decode, "decode_mode": args.decode_mode,
             "requests": passages[:2], "wait_policy": args.wait_policy}
        d.update(kw)
        return d

    disk_parts = [p for p in parts if p not in ("sweep-wait-resident", "demo")]
    if disk_parts:
        gguf = _synthetic(args.preset, args.routing)
        cont = _container(gguf) if args.colibri_source == "container" else gguf
        experts = cont / "experts.bin" if cont.is_dir() else gguf
        chunk = _expert_chunk(cont) if cont.is_dir() else 4 << 20
        limit = int(gguf.stat().st_size * args.budget_frac)
        budget = limit - margin
        passages = _passage_ids(gguf, need)
        r.doc["disk_bound_model"] = {"gguf": str(gguf), "colibri_path": str(cont),
                                     "routing": args.routing,
                                     "gguf_bytes": gguf.stat().st_size, "cgroup_limit": limit,
                                     "ram_budget": budget, "passages": passages}
        r.log(f"{args.preset} ({args.routing} routing): cgroup {cg.fmt_bytes(limit)}, colibri "
              f"budget {cg.fmt_bytes(budget)}")
        # The device bound (fio, huge pages, depths 1-8) beside the engine-path bound
        r.doc["fio_bound"] = fio_bound(experts, chunk, log=r.log) if args.fio else None

        def col(**kw: Any) -> dict[str, Any]:
            base = {"ram_budget": budget, "io": dict(base_io), "cache": dict(base_cache)}
            base.update(kw)
            return spec("colibri", cont, passages, **base)

        # Routing history: one file per run (never ~/.cache), learned by a separate child
        # on passages C and D (never the measured ones), read only by the "pinned" policy.
        history = BENCH_DATA / f"routing-{r.path.stem}-{args.preset}.json"
        pinned = {"policy": "pinned", "history": True, "history_path": str(history)}
        sweeps: dict[str, tuple[str, list[tuple[str, dict[str, Any]]]]] = {
            "compare": (f"{args.preset} ({args.routing} routing): colibri vs llama.cpp, "
                        f"{args.threads} threads, {args.compare_decode} decode tokens each", [
                ("colibri", col(decode=args.compare_decode)),
                *([("colibri, prefetch off", col(decode=args.compare_decode,
                                                  io={**base_io, "prefetch": False}))]
                  if args.prefetch_off_row else []),
                *([(f"colibri, max_in_flight={args.in_flight_row}", col(
                    decode=args.compare_decode,
                    io={**base_io, "max_in_flight": args.in_flight_row}))]
                  if args.in_flight_row is not None else []),
                *([("colibri, first-layer guess off", col(
                    decode=args.compare_decode, io={**base_io, "first_layer_guess": False}))]
                  if args.guess_off_row else []),
                *([("colibri, same GGUF", {**col(decode=args.compare_decode), "path": str(gguf)})]
                  if not args.no_gguf_row else []),
                *([("colibri, base build", {**col(decode=args.compare_decode), "env": {
                    "PYTHONPATH": f"{REPO / 'python'}:{args.base_build.resolve()}"}})]
                  if args.base_build else []),
                *llama_rows(args.llama_variants, lambda **kw: spec(
                    "llama", gguf, passages, decode=args.compare_decode, **kw), gguf)]),
            "sweep-workers": ("I/O workers", [
                (f"workers={w}", col(io={**base_io, "workers": w})) for w in (0, 1, 2, 4, 8)]),
            "sweep-direct": ("O_DIRECT", [
                (f"direct={d}", col(io={**base_io, "direct": d})) for d in (True, False)]),
            "sweep-prefetch": ("Prefetch (next-layer router lookahead)", [
                (f"prefetch={p}", col(io={**base_io, "prefetch": p})) for p in (True, False)]),
            "sweep-cache": ("Cache policy", [
                ("cache=lru", col(cache={"policy": "lru", "history": False})),
                ("cache=lfru", col(cache={"policy": "lfru", "history": False})),
                ("cache=pinned", col(cache=pinned))]),
            "sweep-wait-disk": ("Wait policy, disk-bound", [
                (f"wait={w}", col(wait_policy=w)) for w in ("spin", "passive", "hybrid", "auto")]),
        }
        r.resolve_slabs(col(), args.preset)
        for part in disk_parts:
            title, configs = sweeps[part]
            if part == "sweep-cache":
                r.log(f"recording routing history for the pinned policy into {history}")
                r.doc["parts"]["pinned-history"] = r.child(col(
                    cache={"policy": "lfru", "history": True, "history_path": str(history)},
                    requests=passages[2:4], save_history=True), limit)
            run_configs(r, title, part, configs, limit, experts, chunk)

    # Resident runs: the cache preloads every expert at load (CacheConfig.preload), so both
    # requests run with a 100% hit rate and no disk traffic.
    resident_cache = {**base_cache, "preload": True}
    if "sweep-wait-resident" in parts:
        gguf = _synthetic(args.resident_preset)
        cont = _container(gguf) if args.colibri_source == "container" else gguf
        passages = _passage_ids(gguf, need)
        budget = cg.parse_size(args.resident_budget)
        configs = [(f"wait={w}", spec("colibri", cont, passages, ram_budget=budget,
                                      io=dict(base_io), cache=resident_cache,
                                      wait_policy=w, decode=args.resident_decode))
                   for w in ("spin", "passive", "hybrid", "auto")]
        run_configs(r, f"Wait policy, resident ({args.resident_preset}, budget "
                       f"{cg.fmt_bytes(budget)}, experts preloaded)", "sweep-wait-resident",
                    configs, budget + margin, None, 0)

    if "demo" in parts:
        from colibri.models.hub import demo_moe_model

        gguf = demo_moe_model()
        cont = _container(gguf) if args.colibri_source == "container" else gguf
        passages = _passage_ids(gguf, need)
        small = cg.parse_size(args.demo_budget)
        big = cg.parse_size(args.demo_resident_budget)
        configs = [
            (f"streamed, budget {cg.fmt_bytes(small)}",
             spec("colibri", cont, passages, ram_budget=small, io=dict(base_io),
                  cache=dict(base_cache), decode=args.resident_decode)),
            (f"resident, budget {cg.fmt_bytes(big)}, preloaded",
             spec("colibri", cont, passages, ram_budget=big, io=dict(base_io),
                  cache=resident_cache, decode=args.resident_decode)),
        ]
        for _, sp in configs:  # each in a cgroup of its own budget + margin
            sp["cgroup_limit"] = sp["ram_budget"] + margin
        r.resolve_slabs(configs[0][1], "demo")
        demo_disk = cont / "experts.bin" if cont.is_dir() else gguf
        demo_chunk = _expert_chunk(cont) if cont.is_dir() else 4 << 20
        run_configs(r, "Demo MoE (smollm2-moe-demo): streamed vs resident", "demo", configs,
                    small + margin, demo_disk, demo_chunk)
    finish_parts(r)
    check_slabs(r)
    if "compare" in r.doc["parts"]:
        compare_summary(r)
    r.doc["bound_table"] = bound_table(r.doc)
    r.save()
    print("wrote", r.path)


if __name__ == "__main__":
    main()
