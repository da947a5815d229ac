"""The campaign's worker process: imports colibri once, then makes each mutant and runs
it in a forked child (harness.run_in_child). One JSON line per mutant on --out.

    python -m fuzz.worker --format gguf --seeds SEEDS --root ROOT --n 300 --seed 1 \
        --out results.jsonl [--start 0] [--timeout 10] [--audit] [--save DIR]

ROOT/m is the model directory each mutant is written to (and ROOT/outside the decoys);
every mutant's random choices come from (seed, format, index) alone, so one mutant is
rebuilt with --start i --n 1. Mutants that end in another exception, a signal or a
timeout are copied to --save.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import shutil
import sys
from pathlib import Path

from . import harness
from .formats import FORMATS

BAD = ("other_exception", "signal", "timeout")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--format", required=True)
    ap.add_argument("--seeds", type=Path, required=True)
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--mem-cap-gib", type=float, default=2.0)
    ap.add_argument("--audit", action="store_true", help="Python audit hook (no strace)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--save", type=Path)
    ap.add_argument("--plugin", action="append", default=[], help="module registering formats")
    args = ap.parse_args(argv)
    for module in args.plugin:
        importlib.import_module(module)
    fmt = FORMATS[args.format]
    import colibri  # noqa: F401 - imported once, before any fork

    model_dir = args.root / "m"
    cap = harness.vm_size_bytes() + int(args.mem_cap_gib * 2**30)
    with open(args.out, "a") as out:
        for i in range(args.start, args.start + args.n):
            rng = random.Random(f"{args.seed}/{args.format}/{i}")
            shutil.rmtree(model_dir, ignore_errors=True)
            model_dir.mkdir(parents=True)
            try:
                entry, desc = fmt.mutate(rng, args.seeds, model_dir)
            except Exception as exc:  # a mutator bug must not end the campaign: logged
                print(f"mutator failed on #{i}: {exc!r}", file=sys.stderr)
                continue
            o = harness.run_in_child(fmt.action, (entry, i), timeout=args.timeout,
                                     mem_cap=cap, audit=args.audit)  # fmt: skip
            rec = {"format": args.format, "i": i, "desc": desc, **o.to_dict()}
            out.write(json.dumps(rec) + "\n")
            out.flush()
            if o.kind in BAD and args.save is not None:
                dst = args.save / f"{args.format}-{args.seed}-{i}"
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(model_dir, dst, symlinks=True)
                entry_name = "." if entry == model_dir else entry.name
                (dst / "MUTANT.json").write_text(json.dumps({**rec, "entry": entry_name}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
