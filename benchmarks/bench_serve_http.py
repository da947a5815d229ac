"""Serving under concurrency over HTTP: colibri's server beside llama-cpp-python's.

Each server runs as its own subprocess (optionally in a memory cgroup of ``--cgroup-frac``
of the GGUF's size, page cache dropped first: benchmarks/_cgroup.py) on the same GGUF
with the same threads. For each concurrency C in ``--levels``, C client threads each send
``--requests`` streamed ``POST /v1/completions`` (greedy, ``max_tokens`` =
``min_tokens`` = ``--max-tokens`` so none ends early, prompts of mixed lengths), one after
the other. Per level:

- aggregate tok/s: all generated tokens / the level's wall time;
- per-request tok/s: median over requests of tokens / (request sent -> last token), queue
  wait and prefill included; first-to-last tok/s: median of (tokens - 1) / (last token -
  first token), the decode rate as the client sees it (meaningless where a server sends
  its chunks in bursts: llama-cpp-python's stream of a lone request arrives nearly whole);
- TTFT p50/p95: request sent to first streamed chunk (queue wait and prefill included);
- MiB read per generated token: the server process' ``read_bytes`` (/proc/PID/io: what
  came from the disk, O_DIRECT or page faults alike) over the level, per token;
- colibri only: rows per batched step (``colibri_batch_rows_total / _steps_total``).

The engines alternate (colibri, llama, then llama, colibri ... per repeat) and so do the
levels (1 2 4 8, then 8 4 2 1); the load average is recorded around each level.
llama-cpp-python's server runs with its defaults (one llama context, requests served
one at a time). Needs llama-cpp-python with its server extras (starlette-context,
pydantic-settings, sse-starlette) for ``--engines llama``.

    PYTHONPATH=python:build/dev/NAME python benchmarks/bench_serve_http.py --model smollm2
    ... --model synthetic-small --cgroup-frac 0.25      # streamed (root: cgroup, drop_caches)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import _cgroup as cg
from _common import conditions, print_table, write_result

WORDS = ("the quick brown fox jumps over the lazy dog while a small bird sings in the "
         "old tree near the river and the sun goes down behind the hills").split()


def prompt(i: int, words: int) -> str:
    n = 3 + (i * 7) % (words - 2)  # mixed lengths, 3..words words
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n))


def model_path(name: str) -> Path:
    if name == "smollm2":
        from realmodel import smollm2_gguf

        return smollm2_gguf()
    if name.startswith("synthetic-"):
        from synthetic_moe import ensure_preset

        return Path(ensure_preset(name.removeprefix("synthetic-")))
    return Path(name)


_NO_REPACK = """
import runpy, sys
import llama_cpp.llama_cpp as low
default = low.llama_model_default_params
def no_repack():
    p = default()
    p.use_extra_bufts = False
    return p
