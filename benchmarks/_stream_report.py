"""Tables and figures of benchmarks/bench_streaming.py: per-configuration medians and
spreads of the children, the rows of the printed tables, the rankability verdicts, the
comparison against the best llama.cpp configuration, and decode against the disk bound
(the engine's own read path, benchmarks/_diskbound.py). Split out of bench_streaming.py,
which runs the children."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _cgroup as cg
import _diskbound as db
import _variance as var
from _common import median, print_table
from _fio import label as fio_label

if TYPE_CHECKING:
    from bench_streaming import Runner


def dig(d: dict[str, Any] | None, path: str) -> Any:
    """``dig(run, "warm.experts.hit_rate")``: None when any step is missing."""
    cur: Any = d
    for k in path.split("."):
        if not isinstance(cur, dict) or k not in cur:
            return None
        cur = cur[k]
    return cur


def median_of(runs: Sequence[dict[str, Any]], path: str) -> float | None:
    """Median of the numeric values at `path` over the runs that have one."""
    xs = [float(v) for r in runs if isinstance(v := dig(r, path), (int, float))]
    return median(xs) if xs else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def bound_fraction(tok_s: float | None, bytes_per_token: float | None,
                   disk_bytes_per_s: float | None) -> float | None:
    """Achieved decode speed over the disk-bound bound (disk B/s / bytes per token)."""
    if not tok_s or not bytes_per_token or not disk_bytes_per_s:
        return None
    return tok_s / cg.decode_bound(disk_bytes_per_s, bytes_per_token)


def fmt(x: Any, digits: int = 3) -> Any:
    """Table cell: None as '-', floats to `digits` significant digits."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    return x


# =========================================================================== child side

def add_bounds(res: dict[str, Any], disk_bytes_per_s: float | None) -> None:
    """Adds to each request of a child's result the read rate it achieved during decode and
    its decode speed as a fraction of the disk-bound bound, for the yardstick
    `disk_bytes_per_s` (B/s):
    ``bound_fraction`` from colibri's bytes_read, ``bound_fraction_io`` from the block
    layer's count (/proc/self/io, the only one llama.cpp has)."""
    res["disk_bytes_per_s"] = disk_bytes_per_s
    for p in ("cold", "warm"):
        x = res.get(p)
        if not isinstance(x, dict):
            continue
        tok_s = x.get("decode_tok_s")
        x["bound_fraction"] = bound_fraction(tok_s, x.get("bytes_read_per_token"),
                                             disk_bytes_per_s)
        x["bound_fraction_io"] = bound_fraction(tok_s, x.get("io_read_bytes_per_token"),
                                                disk_bytes_per_s)
        x["decode_read_bytes_per_s"] = (x.get("decode_io_read_bytes") or 0) / x["decode_s"]


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats of one configuration (failed children left out)."""
    s: dict[str, Any] = {"n": len(runs), "failed": sum(1 for r in runs if "error" in r)}
    ok = [r for r in runs if "error" not in r]
    for p in ("cold", "warm"):
        keys = {
            "decode_tok_s": "decode_tok_s", "prefill_tok_s": "prefill_tok_s",
            "hit_rate": "experts.hit_rate", "ready_hit_rate": "experts.ready_hit_rate",
            "prefetch_recall": "experts.prefetch_recall",
            "bytes_read_per_token": "bytes_read_per_token",
            "io_read_bytes_per_token": "io_read_bytes_per_token",
            "expert_wait_ms_per_token": "expert_wait_ms_per_token",
            "cpu_per_wall": "decode_cpu_per_wall", "bound_fraction": "bound_fraction",
            "bound_fraction_io": "bound_fraction_io",
            "decode_read_bytes_per_s": "decode_read_bytes_per_s",
            "device_busy": "device_busy", "device_read_bytes_per_s": "device_read_bytes_per_s",
            "disk_busy_ms": "breakdown.disk_busy_ms", "compute_ms": "breakdown.compute_ms",
            "neither_ms": "breakdown.neither_ms", "neither_frac": "breakdown.neither_frac",
        }
        s[p] = {k: median_of(ok, f"{p}.{v}") for k, v in keys.items()}
        s[p]["decode_spread"] = var.spread([dig(r, f"{p}.decode_tok_s") for r in ok])
    s["disk_bytes_per_s"] = median_of(ok, "disk_bytes_per_s")
    s["cgroup_peak"] = median_of(ok, "cgroup_peak")
    s["vm_hwm"] = median_of(ok, "vm_hwm")
    s["wait_policy_resolved"] = sorted({str(r.get("wait_policy")) for r in ok})
    return s


def breakdown_cell(x: dict[str, Any]) -> str:
    """The engine's per-token breakdown (_stream_child.breakdown), medians: '-' without."""
    if x.get("disk_busy_ms") is None:
        return "-"
    return (f"{x['disk_busy_ms']:.3g} / {x['compute_ms']:.3g} / {x['neither_ms']:.3g} "
            f"({100 * x['neither_frac']:.2g}%)")


