"""Streaming on a fast disk: the synthetic model on a RAM-backed block device that accepts
O_DIRECT (_ramdisk.RamDisk), read at full RAM speed or capped by a cgroup read throttle
(_ramdisk.ReadThrottle), each at several RAM budgets, beside the same model resident
(every expert preloaded). Says whether the engine, not the disk, is the limit when the
disk is fast (streamed vs resident decode) and how close it gets to a throttled device's
rate (decode read rate vs the throttle), with the engine's per-token breakdown (disk busy,
compute, neither) for every run.

Root only. Every child runs like bench_streaming.py's: a fresh process in a memory cgroup
of its RAM budget + ``--margin``, page cache dropped first, a cold and a warm request of
``--decode`` forced tokens. The budget is ``--budgets`` fractions of the model's GGUF size
(as bench_streaming's ``--budget-frac``, but given to colibri as its ram_budget, the
cgroup holding the margin on top). fio gives the device bound at each speed.

    sudo PYTHONPATH=python:build/dev/wt .venv/bin/python benchmarks/fast_disk.py \\
        --preset small --speeds 1,2,ram --budgets 0.1,0.25,0.5 --repeats 3

The RAM device holds the native container only (the GGUF stays where it is written,
build/bench-data); it is capped at ``--max-device`` (6 GiB by default: the machine's RAM
is shared) and removed at the end, as is every cgroup and mount this script made.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import _cgroup as cg
import _ramdisk as rdisk
from _common import RESULTS_DIR, median, print_table
from _fio import fio_bound
from bench_streaming import Runner, _container, _expert_chunk, _passage_ids, _synthetic


def parse_speeds(text: str) -> list[float | None]:
    """``"1,2,ram"`` -> [1.0, 2.0, None]: GB/s read throttles, ``ram`` for none."""
    out: list[float | None] = []
    for x in (t.strip() for t in text.split(",") if t.strip()):
        if x == "ram":
            out.append(None)
            continue
        v = float(x)
        if v <= 0:
            raise ValueError(f"a device speed must be > 0 GB/s or 'ram', got {x!r}")
        out.append(v)
    return out


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def _med(runs: list[dict[str, Any]], req: str, key: str) -> float | None:
    xs = [float(v) for r in runs if isinstance(v := (r.get(req) or {}).get(key), (int, float))]
    return median(xs) if xs else None


def _bd(runs: list[dict[str, Any]], req: str, key: str) -> float | None:
    xs = [float(v) for r in runs
          if isinstance(v := ((r.get(req) or {}).get("breakdown") or {}).get(key), (int, float))]
    return median(xs) if xs else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small", help="synthetic preset (synthetic_moe.py)")
    ap.add_argument("--routing", default="realistic", choices=("local", "realistic", "uniform"))
    ap.add_argument("--speeds", type=parse_speeds, default=parse_speeds("1,2,ram"),
                    help="device read speeds in GB/s (cgroup throttle), 'ram' for none")
    ap.add_argument("--budgets", type=lambda v: [float(x) for x in v.split(",")],
                    default=[0.15, 0.25, 0.5],
                    help="RAM budgets, fractions of the GGUF (the small preset needs >= 0.11)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=lambda v: v if v == "auto" else int(v), default=4)
    ap.add_argument("--margin", default="320MiB")
    ap.add_argument("--resident-budget", default="3GiB")
    ap.add_argument("--wait-policy", default="auto", choices=("auto", "spin", "passive", "hybrid"),
                    help="every child's (streamed and resident alike); 'auto' resolves to "
                         "spin for a resident run, which suffers on shared cores")
    ap.add_argument("--checksums", type=lambda v: v.split(","), default=["first"],
                    help="IOConfig.checksums of the streamed children; several (first,off) "
                         "run side by side in each round")
    ap.add_argument("--max-device", type=cg.parse_size, default="6GiB")
    ap.add_argument("--child-timeout", type=float, default=900)
    args = ap.parse_args(argv)
    for b in args.budgets:
        if not 0 < b < 1:
            raise SystemExit(f"a budget is a fraction in (0, 1), got {b}")
    gguf = _synthetic(args.preset, args.routing)
    cont = _container(gguf)
    passages = _passage_ids(gguf, args.prompt + args.decode)
    margin = cg.parse_size(args.margin)
    r = Runner(argparse.Namespace(child_timeout=args.child_timeout, repeats=args.repeats))
    r.path = RESULTS_DIR / f"fast-disk-{time.strftime('%Y%m%d-%H%M%S')}.json"
    r.doc.update(benchmark="fast-disk", args=vars(args), runs=[], fio={})
    base = {"engine": "colibri", "threads": args.threads, "ctx": 256, "prompt": args.prompt,
            "decode": args.decode, "decode_mode": "forced", "requests": passages[:2],
            "wait_policy": args.wait_policy}
    io = {"workers": args.workers, "direct": True, "prefetch": True}
    size = rdisk.device_size(_dir_bytes(cont))
    with rdisk.RamDisk(size, args.max_device, log=r.log) as rd:
        assert rd.mount is not None
        dst = rd.mount / cont.name
        shutil.copytree(cont, dst)
        r.doc["device"] = {"kind": rd.kind, "bytes": size, "loop_direct_io": rd.direct_io}
        chunk = _expert_chunk(dst)
        # Rounds outermost (every configuration once per round, the resident run too), so
        # a slow minute of the shared machine hits all configurations alike.
        res_budget = cg.parse_size(args.resident_budget)
        res_spec = {**base, "path": str(dst), "ram_budget": res_budget, "io": dict(io),
                    "cache": {"policy": "lfru", "history": False, "preload": True}}
        runs: dict[tuple[float | None, float, str], list[dict[str, Any]]] = {}
        labels: dict[float | None, str] = {}
        resident: list[dict[str, Any]] = []
        for rep in range(args.repeats):
            for speed in args.speeds:
                bps = int(speed * 1e9) if speed else None
                with rdisk.ReadThrottle(dst / "experts.bin", bps) as th:
                    labels[speed] = th.describe() if bps else f"RAM ({rd.kind})"
                    if rep == 0:  # the device bound at this speed, through the throttle
                        r.doc["fio"][labels[speed]] = fio_bound(
                            dst / "experts.bin", chunk, repeats=1, size=256 << 20, log=r.log)
                    for frac in args.budgets:
                        for ck in args.checksums:
                            budget = int(gguf.stat().st_size * frac)
                            spec = {**base, "path": str(dst), "ram_budget": budget,
                                    "io": {**io, "checksums": ck},
                                    "cache": {"policy": "lfru", "history": False}}
                            runs.setdefault((speed, frac, ck), []).append(
                                r.child(spec, budget + margin))
            # Resident: every expert preloaded at load; no read while decoding.
            resident.append(r.child(res_spec, res_budget + margin))
            r.doc.update(runs=[{"device": labels[sp], "speed_gb_s": sp, "budget_frac": f,
                                "checksums": ck, "runs": rs} for (sp, f, ck), rs in runs.items()],
                         resident=resident)
            r.save()
        several = len(args.checksums) > 1
        rows = [(labels[sp] + (f", checksums {ck}" if several else ""), sp, f, rs,
                 r.doc["fio"][labels[sp]]) for (sp, f, ck), rs in runs.items()]
    report(r, rows, resident)
    r.save()
    print("wrote", r.path)


def report(r: Runner, rows: list[tuple[str, float | None, float, list[dict[str, Any]],
                                      dict[str, Any]]],
           resident: list[dict[str, Any]]) -> None:
    res = {p: _med(resident, p, "decode_tok_s") for p in ("cold", "warm")}
    print(f"\n## Fast disk: {r.doc['device']['kind']}, resident decode cold "
          f"{res['cold'] or 0:.3g} / warm {res['warm'] or 0:.3g} tok/s "
          f"(median of {len(resident)}); resident warm, ms/tok: disk busy "
          + " / ".join(f"{v:.3g}" if (v := _bd(resident, "warm", k)) is not None else "-"
                       for k in ("disk_busy_ms", "compute_ms", "neither_ms"))
          + " (disk busy / compute / neither)")
    table = []
    for label, speed, frac, runs, fio in rows:
        ok = [x for x in runs if "error" not in x]
        for p in ("cold", "warm"):
            tok = _med(ok, p, "decode_tok_s")
            rate = median([float(x[p]["experts"]["bytes_read"]) / x[p]["decode_s"] for x in ok
                           if x.get(p, {}).get("experts")]) if ok else None
            fio_bps = (fio or {}).get("bound_gb_s")
            table.append([
                label, f"{frac:.0%}", p, f"{tok:.3g}" if tok else "-",
                f"{100 * tok / res[p]:.0f}" if tok and res[p] else "-",
                f"{rate / 1e9:.2f}" if rate else "-",
                f"{100 * rate / (speed * 1e9):.0f}" if rate and speed else "-",
                f"{100 * rate / (fio_bps * 1e9):.0f}" if rate and fio_bps else "-",
                *(f"{v:.3g}" if (v := _bd(ok, p, k)) is not None else "-"
                  for k in ("disk_busy_ms", "compute_ms", "neither_ms")),
                f"{100 * v:.2g}" if (v := _bd(ok, p, "neither_frac")) is not None else "-",
                f"{len(ok)}/{len(runs)}"])
    r.doc["table"] = print_table(
        ["device", "budget", "req", "decode tok/s", "% of resident", "GB/s read",
         "% of throttle", "% of fio device bound", "disk busy ms/tok", "compute ms/tok",
         "neither ms/tok", "neither %", "ok"], table)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
