"""Mutation checks of issue 16 (docs/testing.md): apply a named mutation to the working
tree, run tests, revert. Never commit while one is applied (the script reverts in
``finally``; check ``git status`` if it was killed).

    scripts/mutate.py NAME[+NAME...] [--old REV:FILE ...] PYTEST-ARGS...

C++ mutations are compiled into build/dev/mut/ (``./dev-build.sh mut``; another name with
COLIBRI_MUT_BUILD=NAME), not into your own build. ``--old
REV:FILE`` puts ``git show REV:tests/FILE`` next to the current tests as
``tests/_old_FILE`` for the run (deleted afterwards), to run the suite as it was before on
the same mutated core; name it in the pytest arguments as ``tests/_old_FILE``. Test models
built under a mutation of tests/support/modelfactory.py go to a private cache
(build/test-models-mut/NAME), so they never reach the normal one.

Output: one line per run with pytest's summary, then the failing tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Your own build is never mutated unless you name it (then the script rebuilds it after
# reverting): the first run in build/dev/mut compiles everything.
BUILD_NAME = os.environ.get("COLIBRI_MUT_BUILD", "mut")
BUILD = ROOT / "build" / "dev" / BUILD_NAME
EVERY = "every"  # the pattern may occur more than once: replace each

# Q8_1's s = d * sum(q) with d rounded to fp16 first (ggml keeps the float d)
_S_FP16 = ("static_cast<float>(sum) * d);", "static_cast<float>(sum) * fp16_to_fp32(b[i].d));")
_KERNELS = ("csrc/quant/kernels_avx2.cpp", "csrc/quant/kernels_avx512.cpp",
            "csrc/quant/kernels_neon.cpp", "csrc/quant/reference.cpp")  # fmt: skip

# name -> [(file, text, replacement[, EVERY])]
MUTATIONS: dict[str, list[tuple[str, ...]]] = {
    # item 1: the forward pass
    "eps-1e-5": [("python/colibri/engine/core_spec.py", "spec.rms_norm_eps = cfg.rms_norm_eps",
                  "spec.rms_norm_eps = 1e-5")],
    "eps-0": [("python/colibri/engine/core_spec.py", "spec.rms_norm_eps = cfg.rms_norm_eps",
               "spec.rms_norm_eps = 0.0")],
    "rope-missing-2": [("python/colibri/engine/rope.py",
                        "exponents = np.arange(0, dim, 2, dtype=np.int64)",
                        "exponents = np.arange(0, dim // 2, dtype=np.int64)")],
    "gate-up-swapped": [("csrc/model/ffn_block.cpp", "const WeightView w[2] = {e.gate, e.up};",
                         "const WeightView w[2] = {e.up, e.gate};")],
    "expert-weights-reversed": [("csrc/model/ffn_block.cpp",
                                 "weight[static_cast<std::size_t>(t * k + j)], d);",
                                 "weight[static_cast<std::size_t>(t * k + (k - 1 - j))], d);")],
    "no-shared-expert-gate": [("csrc/model/ffn_block.cpp", "if (W.shared_gate) {",
                               "if (false && W.shared_gate) {")],
    # item 2: a convention shared by colibri's GGUF reader and tests/support/modelfactory.py's
    # writer
    # (apply as reader+writer, e.g. gguf-reader-gate-up+writer-gate-up)
    "gguf-reader-gate-up": [(
        "python/colibri/sources/gguf_source.py", 'nm = f"{m.group(1)}.{e}"',
        "nm = f\"{m.group(1).replace('ffn_gate_', 'ffn_X_').replace('ffn_up_', 'ffn_gate_')"
        ".replace('ffn_X_', 'ffn_up_')}.{e}\"")],
    "writer-gate-up": [(
        "tests/support/modelfactory.py", "bid, xid, w = int(parts[2]), int(parts[-3]), parts[-2]",
        'bid, xid, w = int(parts[2]), int(parts[-3]), {"gate_proj": "up_proj", "up_proj": '
        '"gate_proj", "w1": "w3", "w3": "w1"}.get(parts[-2], parts[-2])', EVERY)],
    "gguf-reader-expert-axis": [("python/colibri/sources/gguf_source.py",
                                 'nm = f"{m.group(1)}.{e}"', 'nm = f"{m.group(1)}.{n_e - 1 - e}"')],
    "writer-expert-axis": [
        ("tests/support/modelfactory.py", "stacked = np.stack([per[x] for x in range(n_exp)])",
         "stacked = np.stack([per[x] for x in range(n_exp - 1, -1, -1)])"),
        ("tests/support/modelfactory.py", "val = tensors[gname][0][xid] if xid >= 0",
         "val = tensors[gname][0][::-1][xid] if xid >= 0"),
    ],
    # item 3: the int8 path of Q4_1 (Q8_1 activations), in every kernel alike
    "q8_1-s-from-fp16-d": [(f, *_S_FP16) for f in _KERNELS],
    # item 6: a prefetch of layer >= 4 reads the next expert's bytes into expert k's slot
    # (the tiny and synthetic models have 2-4 layers, the demo MoE 30)
    "prefetch-next-expert-deep-layers": [(
        "csrc/model/expert_store.cpp", "    start_read(s, k, true);",
        "    start_read(s, k / n_experts_ >= 4 ? k - k % n_experts_ + (k + 1) % n_experts_ : k,"
        " true);")],
    # issue 40: the DSA indexer keeps one key fewer / one more than index_topk
    "dsa-topk-minus-1": [("csrc/model/dsa_indexer.cpp", "topk = s.index_topk;",
                          "topk = s.index_topk - 1;")],
    "dsa-topk-plus-1": [("csrc/model/dsa_indexer.cpp", "topk = s.index_topk;",
                         "topk = s.index_topk + 1;")],
    # issue 32: DeepSeek-V4's sliding attention keeps the values' rotation (not undone at
    # the query's position); its hyper-connections mix with one Sinkhorn round, or with the
    # mixing matrix transposed
    "v4-output-rope-kept": [("csrc/model/attn_v4.cpp",
                             "ws.rope[static_cast<std::size_t>(2 * i + 1)] *= -1.0f;",
                             "ws.rope[static_cast<std::size_t>(2 * i + 1)] *= 1.0f;")],
    "hc-one-sinkhorn-round": [("csrc/model/hyper_conn.cpp",
                               "for (int64_t it = 1; it < s.hc_sinkhorn_iters; ++it) {",
                               "for (int64_t it = 1; it < 1; ++it) {")],
    "hc-comb-transposed": [("csrc/model/hyper_conn.cpp",
                            "acc += comb[j * hc + k] * st[j * d + i];",
                            "acc += comb[k * hc + j] * st[j * d + i];")],
}


# Old test files run beside today's helpers; where a helper's signature changed since, the
# call is adapted here (the assertions stay as they were).
OLD_ADAPT: dict[str, list[tuple[str, str]]] = {
    # budget_for_slots sizes the work buffers for the activation precision (int8 since the
    # int8 path's buffers were added); the old call predates the argument.
    "test_streaming.py": [("budget_for_slots(demo_moe, slots, threads=2)",
                           'budget_for_slots(demo_moe, slots, threads=2, precision="int8")')],
    # The KV cache stored float32 then; the default ("auto") is now F16 for quantized
    # weights with int8 activations, which moves these files' int8 logits.
    "test_smollm2.py": [("activation_precision=activations)",
                         'activation_precision=activations, kv_cache_type="f32")')],
    "test_oracle_gguf.py": [("colibri.EngineConfig(context_length=128)",
                             'colibri.EngineConfig(context_length=128, kv_cache_type="f32")')],
}


def build() -> None:
    b = subprocess.run([str(ROOT / "dev-build.sh"), BUILD_NAME], capture_output=True, text=True)
    assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]


def main(argv: list[str]) -> int:
    # timeout(1) and kill send SIGTERM: exit through `finally`, so the code is reverted
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    name, rest = argv[0], argv[1:]
    old: list[tuple[str, str]] = []
    while len(rest) >= 2 and rest[0] == "--old":
        rev, _, file = rest[1].partition(":")
        old.append((rev, file))
        rest = rest[2:]
    muts = [m for n in name.split("+") for m in MUTATIONS[n]] if name != "none" else []
    backups: dict[Path, str] = {}
    extra: list[Path] = []
    try:
        for mut in muts:
            path, text, new = ROOT / mut[0], mut[1], mut[2]
            backups.setdefault(path, path.read_text())
            s = path.read_text()
            n = s.count(text)
            assert n == 1 or (EVERY in mut and n >= 1), (mut[0], text, n)
            path.write_text(s.replace(text, new))
        for rev, file in old:
            dst = ROOT / "tests" / f"_old_{Path(file).name}"
            text = subprocess.run(["git", "show", f"{rev}:tests/{file}"], cwd=ROOT,
                                  capture_output=True, text=True, check=True).stdout
            for was, now in OLD_ADAPT.get(file, []):
                text = text.replace(was, now)
            dst.write_text(text)
            extra.append(dst)
        cpp = any(m[0].startswith("csrc/") for m in muts)
        if cpp or not (BUILD / "colibri").is_dir():
            build()
        # Files of an old revision import the test helpers by their flat names (before
        # tests/support/ existed).
        support = ":tests/support" if old else ""
        env = dict(os.environ, PYTHONPATH=f"python:{BUILD}{support}")
        if any(m[0].startswith("tests/") for m in muts):
            env["COLIBRI_TEST_MODELS"] = str(ROOT / "build" / "test-models-mut" / name)
        r = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "pytest", "-q",
                            "--tb=no", "-rf", "-p", "no:cacheprovider", *rest],
                           cwd=ROOT, env=env, capture_output=True, text=True)  # fmt: skip
        lines = r.stdout.splitlines()
        print(f"== {name}: {lines[-1] if lines else r.stderr[-500:]}", flush=True)
        for line in lines:
            if line.startswith(("FAILED", "ERROR")):
                print("   ", line.split(" - ")[0], flush=True)
        return r.returncode
    finally:
        for path, text in backups.items():
            path.write_text(text)
        for path in extra:
            path.unlink(missing_ok=True)
        if any(m[0].startswith("csrc/") for m in muts):
            build()  # the build holds the reverted code again


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