def _row(label: str, s: dict[str, Any], p: str, fio_bps: float | None = None) -> list[Any]:
    x = s[p]
    gb = x["bytes_read_per_token"] if x["bytes_read_per_token"] is not None \
        else x["io_read_bytes_per_token"]
    frac = x["bound_fraction"] if x["bound_fraction"] is not None else x["bound_fraction_io"]
    resolved = [w for w in s["wait_policy_resolved"] if w.startswith("auto")]
    if resolved:
        label = f"{label} [{', '.join(resolved)}]"
    rate = x["decode_read_bytes_per_s"]
    return [label, p, var.fmt_spread(x["decode_spread"]), fmt(x["prefill_tok_s"]),
            fmt(x["ready_hit_rate"]), fmt(x["hit_rate"]), fmt(x["prefetch_recall"]),
            fmt(gb / 1e9 if gb is not None else None),
            fmt(rate / 1e9 if rate is not None else None),
            fmt(frac * 100 if frac is not None else None),
            fmt(100 * rate / fio_bps if rate and fio_bps else None),
            fmt(x["device_busy"] * 100 if x["device_busy"] is not None else None),
            fmt(x["expert_wait_ms_per_token"]), breakdown_cell(x),
            fmt(x["cpu_per_wall"]),
            fmt(s["cgroup_peak"] / 2**20 if s["cgroup_peak"] else None),
            f"{s['n'] - s['failed']}/{s['n']}"]


HEADERS = ["config", "req", "decode tok/s", "prefill tok/s", "hit in RAM",
           "hit incl. in flight", "prefetch recall",
           "GB read/tok", "GB/s read", "% of engine-path bound", "% of fio device bound",
           "disk busy %", "wait ms/tok",
           "ms/tok disk busy / compute / neither (neither %)",
           "CPU/wall", "cgroup peak MiB", "ok"]


def run_configs(r: Runner, title: str, part: str, configs: list[tuple[str, dict[str, Any]]],
                limit: int, disk_path: Path | None, chunk: int) -> None:
    """Runs each (label, spec) `--repeats` times, rounds outermost (configurations
    alternate, so drifting machine noise hits all alike). With a `disk_path` the engine's
    read path is sampled before the first child and after every child; the bound is the
    best sample of the whole run, applied to every part at the end (finish_parts)."""
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in configs}
    if disk_path and (r.bound is None or r.bound.path != str(disk_path)):
        r.disk(disk_path, chunk, f"{part}: before the first child")
    for rep in range(r.args.repeats):
        for label, spec in configs:
            res = r.child(spec, spec.get("cgroup_limit") or limit)
            if disk_path:
                res["disk_after_bytes_per_s"] = r.disk(disk_path, chunk, f"{part} {label} #{rep}")
            runs[label].append(res)
    r.doc["parts"][part] = {"title": title, "cgroup_limit": limit, "disk_bound": bool(disk_path),
                            "configs": {label: spec for label, spec in configs}, "runs": runs}
    print_part(r, part)


