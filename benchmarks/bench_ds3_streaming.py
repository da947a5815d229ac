"""The DeepSeek-V3-like synthetic preset (synthetic_deepseek.py's ``ds3-10g``: 12 layers, the
first dense, MLA, 256 experts top-8 in 4 of 8 groups + 1 shared, 9.97 GB of Q4_0 experts)
streamed in a memory cgroup of 25% of its GGUF: colibri vs llama-cpp-python on the same
weights, same cgroup, same threads, same token ids and the same number of decode tokens, in
one run with the configurations alternating per round.

Children, requests (cold: page cache dropped, expert cache empty; warm: a second passage in
the same process) and forced decoding are bench_streaming.py's, reused as they are.

**The disk bound** is measured with the engine's own read path (issue 14): colibri's
``ReadPool`` (O_DIRECT, one pread per read, ``workers`` reads in flight), reading whole
experts (the native container's blob of one expert, the read colibri issues on a miss) at
the offsets of the experts in ``experts.bin``, shuffled, into slabs laid back to back in one
anonymous ``MADV_HUGEPAGE`` mapping like the expert cache's arena. Bursts (``--disk-bytes``)
at 1, 2, 4 and 8 in flight before the first child and after the last, into huge-page and
4 KiB-page slabs; after every child a burst at ``workers`` and twice that ("% of
adjacent"). Sustained samples (``--sustained-bytes`` per depth, about what a request reads,
at ``--sustained-depths``; _diskbound.DiskBound) before the first child, after each child
and after the last. **The bound is the best per-depth median of the sustained samples**
(DiskBound says why); the best sustained sample and the best huge-page burst (the bound
before 2026-12-02) are reported beside it. "% of bound" = decode tok/s / (bound / bytes
colibri read per decoded token). Every colibri request records its reads' trace
(_iotrace.py) in the JSON.

llama.cpp runs with the machine's ``read_ahead_kb`` and with 128 KiB (restored after each
child); the best of its rows is the baseline of the ratio.

    sudo PYTHONPATH=python:build/dev/<name> .venv/bin/python benchmarks/bench_ds3_streaming.py \\
        --repeats 3 --decode 16

Writes benchmarks/results/ds3-streaming-*.json (every child, the disk samples, load
averages) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import _cgroup as cg
import _diskbound as db
import _stream_report as sr
import bench_streaming as bs
from _common import RESULTS_DIR, git_commit, machine, print_table

DEPTHS = (1, 2, 4, 8)


def sysfs_queue(path: Path) -> Path | None:
    """/sys/block/<disk>/queue of the device holding `path` (a partition's parent disk)."""
    dev = os.stat(path).st_dev
    link = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    try:
        real = link.resolve()
    except OSError:
        return None
    for d in (real, real.parent):
        if (d / "queue" / "read_ahead_kb").is_file():
            return d / "queue"
    return None


@contextmanager
def read_ahead(queue: Path | None, kb: int | None) -> Iterator[None]:
    """Sets read_ahead_kb for the block, then puts the old value back."""
    if queue is None or kb is None:
        yield
        return
    f = queue / "read_ahead_kb"
    old = f.read_text().strip()
    f.write_text(str(kb))
    try:
        yield
    finally:
        f.write_text(old)


def expert_reads(container: Path) -> tuple[list[int], int]:
    """(offsets, length) of every expert blob in the container's experts.bin."""
    m = json.loads((container / "manifest.json").read_text())
    lengths = {e["length"] for e in m["experts"]}
    return [int(e["offset"]) for e in m["experts"]], max(lengths)


def engine_disk(container: Path, total: int, seed: int, depths: tuple[int, ...] = DEPTHS,
                kinds: tuple[bool, ...] = (True, False)) -> list[dict[str, Any]]:
    """O_DIRECT reads of whole experts through colibri's ReadPool, at each queue depth,
    into huge-page-backed (the engine's) and 4 KiB-page slabs. GB/s per sample."""
    import colibri._core.io as cio

    offsets, length = expert_reads(container)
    n = max(8, total // length)
    out = []
    for hugepages in kinds:
        for qd in depths:
            picks = random.Random(seed * 100 + qd).sample(offsets, min(n, len(offsets)))
            with cio.ReadPool([str(container / "experts.bin")], workers=qd, direct=True) as p:
                secs = p.bench(0, picks, length, qd, hugepages)
                direct = p.stats()["direct_reads"] == len(picks)
            out.append({"hugepages": hugepages, "qd": qd, "read_bytes": length,
                        "reads": len(picks), "seconds": secs, "all_direct": direct,
                        "gb_s": len(picks) * length / secs / 1e9,
                        "loadavg": os.getloadavg()[0]})
    return out


def spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{min(xs):.3g}-{max(xs):.3g}"


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def values(runs: list[dict[str, Any]], path: str) -> list[float]:
    return [float(v) for r in runs if isinstance(v := sr.dig(r, path), (int, float))]


def ready_rate(req: dict[str, Any] | None) -> float | None:
    ex = (req or {}).get("experts")
    if not ex:
        return None
    n = ex["hits"] + ex["misses"]
    return ex["ready_hits"] / n if n else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="ds3-10g")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode", type=int, default=16, help="decode tokens per request, all rows")
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2, help="colibri I/O workers")
    ap.add_argument("--budget-frac", type=float, default=0.25)
    ap.add_argument("--margin", default="320MiB")
    ap.add_argument("--disk-bytes", type=cg.parse_size, default="1GiB")
    ap.add_argument("--sustained-bytes", type=cg.parse_size, default="2GiB",
                    help="bytes of each sustained disk sample per depth (before the first "
                         "child, after each child, after the last; a ds3-10g request of 8 "
                         "decode tokens reads ~1.6 GB): the bound is their best per-depth "
                         "median (_diskbound.DiskBound); 0: the best burst, as before")
    ap.add_argument("--sustained-depths", type=lambda v: tuple(int(x) for x in v.split(",")),
                    default=db.SUSTAINED_DEPTHS)
    ap.add_argument("--child-timeout", type=float, default=900)
    ap.add_argument("--routing", default="realistic", choices=("local", "realistic", "uniform"),
                    help="routing regime of the synthetic preset (synthetic_routing.py)")
    ap.add_argument("--rows", default="colibri,llama-machine,llama-128",
                    help="comma-separated: colibri, colibri-gguf, colibri-noguess, colibri-spin, "
                         "colibri-passive, "
                         "colibri-base, llama-machine, llama-128")
    ap.add_argument("--base-build", type=Path,
                    help="another build of the core (a build/dev/<name> directory) for the "
                         "colibri-base row: a change measured side by side with its baseline")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VAL,...",
                    help="an extra colibri row, colibri-NAME, whose child gets these "
                         "environment variables (repeatable; list it in --rows)")
    args = ap.parse_args()

    gguf = bs._synthetic(args.preset, args.routing)
    cont = bs._container(gguf)
    limit = int(gguf.stat().st_size * args.budget_frac)
    budget = limit - cg.parse_size(args.margin)
    passages = bs._passage_ids(gguf, args.prompt + args.decode)
    queue = sysfs_queue(gguf)
    machine_ra = int((queue / "read_ahead_kb").read_text()) if queue else None
    # bench_streaming's Runner runs the children (cgroup, drop_caches, timeouts).
    runner = bs.Runner(argparse.Namespace(child_timeout=args.child_timeout,
                                          disk_bytes=args.disk_bytes))
    doc: dict[str, Any] = {"benchmark": "ds3-streaming", "git_commit": git_commit(),
                           "machine": machine(), "gguf": str(gguf),
                           "args": {k: str(v) if isinstance(v, Path) else v
                                    for k, v in vars(args).items()},
                           "routing": args.routing,
                           "gguf_bytes": gguf.stat().st_size, "cgroup_limit": limit,
                           "ram_budget": budget, "read_ahead_kb_machine": machine_ra,
                           "loadavg_start": os.getloadavg(), "disk": [], "runs": {}}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"ds3-streaming-{time.strftime('%Y%m%d-%H%M%S')}.json"

    sustained = db.DiskBound(str(cont / "experts.bin"), expert_reads(cont)[1], depths=(),
                             total=0, sustained_total=args.sustained_bytes,
                             sustained_depths=args.sustained_depths)

    def save() -> None:
        doc["disk_bound"] = sustained.to_dict()
        out.write_text(json.dumps(doc, separators=(",", ":")))

    def sample_sustained(label: str) -> None:
        if args.sustained_bytes > 0:
            sustained.sample(label)
            runner.log(f"disk {label}: sustained so far best {sustained.sustained_best_gbs:.2f}"
                       f", best median {sustained.sustained_median_gbs:.2f} GB/s")

    def base(engine: str, path: Path, **kw: Any) -> dict[str, Any]:
        d = {"engine": engine, "path": str(path), "threads": args.threads, "ctx": 256,
             "prompt": args.prompt, "decode": args.decode, "decode_mode": "forced",
             "requests": passages[:2], "wait_policy": "auto"}
        d.update(kw)
        return d

    col = {"ram_budget": budget, "io": {"workers": args.workers, "direct": True,
                                        "prefetch": True},
           "cache": {"policy": "lfru", "history": False}}
    base_path = f"{bs.REPO / 'python'}:{(args.base_build or Path()).resolve()}"
    rows: dict[str, tuple[dict[str, Any], int | None]] = {
        "colibri": (base("colibri", cont, **col), None),
        "colibri-gguf": (base("colibri", gguf, **col), None),
        # The first-layer guess off (IOConfig.first_layer_guess), the lookahead still on.
        "colibri-noguess": (base("colibri", cont, **{**col, "io": {
            **col["io"], "first_layer_guess": False}}), None),
        # The compute team's wait policy forced (the default row lets the engine choose).
        "colibri-spin": (base("colibri", cont, **{**col, "wait_policy": "spin"}), None),
        "colibri-passive": (base("colibri", cont, **{**col, "wait_policy": "passive"}), None),
        "llama-machine": (base("llama", gguf), None),
        "colibri-base": (base("colibri", cont, **col, env={"PYTHONPATH": base_path}), None),
        "llama-128": (base("llama", gguf), 128),
    }
    for v in args.variant:
        name, _, assigns = v.partition(":")
        env = dict(a.split("=", 1) for a in assigns.split(",") if "=" in a)
        rows[f"colibri-{name}"] = (base("colibri", cont, **col, env=env), None)
    chosen = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in chosen if r not in rows]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}: choose from {sorted(rows)}")
    if "colibri-base" in chosen and not args.base_build:
        raise SystemExit("the colibri-base row needs --base-build build/dev/<name>")
    runner.log(f"{args.preset}: cgroup {cg.fmt_bytes(limit)}, colibri budget "
               f"{cg.fmt_bytes(budget)}, read_ahead_kb {machine_ra}")
    doc["disk"] += [{"when": "before", **d} for d in engine_disk(cont, args.disk_bytes, 0)]
    sample_sustained("before")
    save()
    for rep in range(args.repeats):
        order = chosen if rep % 2 == 0 else chosen[::-1]
        for name in order:
            spec, ra = rows[name]
            with read_ahead(queue, ra):
                res = runner.child(spec, limit)
            res["read_ahead_kb"] = ra if ra is not None else machine_ra
            # The device right after the child, at the engine's depth and twice it: the
            # disk of a shared machine drifts, so each child also gets an adjacent figure.
            after = engine_disk(cont, args.disk_bytes // 4, 10 + rep,
                                (args.workers, 2 * args.workers), (True,))
            res["disk_after_gb_s"] = max(d["gb_s"] for d in after)
            doc["disk"] += [{"when": f"after {name} #{rep}", **d} for d in after]
            sample_sustained(f"after {name} #{rep}")
            doc["runs"].setdefault(name, []).append(res)
            save()
    doc["disk"] += [{"when": "after", **d} for d in engine_disk(cont, args.disk_bytes, 1)]
    sample_sustained("after")
    doc["loadavg_end"] = os.getloadavg()

    huge = [d["gb_s"] for d in doc["disk"] if d["hugepages"]]
    burst_best = max(huge) * 1e9
    # The bound: the best per-depth median of the sustained samples (DiskBound); the best
    # huge-page burst without them (the definition before 2026-12-02), reported either way.
    sus_med = sustained.sustained_median_gbs
    bound = sus_med * 1e9 if sus_med else burst_best
    sus_best = (sustained.sustained_best_gbs or 0.0) * 1e9 or None
    doc["bound_bytes_per_s"] = bound
    doc["bound_definition"] = ("best per-depth median of the sustained samples" if sus_med
                               else "best huge-page burst")
    doc["burst_best_bytes_per_s"] = burst_best
    doc["sustained_best_bytes_per_s"] = sus_best
    print(f"\n## Disk, colibri's read path ({cg.fmt_bytes(expert_reads(cont)[1])} expert "
          f"reads, O_DIRECT), GB/s before / after")
    drows = []
    for hp in (True, False):
        for qd in DEPTHS:
            xs = [f"{d['gb_s']:.2f}" for d in doc["disk"] if d["hugepages"] == hp and d["qd"] == qd]
            drows.append(["huge pages" if hp else "4 KiB pages", qd, " / ".join(xs)])
    doc["disk_table"] = print_table(["buffers", "reads in flight", "GB/s"], drows)
    if sus_med:
        print("sustained samples (" + cg.fmt_bytes(args.sustained_bytes) + " per depth) by "
              "reads in flight: " + ", ".join(
                  f"{d}: best {c['best']:.2f} median {c['median']:.2f} (n={c['n']})"
                  for d, c in sustained.curve("sustained").items()))
    print(f"bound = {doc['bound_definition']}: {bound / 1e9:.2f} GB/s (best sustained sample "
          f"{(sus_best or 0) / 1e9:.2f}, best huge-page burst {burst_best / 1e9:.2f})")

    table = []
    summary: dict[str, Any] = {}
    for name in chosen:
        runs = [r for r in doc["runs"].get(name, []) if "error" not in r]
        for p in ("cold", "warm"):
            tok = values(runs, f"{p}.decode_tok_s")
            bpt = values(runs, f"{p}.bytes_read_per_token") or values(
                runs, f"{p}.io_read_bytes_per_token")
            hit = values(runs, f"{p}.experts.hit_rate")
            ready = [x for r in runs if (x := ready_rate(r.get(p))) is not None]
            frac = [t / cg.decode_bound(bound, b) for t, b in zip(tok, bpt, strict=False) if b]
            frac_burst = [t / cg.decode_bound(burst_best, b)
                          for t, b in zip(tok, bpt, strict=False) if b]
            frac_sbest = [t / cg.decode_bound(sus_best, b)
                          for t, b in zip(tok, bpt, strict=False) if b and sus_best]
            adj = [sr.dig(r, f"{p}.decode_tok_s") / cg.decode_bound(r["disk_after_gb_s"] * 1e9, b)
                   for r in runs
                   if (b := sr.dig(r, f"{p}.bytes_read_per_token")
                       or sr.dig(r, f"{p}.io_read_bytes_per_token"))]
            busy = values(runs, f"{p}.device_busy")
            loads = [r["loadavg_1min"][0] for r in runs]
            s = {"decode_tok_s": med(tok), "decode_tok_s_all": tok, "ready_hit_rate": med(ready),
                 "hit_rate_incl_inflight": med(hit), "bytes_per_token": med(bpt),
                 "bound_fraction": med(frac), "bound_fraction_all": frac,
                 "burst_best_fraction": med(frac_burst),
                 "sustained_best_fraction": med(frac_sbest),
                 "adjacent_fraction": med(adj), "adjacent_fraction_all": adj,
                 "device_busy": med(busy), "n_ok": len(runs),
                 "device_in_flight": med(values(runs, f"{p}.device_in_flight")),
                 "device_ms_per_request": med(values(runs, f"{p}.device_ms_per_request")),
                 "device_requests_per_token": med(values(runs, f"{p}.device_requests_per_token")),
                 "expert_wait_ms_per_token": med(values(runs, f"{p}.expert_wait_ms_per_token")),
                 "n": len(doc["runs"].get(name, []))}
            summary[f"{name}/{p}"] = s
            table.append([name, p, sr.fmt(s["decode_tok_s"]), spread(tok),
                          sr.fmt(s["ready_hit_rate"]), sr.fmt(s["hit_rate_incl_inflight"]),
                          sr.fmt(s["bytes_per_token"] / 1e9 if s["bytes_per_token"] else None),
                          sr.fmt(s["bound_fraction"] * 100 if s["bound_fraction"] else None),
                          sr.fmt(s["sustained_best_fraction"] * 100
                                 if s["sustained_best_fraction"] else None),
                          sr.fmt(s["burst_best_fraction"] * 100
                                 if s["burst_best_fraction"] else None),
                          sr.fmt(s["adjacent_fraction"] * 100 if s["adjacent_fraction"] else None),
                          sr.fmt(s["device_busy"] * 100 if s["device_busy"] is not None else None),
                          spread(loads), f"{s['n_ok']}/{s['n']}"])
    doc["summary"] = summary
    print("\n## The device during decode (/proc/diskstats, every process) and colibri's waits")
    print_table(["row", "req", "requests in flight", "ms per request", "requests / token",
                 "expert wait ms / token"],
                [[name, p, *(sr.fmt(summary[f"{name}/{p}"][k]) for k in (
                    "device_in_flight", "device_ms_per_request", "device_requests_per_token",
                    "expert_wait_ms_per_token"))]
                 for name in chosen for p in ("cold", "warm")])
    print(f"\n## {args.preset} in a {cg.fmt_bytes(limit)} cgroup, {args.threads} threads, "
          f"{args.decode} decode tokens per request, median of {args.repeats}")
    doc["table"] = print_table(
        ["row", "req", "decode tok/s", "spread", "hit rate (in RAM)", "hit rate (+in flight)",
         "GB read/tok", "% of bound", "% of best sustained", "% of best burst",
         "% of adjacent", "disk busy %", "load 1-min", "ok"],
        table)
    for p in ("cold", "warm"):
        llama = [summary[f"{n}/{p}"]["decode_tok_s"] for n in chosen if n.startswith("llama")
                 and summary[f"{n}/{p}"]["decode_tok_s"]]
        c = summary.get(f"colibri/{p}", {}).get("decode_tok_s")
        if llama and c:
            doc[f"ratio_vs_best_llama_{p}"] = c / max(llama)
            print(f"colibri / best llama.cpp, {p}: {c / max(llama):.3g}x")
    save()
    print("wrote", out)


if __name__ == "__main__":
    main()