low.llama_model_default_params = no_repack
sys.argv[0] = "llama_cpp.server"
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One server subprocess (in a cgroup when `limit` is set)."""

    def __init__(self, engine: str, path: Path, args: argparse.Namespace, limit: int | None,
                 ) -> None:
        self.engine = engine
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        py = sys.executable
        if engine == "colibri":
            cmd = [py, "-m", "colibri", "serve", str(path), "--port", str(self.port), "-q",
                   "-c", str(args.ctx), "-t", str(args.threads), "--parallel",
                   str(args.parallel), "--max-queue", "64"]
            if limit is not None:
                cmd += ["--ram-budget", str(limit - args.margin_mib * 2**20)]
            cmd += args.colibri_flag
        else:
            # Streamed (a cgroup): no repacked copy of the weights (use_extra_bufts=False,
            # as benchmarks/_stream_child.py) and no mlock, or the weights would be
            # anonymous memory, 4x the cgroup; resident: llama-cpp-python's defaults.
            launcher = [py, "-c", _NO_REPACK] if limit is not None else [py, "-m",
                                                                        "llama_cpp.server"]
            cmd = [*launcher, "--model", str(path), "--port",
                   str(self.port), "--n_ctx", str(args.ctx), "--n_threads", str(args.threads),
                   "--n_threads_batch", str(args.threads), "--verbose", "False",
                   # Its default True cuts a running stream when the next request arrives.
                   "--interrupt_requests", "False"]
            if limit is not None:
                cmd += ["--use_mlock", "False"]
        self.group: cg.MemoryCgroup | None = None
        preexec = None
        if limit is not None:
            cg.drop_caches()
            self.group = cg.MemoryCgroup(f"serve-{engine}", limit)
            self.group.create()
            procs = str(self.group.path / "cgroup.procs")

            def preexec() -> None:  # joins the cgroup between fork and exec
                fd = os.open(procs, os.O_WRONLY)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{engine} server exited: {self.log.read()[-3000:]}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"{engine} server did not start")

    def read_bytes(self) -> int:
        text = Path(f"/proc/{self.proc.pid}/io").read_text()
        return int(re.search(r"^read_bytes: (\d+)", text, re.M).group(1))  # type: ignore[union-attr]

    def metrics(self) -> dict[str, float]:
        if self.engine != "colibri":
            return {}
        text = httpx.get(self.url + "/metrics", timeout=30).text
        return {m.group(1): float(m.group(2))
                for m in re.finditer(r"^(colibri_\w+) (\S+)$", text, re.M)}

    def stop(self) -> dict[str, Any]:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        out: dict[str, Any] = {}
        if self.group is not None:
            out = {"cgroup_limit": self.group.limit_bytes, "cgroup_peak": self.group.peak_bytes(),
                   "oom_kills": self.group.oom_kills()}
            self.group.remove()
        return out


def one_request(url: str, model: str, text: str, max_tokens: int) -> dict[str, float]:
    body = {"model": model, "prompt": text, "max_tokens": max_tokens, "min_tokens": max_tokens,
            "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    times: list[float] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            d = json.loads(line[6:])
            if "error" in d:
                raise RuntimeError(d["error"])
            if d.get("choices"):
                times.append(time.perf_counter())
    if not times:
        raise RuntimeError("no tokens")
    # min_tokens = max_tokens: exactly max_tokens tokens (chunks are not tokens: llama.cpp's
    # server ends with an empty chunk carrying the finish reason).
    return {"ttft": times[0] - t0, "tokens": max_tokens, "e2e_tok_s": max_tokens / (times[-1] - t0),
            "tok_s": (max_tokens - 1) / (times[-1] - times[0]) if times[-1] > times[0] else 0.0}


def run_level(server: Server, model: str, conc: int, args: argparse.Namespace,
              ) -> dict[str, Any]:
    load0 = conditions()["load_average"]
    m0, r0 = server.metrics(), server.read_bytes()
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(conc) as pool:
        def stream(i: int) -> list[dict[str, float]]:
            return [one_request(server.url, model, prompt(i * 31 + j, args.prompt_words),
                                args.max_tokens) for j in range(args.requests)]

        futs = [pool.submit(stream, i) for i in range(conc)]
        reqs = [r for f in futs for r in f.result()]
    wall = time.perf_counter() - t0
    m1, r1 = server.metrics(), server.read_bytes()
    tokens = sum(int(r["tokens"]) for r in reqs)
    ttft = sorted(r["ttft"] for r in reqs)
    out: dict[str, Any] = {
        "concurrency": conc, "requests": len(reqs), "tokens": tokens, "wall_s": wall,
        "aggregate_tok_s": tokens / wall,
        "per_request_tok_s": statistics.median(r["tok_s"] for r in reqs),
        "per_request_e2e_tok_s": statistics.median(r["e2e_tok_s"] for r in reqs),
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p95_s": ttft[min(len(ttft) - 1, round(0.95 * (len(ttft) - 1)))],
        "read_mib_per_token": (r1 - r0) / tokens / 2**20,
        "load_before": load0, "load_after": conditions()["load_average"],
    }
    if m1:
        steps = m1["colibri_batch_steps_total"] - m0["colibri_batch_steps_total"]
        rows = m1["colibri_batch_rows_total"] - m0["colibri_batch_rows_total"]
        out["rows_per_step"] = rows / steps if steps else 1.0
        out["expert_mib_per_token"] = (m1["colibri_expert_bytes_read_total"]
                                       - m0["colibri_expert_bytes_read_total"]) / tokens / 2**20
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2",
                    help="smollm2, synthetic-PRESET (benchmarks/synthetic_moe.py) or a GGUF path")
    ap.add_argument("--engines", nargs="+", default=["colibri", "llama"],
                    choices=["colibri", "llama"])
    ap.add_argument("--levels", nargs="+", type=int, default=[1, 2, 4, 8])
    ap.add_argument("--requests", type=int, default=1, help="per stream (default 1)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--prompt-words", type=int, default=45,
                    help="prompts of 3..N words (default 45)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="colibri --parallel")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--cgroup-frac", type=float, default=None,
                    help="memory cgroup limit as a fraction of the GGUF (both engines)")
    ap.add_argument("--margin-mib", type=int, default=160,
                    help="colibri --ram-budget = cgroup limit - this (interpreter, libraries)")
    ap.add_argument("--colibri-flag", action="append", default=[],
                    help="extra colibri serve flag (repeatable: --colibri-flag=--io-workers=4)")
    args = ap.parse_args()
    path = model_path(args.model)
    limit = int(path.stat().st_size * args.cgroup_frac) if args.cgroup_frac else None
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    servers: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        engines = args.engines if rep % 2 == 0 else list(reversed(args.engines))
        for engine in engines:
            server = Server(engine, path, args, limit)
            name = "smollm2" if engine == "llama" else path.name
            try:
                order = args.levels if rep % 2 == 0 else list(reversed(args.levels))
                for c in order:
                    res = run_level(server, name if engine == "colibri" else "x", c, args)
                    runs.setdefault((engine, c), []).append(res)
                    print(f"{engine} C={c}: {res['aggregate_tok_s']:.3g} tok/s, rows/step "
                          f"{res.get('rows_per_step', '-')}", file=sys.stderr, flush=True)
            finally:
                servers.append({"engine": engine, "repeat": rep, **server.stop()})
    results = []
    for (engine, c), rs in sorted(runs.items()):
        keys = ["aggregate_tok_s", "per_request_tok_s", "per_request_e2e_tok_s", "ttft_p50_s",
                "ttft_p95_s",
                "read_mib_per_token"] + (["rows_per_step", "expert_mib_per_token"]
                                         if engine == "colibri" else [])
        med = {k: statistics.median(r[k] for r in rs) for k in keys}
        results.append({"engine": engine, "concurrency": c, **med, "runs": rs})
    rows = [(r["engine"], r["concurrency"], r["aggregate_tok_s"], r["per_request_e2e_tok_s"],
             r["per_request_tok_s"], r["ttft_p50_s"], r["ttft_p95_s"], r.get("rows_per_step", "-"),
             r["read_mib_per_token"]) for r in results]
    print_table(["engine", "streams", "aggregate tok/s", "per-request tok/s",
                 "first-to-last tok/s", "TTFT p50 s",
                 "TTFT p95 s", "rows/step", "MiB read/token"], rows)
    out = write_result("serve_http", {"args": {**vars(args), "model_path": str(path)},
                                      "cgroup_limit": limit, "servers": servers,
                                      "results": results})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
