"""The prompt cache: time to first token of the next chat turn after a ~2k-token history,
with the cache (the history's KV reused) and without (the whole prompt prefilled), in one
process, alternating which goes first, median of the repeats.

    python benchmarks/bench_prompt_cache.py --threads 2 --repeats 5 --history 2048

Both models are SmolLM2-135M-Instruct Q4_1 with the same settings; the cached one has
EngineConfig(prompt_cache=...). Before each cached measurement the cache is cleared and
given what the previous turn would have left in it: the history's KV (copied from a
session that prefilled it once, untimed).
Writes JSON to benchmarks/results/ (commit, machine, CPU flags, load averages).
"""

from __future__ import annotations

import argparse
import os
import time

import colibri as co
from _common import median, print_table, write_result

PARAGRAPH = (
    "The river ran along the old town wall, past the mill and the market square, where "
    "merchants sold apples, cloth and copper pots every morning. "
)


def history_of(model: co.Model, tokens: int) -> list[dict[str, str]]:
    """A conversation of alternating turns whose template holds about `tokens` tokens."""
    msgs = [{"role": "system", "content": "You are a patient storyteller."}]
    i = 0
    while model.count_tokens(messages=msgs) < tokens:
        msgs.append({"role": "user", "content": f"Part {i}: go on. " + PARAGRAPH * 2})
        msgs.append({"role": "assistant", "content": PARAGRAPH * 3})
        i += 1
    return msgs


def ttft(model: co.Model, msgs: list[dict[str, str]]) -> tuple[float, int, int]:
    """Seconds to the first generated token, prompt tokens prefilled, tokens reused."""
    t0 = time.perf_counter()
    stream = model.stream(messages=msgs, max_tokens=8)
    next(stream)
    first = time.perf_counter() - t0
    for _ in stream:
        pass
    last = model.stats().last
    assert last is not None
    return first, last.prompt_tokens, last.cached_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--history", type=int, default=2048, help="history tokens (template)")
    args = ap.parse_args()
    engine = co.EngineConfig(threads=co.ThreadConfig(n=args.threads), context_length=4096)
    plain = co.Model.load("smollm2", engine=engine)
    cached = co.Model.load("smollm2", engine=engine.replace(prompt_cache="512MiB"))
    before = history_of(plain, args.history)
    turn = [*before, {"role": "user", "content": "How does the story end?"}]
    previous = cached.session()
    previous.forward(cached.encode_prompt(messages=before))
    load0 = os.getloadavg()
    rows: dict[str, list[float]] = {"no cache": [], "prompt cache": []}
    info: dict[str, tuple[int, int]] = {}
    for r in range(args.repeats):
        order = ["no cache", "prompt cache"] if r % 2 == 0 else ["prompt cache", "no cache"]
        for name in order:
            if name == "prompt cache":
                # What the previous turn left in the cache: the history's KV (a copy of a
                # session that prefilled it once, untimed).
                cached.prompt_cache.clear()
                cached.prompt_cache.put(previous.fork())
                t, n, reused = ttft(cached, turn)
            else:
                t, n, reused = ttft(plain, turn)
            rows[name].append(t)
            info[name] = (n, reused)
    load1 = os.getloadavg()
    base = median(rows["no cache"])
    table = [[name, info[name][0], info[name][1], median(ts), min(ts), max(ts),
              base / median(ts)] for name, ts in rows.items()]
    print_table(["run", "prefilled", "reused", "TTFT median s", "min s", "max s", "speedup"],
                table)
    print(f"load average before {load0}, after {load1}")
    path = write_result("bench_prompt_cache", {
        "settings": vars(args), "history_tokens": plain.count_tokens(messages=turn),
        "ttft_seconds": rows, "prefilled_reused": info, "loadavg": [load0, load1],
        "speedup_median": base / median(rows["prompt cache"]),
    })  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
