"""A seeded fuzzing campaign over the registered formats, with a file-open audit.

    cd tests && python -m fuzz.campaign --n 20000 --seed 1 [--formats gguf,native] \
        [--work DIR] [--save fuzz/regressions]

Builds the seeds (fuzz.seeds; needs torch once), then per format runs a worker
(fuzz.worker) that forks one child per mutant. When ``strace`` works here, the worker runs
under ``strace -f`` (seccomp-filtered to the open calls) and every path any child opens
for reading is checked; otherwise each child's Python audit hook and the files handed to
the core are. A read is *outside* when it resolves outside the child's model directory
and is not part of the runtime (the interpreter, the installed packages, colibri's own
files, shared libraries, and the /proc and /sys files the hardware probes read); the
decoy directory next to the model directory is always outside.

Prints one table row per format and writes the summary as JSON (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .formats import FORMATS, PLUGINS

FUZZ_DIR = Path(__file__).resolve().parent
TESTS_DIR = FUZZ_DIR.parent
REPO = TESTS_DIR.parent
KINDS = ("colibri_error", "silent_load", "other_exception", "signal", "timeout")
_OPEN = re.compile(r'^(\d+)\s+(?:open|openat|openat2)\((?:(?:AT_FDCWD|\d+)<([^>]*)>|AT_FDCWD|\d+)?'
                   r'(?:,\s*)?"([^"]*)",\s*([A-Z_|0-9]+)')  # fmt: skip
# Runtime files outside any model directory that loading a model legitimately reads.
_SYSTEM = re.compile(
    r"^/(?:proc/self/(?:cgroup|mountinfo|status|stat|maps|cmdline)|proc/(?:meminfo|cpuinfo|stat"
    r"|sys/.*)|sys/(?:fs/cgroup|devices/system/cpu|kernel/mm/transparent_hugepage)/.*"
    r"|dev/(?:null|urandom)|etc/ld\.so\.cache|etc/localtime|usr/share/zoneinfo/.*"
    r"|(?:usr/)?(?:local/)?lib(?:64|32)?/.*)$"
)


def strace_works() -> bool:
    exe = shutil.which("strace")
    if exe is None:
        return False
    try:
        r = subprocess.run([exe, "-f", "--seccomp-bpf", "-qq", "-e", "trace=openat", "-o",
                            os.devnull, "true"], capture_output=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def runtime_roots() -> tuple[str, ...]:
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sysconfig.get_paths()["stdlib"],
             sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], str(REPO)}
    roots |= {os.path.realpath(r) for r in list(roots)}
    for p in sys.path:
        if p and os.path.isdir(p):
            roots |= {os.path.abspath(p), os.path.realpath(p)}
    return tuple(sorted(r.rstrip("/") + "/" for r in roots if r))


def _decode(s: str) -> str:
    return bytes.fromhex(s.replace("\\x", "")).decode("utf-8", "surrogateescape") if s else ""


def _normal(path: str) -> str:
    path = re.sub(r"^/proc/\d+/(task/\d+/)?", "/proc/self/", path)
    return re.sub(r"^/proc/thread-self/", "/proc/self/", path)


@dataclass
class Audit:
    root: Path  # the campaign's work directory (model directory: root/m)
    roots: tuple[str, ...] = field(default_factory=runtime_roots)

    def outside(self, path: str) -> bool:
        """Whether a read of ``path`` is one no model may cause."""
        p = _normal(os.path.normpath(path))
        model = str(self.root / "m")
        if p == model or p.startswith(model + "/"):
            real = os.path.realpath(p)  # a symlink in the model directory: where it leads
            if real != p and not (real == model or real.startswith(model + "/")):
                return self.outside(real)
            return False
        root = str(self.root)
        if p.startswith(root + "/"):
            return True  # the decoys, or anything else of the campaign's
        if any(p.startswith(r) for r in self.roots):
            return False
        return not _SYSTEM.match(p)


def strace_opens(log: Path) -> dict[int, list[str]]:
    """pid -> paths opened for reading (attempts included), from an ``strace -xx -y`` log."""
    out: dict[int, list[str]] = {}
    with open(log, errors="replace") as f:
        for line in f:
            m = _OPEN.match(line)
            if m is None:
                continue
            pid, base, path, flags = int(m[1]), _decode(m[2] or ""), _decode(m[3]), m[4]
            if "O_WRONLY" in flags or "O_CREAT" in flags:
                continue
            if not path.startswith("/"):
                path = os.path.join(base or "/", path)
            out.setdefault(pid, []).append(path)
    return out


@dataclass
class FormatResult:
    name: str
    mutants: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    outside_reads: list[dict[str, Any]] = field(default_factory=list)
    bad: list[dict[str, Any]] = field(default_factory=list)  # other/signal/timeout records
    slowest_rejection_s: float = 0.0  # wall time in the child
    slowest_rejection: str = ""
    slowest_rejection_cpu_s: float = 0.0  # CPU time in the child
    slowest_rejection_cpu: str = ""
    slowest_wall_s: float = 0.0
    peak_rss_rejected_mb: float = 0.0
    peak_rss_any_mb: float = 0.0
    worker_rss_mb: float = 0.0
    seconds: float = 0.0
    audit: str = ""

    def row(self) -> str:
        c = self.counts
        return (f"{self.name:12s} {self.mutants:7d} {c['colibri_error']:8d} {c['silent_load']:7d} "
                f"{c['other_exception']:6d} {c['signal']:6d} {c['timeout']:7d} "
                f"{len(self.outside_reads):7d} {self.slowest_rejection_cpu_s * 1000:8.1f} "
                f"{self.slowest_rejection_s * 1000:9.1f} {self.peak_rss_rejected_mb:8.0f} "
                f"{self.seconds:7.1f}")  # fmt: skip


HEADER = (f"{'format':12s} {'mutants':>7s} {'rejected':>8s} {'loaded':>7s} {'other':>6s} "
          f"{'signal':>6s} {'timeout':>7s} {'outside':>7s} {'max cpu':>8s} {'max wall':>9s} "
          f"{'peak MB':>8s} {'time s':>7s}")  # fmt: skip


def _worker_cmd(name: str, seeds: Path, root: Path, n: int, start: int, seed: int,
                timeout: float, use_strace: bool, save: Path | None,
                plugins: tuple[str, ...]) -> list[str]:  # fmt: skip
    cmd = [sys.executable, "-m", "fuzz.worker", "--format", name, "--seeds", str(seeds),
           "--root", str(root), "--n", str(n), "--start", str(start), "--seed", str(seed),
           "--timeout", str(timeout), "--out", str(root / "results.jsonl")]  # fmt: skip
    for module in plugins:
        cmd += ["--plugin", module]
    if save is not None:
        cmd += ["--save", str(save)]
    if not use_strace:
        return [*cmd, "--audit"]
    return ["strace", "-f", "--seccomp-bpf", "-qq", "-xx", "-y", "-s", "4096", "-e",
            "trace=open,openat,openat2", "-e", "signal=none", "-o", str(root / "strace.log"),
            *cmd]  # fmt: skip


def run_format(name: str, seeds: Path, work: Path, n: int, seed: int, *, timeout: float = 10.0,
               use_strace: bool | None = None, save: Path | None = None, start: int = 0,
               jobs: int = 1, plugins: tuple[str, ...] | None = None) -> FormatResult:  # fmt: skip
    """One format's campaign: ``jobs`` workers (disjoint index ranges, each with its own
    model directory) under strace, or with audit hooks; outcomes classified and audited."""
    use_strace = strace_works() if use_strace is None else use_strace
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", PYTHONDONTWRITEBYTECODE="1")  # fmt: skip
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), *[p for p in sys.path if p]])
    per = -(-n // jobs)
    procs: list[tuple[Path, subprocess.Popen[bytes]]] = []
    t0 = time.perf_counter()
    for j in range(jobs):
        lo, hi = start + j * per, min(start + n, start + (j + 1) * per)
        if lo >= hi:
            break
        root = work / name / f"job{j}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        shutil.copytree(seeds / "outside", root / "outside")
        cmd = _worker_cmd(name, seeds, root, hi - lo, lo, seed, timeout, use_strace, save,
                          tuple(PLUGINS) if plugins is None else plugins)
        procs.append((root, subprocess.Popen(cmd, cwd=TESTS_DIR, env=env,
                                             stderr=subprocess.PIPE)))  # fmt: skip
    res = FormatResult(name, audit="strace" if use_strace else "audit hook")
    for root, proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"the {name} worker failed ({proc.returncode}):\n"
                               f"{err.decode(errors='replace')[-3000:]}")  # fmt: skip
        _classify(res, root, use_strace)
    res.seconds = time.perf_counter() - t0
    return res


def _classify(res: FormatResult, root: Path, use_strace: bool) -> None:
    audit = Audit(root)
    opens = strace_opens(root / "strace.log") if use_strace else {}
    for line in (root / "results.jsonl").read_text().splitlines():
        rec = json.loads(line)
        res.mutants += 1
        res.counts[rec["kind"]] += 1
        rss_mb = rec["maxrss_kb"] / 1024
        res.peak_rss_any_mb = max(res.peak_rss_any_mb, rss_mb)
        res.slowest_wall_s = max(res.slowest_wall_s, rec["wall"])
        if rec["kind"] == "colibri_error":
            res.peak_rss_rejected_mb = max(res.peak_rss_rejected_mb, rss_mb)
            what = f"#{rec['i']} {rec['desc'][:120]}: {rec['detail'][:160]}"
            if rec["seconds"] > res.slowest_rejection_s:
                res.slowest_rejection_s, res.slowest_rejection = rec["seconds"], what
            if rec["cpu"] > res.slowest_rejection_cpu_s:
                res.slowest_rejection_cpu_s, res.slowest_rejection_cpu = rec["cpu"], what
        elif rec["kind"] != "silent_load":
            res.bad.append(rec)
        paths = opens.get(rec["pid"], []) if use_strace else rec["opened"]
        bad_paths = sorted({p for p in paths if audit.outside(p)})
        if bad_paths:
            res.outside_reads.append({"i": rec["i"], "desc": rec["desc"], "paths": bad_paths[:5]})


def run_campaign(formats: list[str], n: int, seed: int, work: Path, seeds: Path,
                 **kw: Any) -> list[FormatResult]:  # fmt: skip
    return [run_format(f, seeds, work, n, seed, **kw) for f in formats]


def print_table(results: list[FormatResult]) -> None:
    print(HEADER)
    for r in results:
        print(r.row())
    for r in results:
        print(f"{r.name}: audit by {r.audit}; most CPU for a rejection "
              f"{r.slowest_rejection_cpu_s * 1000:.1f} ms ({r.slowest_rejection_cpu}); "
              f"slowest rejection {r.slowest_rejection_s * 1000:.1f} ms wall"
              f" ({r.slowest_rejection}); slowest child {r.slowest_wall_s:.2f} s wall; peak RSS "
              f"any child {r.peak_rss_any_mb:.0f} MB")  # fmt: skip
        for rec in r.bad[:10]:
            print(f"  {rec['kind']} #{rec['i']} {rec['desc'][:100]}: {rec['error']} "
                  f"{rec['detail'][-300:]}")  # fmt: skip
        for rec in r.outside_reads[:10]:
            print(f"  outside read #{rec['i']} {rec['desc'][:100]}: {rec['paths']}")


def main(argv: list[str] | None = None) -> int:
    import importlib

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--formats", default="")
    ap.add_argument("--plugin", action="append", default=[], help="module registering formats")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--seeds", type=Path, help="prebuilt seeds (default: build in --work)")
    ap.add_argument("--save", type=Path, help="copy failing mutants here")
    ap.add_argument("--no-strace", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="workers per format, in parallel")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    for module in args.plugin:
        importlib.import_module(module)
    PLUGINS.extend(m for m in args.plugin if m not in PLUGINS)
    formats = args.formats.split(",") if args.formats else list(FORMATS)
    work = args.work or Path(tempfile.mkdtemp(prefix="colibri-fuzz-"))
    seeds = args.seeds
    if seeds is None:
        seeds = work / "seeds"
        subprocess.run([sys.executable, "-m", "fuzz.seeds", str(seeds)], cwd=TESTS_DIR,
                       check=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                           [str(TESTS_DIR), *[p for p in sys.path if p]])))  # fmt: skip
    results = run_campaign(formats, args.n, args.seed, work, seeds,
                           timeout=args.timeout, use_strace=False if args.no_strace else None,
                           save=args.save, start=args.start, jobs=args.jobs)  # fmt: skip
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    bad = sum(len(r.bad) + len(r.outside_reads) for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
