"""Are two builds of the core bit-identical on a real model? Runs SmolLM2-135M-Instruct Q4_1
(benchmarks/bench_smollm2.py's file) in each build: a chat prompt, then forwards of 1, 2, 5,
9, 16, 17 and 33 tokens after it with every position's logits (prefill chunks and
speculative verifies), at 1 and 2 threads; compares the logits bit for bit.

    .venv/bin/python scripts/compare_builds.py build/dev/main build/dev/kern

A kernel change that claims "the same operations in the same order" should print
"identical"; exits 1 otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SIZES = (1, 2, 5, 9, 16, 17, 33)


def child(out: str) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import colibri
    from bench_smollm2 import smollm2_path

    res: dict[str, np.ndarray] = {}
    for threads in (1, 2):
        model = colibri.Model.load(smollm2_path(),
                                   engine=colibri.EngineConfig(threads={"n": threads}))
        ids = model.apply_chat_template("Write a short story about a lighthouse keeper.",
                                        tokenize=True)
        s = model.session()
        res[f"t{threads}_prompt"] = np.array(s.forward(ids, all_logits=True))
        for n in SIZES:
            res[f"t{threads}_n{n}"] = np.array(
                s.forward([100 + 3 * i for i in range(n)], all_logits=True))
            s.rollback(n)
    np.savez(out, **res)  # type: ignore[arg-type]


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return 0
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        outs = []
        for i, build in enumerate(sys.argv[1:]):
            out = os.path.join(tmp, f"{i}.npz")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "python"), build]))
            subprocess.run([sys.executable, __file__, "--child", out], env=env, check=True)
            outs.append(np.load(out))
        a, b = outs
        differ = [k for k in a.files
                  if a[k].shape != b[k].shape or not np.array_equal(a[k].view(np.uint32),
                                                                    b[k].view(np.uint32))]
        print("identical" if not differ else f"DIFFERENT: {differ}",
              f"({len(a.files)} logit arrays)")
        return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