def print_part(r: Runner, part: str) -> None:
    """Bounds against the run's bound so far, medians and spreads, one table."""
    body = r.doc["parts"][part]
    bound = r.bound_bps() if body["disk_bound"] else None
    for rs in body["runs"].values():
        for res in rs:
            add_bounds(res, bound)
    summary = {label: summarize(rs) for label, rs in body["runs"].items()}
    body.update(summary=summary, bound_bytes_per_s=bound)
    kind = ("--yardstick-gbs" if r.yardstick else
            "best per-depth median of the sustained samples"
            if r.bound is not None and r.bound.sustained_best_gbs else "best sample")
    btxt = (f", disk bound {bound / 1e9:.2f} GB/s (engine read path, huge pages, {kind} "
            "of the run)" if bound else "")
    print(f"\n## {body['title']}\ncgroup limit {cg.fmt_bytes(body['cgroup_limit'])}{btxt}, "
          f"median (min-max) of {r.args.repeats}, load average {os.getloadavg()[0]:.1f}")
    fio = r.doc.get("fio_bound") if body["disk_bound"] else None
    fio_bps = fio["bound_gb_s"] * 1e9 if fio and fio.get("bound_gb_s") else None
    if body["disk_bound"]:
        print(f"device bound: {fio_bps / 1e9:.2f} GB/s ({fio_label(fio)}; fio)" if fio_bps
              else f"device bound: none ({(fio or {}).get('error', 'fio not run')})")
    rows = [_row(label, summary[label], p, fio_bps) for label in summary
            for p in ("cold", "warm")]
    body["table"] = print_table(HEADERS, rows)
    labels = list(summary)
    for p in ("cold", "warm"):  # each configuration against the first: rankable or not
        for other in labels[1:]:
            print(f"  {p}: " + var.verdict(other, summary[other][p]["decode_spread"],
                                           labels[0], summary[labels[0]][p]["decode_spread"]))
    r.save()


def finish_parts(r: Runner) -> None:
    """Reprints every disk-bound part against the run's final bound."""
    print(f"\n# Final: every part against the run's disk bound "
          f"{(r.bound_bps() or 0) / 1e9:.2f} GB/s")
    for part, body in r.doc["parts"].items():
        if body.get("disk_bound"):
            print_part(r, part)
    if r.bound is not None:
        for kind in ("burst", "sustained"):
            curve = r.bound.curve(kind)
            if curve:
                print(f"disk (engine read path, huge pages), {kind} samples, by reads in "
                      "flight: " + ", ".join(f"{d}: best {c['best']:.2f} median "
                                             f"{c['median']:.2f} GB/s" for d, c in curve.items()))


def _jsonable(o: Any) -> Any:
    if isinstance(o, db.DiskBound):
        return o.to_dict()
    if isinstance(o, Path):  # --base-build
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def compare_summary(r: Runner) -> None:
    """colibri against the best llama.cpp configuration (the baseline), cold and warm."""
    s = r.doc["parts"]["compare"]["summary"]
    llamas = [k for k in s if k.startswith("llama.cpp")]
    if not llamas:  # colibri-only run (--llama-variants "")
        return
    for p in ("cold", "warm"):
        best = max(llamas, key=lambda k: s[k][p]["decode_tok_s"] or 0.0)
        r.doc["parts"]["compare"][f"best_llama_{p}"] = best
        for row in ("colibri", "colibri, same GGUF", "colibri, prefetch off"):
            if row not in s:
                continue
            rt = ratio(s[row][p]["decode_tok_s"], s[best][p]["decode_tok_s"])
            key = {"colibri": "ratio_decode", "colibri, same GGUF": "ratio_decode_same_gguf"}.get(
                row, "ratio_decode_prefetch_off")
            r.doc["parts"]["compare"][f"{key}_{p}"] = rt
            print(f"{p}: " + var.verdict(row, s[row][p]["decode_spread"],
                                         f"best llama.cpp [{best}]", s[best][p]["decode_spread"]))
    r.save()


