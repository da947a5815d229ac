"""Placement and scheduling never change tokens: logits are bit-identical across runs,
team sizes and wait policies (placement changes speed, never tokens: docs/architecture.md)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import colibri
from colibri.settings.config import EngineConfig, ThreadConfig
from support.realmodel import smollm2_gguf

# A real prompt's worth of ids (any in-vocabulary ids would do: the property is exactness).
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
          411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2]


def _run(model: colibri.Model, n_decode: int = 8) -> tuple[np.ndarray, list[np.ndarray]]:
    s = model.session()
    prefill = s.forward(PROMPT, all_logits=True)
    steps = []
    logits = prefill[-1]
    for _ in range(n_decode):
        logits = s.forward([int(np.argmax(logits))])
        steps.append(logits.copy())
    return prefill, steps


@pytest.fixture(scope="module")
def smollm2() -> colibri.Model:
    return colibri.Model.load(
        smollm2_gguf(), engine=EngineConfig(threads=ThreadConfig(n=1), context_length=256)
    )


def test_bit_identical_across_runs_threads_and_policies(smollm2: colibri.Model) -> None:
    reference = _run(smollm2)
    again = _run(smollm2)
    np.testing.assert_array_equal(reference[0], again[0])
    for policy in ("spin", "passive", "hybrid"):
        for n in (1, 2):
            smollm2.set_threads(ThreadConfig(n=n, wait_policy=policy))
            prefill, steps = _run(smollm2)
            np.testing.assert_array_equal(prefill, reference[0], err_msg=f"{policy}, {n} threads")
            for a, b in zip(steps, reference[1], strict=True):
                np.testing.assert_array_equal(a, b, err_msg=f"{policy}, {n} threads")


def test_prefill_equals_token_by_token(smollm2: colibri.Model) -> None:
    """Batching is placement too: the batched prompt and one-token-at-a-time decoding take
    different kernel paths (matrix-matrix vs matrix-vector), and must agree closely."""
    smollm2.set_threads(ThreadConfig(n=2))
    batched = smollm2.session().forward(PROMPT, all_logits=True)
    s = smollm2.session()
    single = np.stack([s.forward([t]) for t in PROMPT])
    # Same per-row kernels and reduction order: the only difference allowed is none.
    np.testing.assert_array_equal(batched, single)


# A long prompt of real-looking ids: the default chunk (512) splits it in two.
LONG_PROMPT = (PROMPT * 19)[:600]


def _prefill_then_decode(path: object, chunk: int | None, prompt: list[int]
                         ) -> tuple[np.ndarray, list[np.ndarray], list[tuple[int, int]]]:
    model = colibri.Model.load(path, engine=EngineConfig(  # type: ignore[arg-type]
        threads=ThreadConfig(n=2), context_length=1024, prefill_chunk=chunk))
    calls: list[tuple[int, int]] = []
    s = model.session()
    logits = s.forward(prompt, all_logits=True, progress=lambda d, t: calls.append((d, t)))
    steps = [s.forward([int(np.argmax(logits[-1]))])]
    for _ in range(3):
        steps.append(s.forward([int(np.argmax(steps[-1]))]))
    model.close()
    return logits, steps, calls


@pytest.mark.parametrize(("chunk", "prompt"), [(1, PROMPT), (5, PROMPT), (512, LONG_PROMPT),
                                               (37, LONG_PROMPT)],
                         ids=["1-short", "5-short", "512-long", "37-long"])
def test_chunked_prefill_equals_one_batch(chunk: int, prompt: list[int]) -> None:
    """A prompt fed in chunks (EngineConfig.prefill_chunk) gives every position's logits,
    and the decode after it, bit-identical to the whole prompt in one batch."""
    path = smollm2_gguf()
    whole, whole_steps, whole_calls = _prefill_then_decode(path, None, prompt)
    assert whole_calls == [(len(prompt), len(prompt))]
    chunked, steps, calls = _prefill_then_decode(path, chunk, prompt)
    np.testing.assert_array_equal(chunked, whole)
    for a, b in zip(steps, whole_steps, strict=True):
        np.testing.assert_array_equal(a, b)
    n = len(prompt)
    assert calls == [(min(d, n), n) for d in range(chunk, n + chunk, chunk)]


# --- long context: the attention kernels' fixed key blocks and chunks ------------------------

LONG = 1536  # six key chunks of 256: decode splits them over the team and merges in order


@pytest.mark.parametrize("kv_type", ["f32", "f16", "bf16", "q8_0"])
def test_long_context_bit_identical(kv_type: str) -> None:
    """At 1.5k positions, for every KV type: 1 vs 2 threads, one batch vs chunks of the
    prompt, and one batch vs token-by-token decoding (from the start, and after a long
    batched prefix) give the same bits."""
    ids = [int(x) for x in np.random.default_rng(7).integers(3, 49152, LONG)]
    m = colibri.Model.load(smollm2_gguf(), engine=EngineConfig(
        threads=ThreadConfig(n=1), context_length=LONG, kv_cache_type=kv_type))
    ref = m.session().forward(ids, all_logits=True)
    m.set_threads(ThreadConfig(n=2))
    np.testing.assert_array_equal(m.session().forward(ids, all_logits=True), ref,
                                  err_msg="2 threads")
    s = m.session()
    cuts = [0, 300, 556, 557, 1200, LONG]  # across chunk and block boundaries
    for a, b in itertools.pairwise(cuts):
        np.testing.assert_array_equal(s.forward(ids[a:b], all_logits=True), ref[a:b],
                                      err_msg=f"chunk [{a}, {b})")
    s = m.session()
    for t in range(300):  # token by token from the start: chunk 0 and 1
        np.testing.assert_array_equal(s.forward([ids[t]]), ref[t], err_msg=f"token {t}")
    s = m.session()
    s.forward(ids[:1300])
    for t in range(1300, LONG):  # decode at long context: six chunks merged in order
        np.testing.assert_array_equal(s.forward([ids[t]]), ref[t], err_msg=f"token {t}")