def yardstick_of(doc: dict[str, Any]) -> float | None:
    """The run's bound in B/s: the best engine-read-path sample (or --yardstick-gbs);
    for results written before DiskBound, the recorded yardstick or first disk sample."""
    docs = [b.to_dict() if isinstance(b, db.DiskBound) else b for b in doc.get("disk_bounds") or []]
    bounds = [b["bound_gb_s"] for b in docs if b.get("bound_gb_s")]
    if doc.get("yardstick"):
        return float(doc["yardstick"])
    if bounds:
        return max(bounds) * 1e9
    disk = doc.get("disk") or []
    return float(disk[0]["gb_s"]) * 1e9 if disk else None


def disk_figures(doc: dict[str, Any]) -> dict[str, float]:
    """The run's candidate yardsticks in B/s (DiskBound.figures: best and per-depth median
    of the sustained samples and of the bursts), those it has."""
    docs = [b.to_dict() if isinstance(b, db.DiskBound) else b for b in doc.get("disk_bounds") or []]
    out: dict[str, float] = {}
    for b in docs:
        for k, v in (b.get("figures") or {}).items():
            if v:
                out[k] = max(out.get(k, 0.0), float(v) * 1e9)
    fio = doc.get("fio_bound") or {}
    for d, v in (fio.get("per_depth") or {}).items():  # the device bound, per depth
        huge = "huge" if str(fio.get("buffers", "")).startswith("huge") else "4k"
        out[f"fio_depth_{d}_{huge}_pages"] = float(v["median"]) * 1e9
    # --reference-slabs: the bound by the same definition, read into another slab count
    refs = [b.to_dict() if isinstance(b, db.DiskBound) else b
            for b in doc.get("reference_bounds") or []]
    for b in refs:
        if b.get("bound_gb_s"):
            slabs = b.get("destination_slabs")
            key = ("ref_bound_1_slab_per_read" if not isinstance(slabs, int) or slabs == 0
                   else f"ref_bound_{slabs}_slabs")
            out[key] = max(out.get(key, 0.0), float(b["bound_gb_s"]) * 1e9)
    return out


def bound_table(doc: dict[str, Any]) -> dict[str, Any]:
    """Decode read rates of every disk-bound configuration of a run's JSON against its
    yardstick (and against every other figure of the disk it has), printed as a table and
    returned."""
    yard = yardstick_of(doc)
    if not yard:
        return {}
    figs = disk_figures(doc)
    out: dict[str, Any] = {"yardstick_bytes_per_s": yard, "figures_bytes_per_s": figs,
                           "configs": {}, "fractions": {}}
    rows = []
    for part, body in doc.get("parts", {}).items():
        if part in ("sweep-wait-resident", "demo") or "summary" not in body:
            continue
        for label, s in body["summary"].items():
            for p in ("cold", "warm"):
                rate = s[p].get("decode_read_bytes_per_s")
                busy = s[p].get("device_busy")
                frac = rate / yard if rate else None
                out["configs"][f"{part}/{label}/{p}"] = frac
                others = {k: rate / v if rate else None for k, v in figs.items()}
                out["fractions"][f"{part}/{label}/{p}"] = others
                rows.append([part, label, p, fmt(s[p]["decode_tok_s"]),
                             fmt(rate / 1e9 if rate else None),
                             fmt(frac * 100 if frac else None),
                             *(fmt(others[k] * 100 if others[k] else None) for k in figs),
                             fmt(busy * 100 if busy is not None else None)])
    print(f"\n## Against the engine-path bound: {yard / 1e9:.2f} GB/s (engine read path; the other "
          "figures: " + ", ".join(f"{k.replace('_', ' ')} {v / 1e9:.2f}" for k, v in figs.items())
          + " GB/s)")
    print_table(["part", "config", "req", "decode tok/s", "GB/s read", "% of engine-path bound",
                 *(f"% of {k.replace('_', ' ')}" for k in figs), "disk busy %"], rows)
    return out
