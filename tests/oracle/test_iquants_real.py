"""Real weights in i-quants: SmolLM2-135M requantized from the Q4_1 GGUF
(tests/support/iquant_fixtures.py), by llama.cpp itself (``llama_model_quantize``) and, for the
types llama.cpp refuses without an importance matrix, by colibri's own quantizer.

IQ4_XS with llama.cpp's ``--pure`` (the default IQ4_XS mix puts three ffn_down tensors in
Q5_K, a K-quant from another branch): the 1536-wide ffn_down rows become IQ4_XS and every
576-wide row falls back to IQ4_NL (576 is not a multiple of 256), so the file mixes the two.

IQ2_XXS, IQ2_XS, IQ1_S and IQ1_M by colibri (llama.cpp refuses to write them without an
importance matrix; every ffn_down in the type, the rest stays Q4_1): gguf decodes them as
colibri does, and llama.cpp running the very same file gives logits within a measured
tolerance of colibri's.

* Our IQ4_NL / IQ4_XS quantizers reproduce llama.cpp's bytes for every row of the file.
* float32 activations: colibri equals transformers loading the same GGUF (argmax at every
  position of a 600-token text, and a 30-token greedy continuation).
* default settings (int8 activations): on the same tokens, colibri's mean KL divergence from
  the float32 reference (transformers) is at most 1.15x llama.cpp's on the same file
  (llama.cpp's KLD method: full-vocabulary KL per position, averaged); top-1 agreement is
  reported.
"""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np
import pytest
import torch
import transformers

import colibri
from colibri._core import quant as q
from support.iquant_fixtures import colibri_quantized, llama_cpp_or_skip, requantized
from support.realmodel import smollm2_gguf

TEXT = (
    "The lighthouse keeper's log for the winter of that year survives in three notebooks, "
    "each bound in oilcloth and swollen from the damp. The first records the weather with "
    "the patience of a man who had nothing else to count: wind from the north-west, force "
    "six, backing west by evening; rain in squalls; a coaster passing at dusk with one "
    "lamp dark. The second notebook is different. Its entries grow longer, and between the "
    "readings of the barometer he begins to write about the island itself, about the rabbits "
    "that had taken over the old vegetable garden, the gulls that nested on the roof of the "
    "oil store, and the supply boat that came every second Thursday if the sea allowed it. "
    "He describes the boatman, a silent man who smoked a clay pipe and never once stepped "
    "onto the jetty, and the parcels of newspapers, always a fortnight old, that he read "
    "from the first page to the last, advertisements included. In February a storm kept "
    "the boat away for five weeks. The keeper rationed his flour, mended the window of the "
    "lamp room with a sheet of tin, and wrote that the silence had a texture he had not "
    "noticed before, like wool pulled too tight. The third notebook is mostly arithmetic. "
    "He calculated how much paraffin the lamp burned each night, how many nights were left "
    "until the relief keeper arrived, how many steps there were from the door of the cottage "
    "to the gallery of the tower, and how many times he had climbed them since September. "
    "The numbers are neat and the sums are correct. On the last page, under a line ruled "
    "with care, he wrote only the date of his departure and the words: the light never "
    "failed. Historians who study such records value them less for the events they describe "
    "than for the ordinary details they preserve: the price of coal, the names of ships, the "
    "way a person measured time when the only clock that mattered was the turning of a lamp. "
    "Reading them now, one notices how much of a life is made of small repeated tasks, and "
    "how a careful account of those tasks can become, almost by accident, a portrait of the "
    "person who performed them. The museum that keeps the notebooks displays them open at "
    "the page about the storm, beside a photograph of the tower taken from the mainland on "
    "a clear day, when the island looks close enough to reach by swimming, which it is not. "
    "Visitors often ask what became of the keeper after he left. The answer, pieced together "
    "from a parish register and a letter kept by a niece, is unremarkable: he married late, "
    "ran a small hardware shop in a market town, and was known for lending tools to anyone "
    "who asked and for writing the date of the loan in a notebook behind the counter. When "
    "the shop was sold, the new owner found that notebook in a drawer, its last entries "
    "recording a saw, two chisels and a ladder, all of them returned."
)
N_GREEDY = 30
KLD_RATIO = 1.15
# colibri (default settings) vs llama.cpp on the same colibri-written file, every position
# of the text: per position max |logit difference| / max |logit|, its median and worst over
# the text, top-1 agreement and the mean KL divergence of colibri's distribution from
# llama.cpp's. Measured (594 tokens, llama-cpp-python 0.3.36):
#   IQ2_XS: median 3.27e-2, worst 0.170, top-1 0.941, KLD 8.4e-3
#   IQ1_S:  median 4.91e-2, worst 0.191, top-1 0.897, KLD 1.32e-2
#   IQ1_M:  median 4.59e-2, worst 0.137, top-1 0.944, KLD 9.2e-3
#   IQ2_XXS: median 3.68e-2, worst 0.160, top-1 0.918, KLD 1.21e-2
#   IQ3_XXS: median 3.40e-2, worst 0.107, top-1 0.961, KLD 6.6e-3 (llama.cpp 0.3.36 will not
#            write IQ3_XXS without an importance matrix either)
# Bounds: twice the measured median, worst and KLD; top-1 at most 0.03 below.
LOGIT_MEASURED = {
    "IQ2_XS": (3.27e-2, 0.170, 0.941, 8.4e-3),
    "IQ1_S": (4.91e-2, 0.191, 0.897, 1.32e-2),
    "IQ1_M": (4.59e-2, 0.137, 0.944, 9.2e-3),
    "IQ2_XXS": (3.68e-2, 0.160, 0.918, 1.21e-2),
    "IQ3_XXS": (3.40e-2, 0.107, 0.961, 6.6e-3),
}


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def mean_kld(ref_logits: np.ndarray, logits: np.ndarray) -> float:
    """llama.cpp's --kl-divergence: KL(P_ref || P) over the full vocabulary, per position."""
    lp, lq = log_softmax(ref_logits), log_softmax(logits)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=-1)))


COLIBRI_TYPES = ["IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M", "IQ3_XXS"]
# Relative RMS error of the ffn_down weights colibri wrote, against the Q4_1 source's
# values (bounds: the largest measured over the 30 tensors, 0.342, 0.298, 0.471, 0.431,
# 0.186, plus 10%); Gaussian data gives 0.33, 0.29, 0.45, 0.42
# (tests/kernels/test_iquant_quantizer.py).
WEIGHT_ERROR = {"IQ2_XXS": 0.38, "IQ2_XS": 0.33, "IQ1_S": 0.52, "IQ1_M": 0.48, "IQ3_XXS": 0.205}


# The default run keeps IQ4_XS (llama.cpp's) and IQ2_XXS (colibri's, without transformers'
# reference: REFERENCE_FILES below); the other colibri types are `-m slow`: quantizing
# SmolLM2's 30 ffn_down tensors to IQ1_S / IQ1_M takes about 6 minutes on the 2-core
# machine (cached in build/iquant_fixtures/ after), then each file's tests take about 3
# minutes (transformers' float32 reference included; results in docs/testing.md).
SLOW_TYPES = {"IQ2_XS", "IQ1_S", "IQ1_M", "IQ3_XXS"}


def _files(slow: set[str]) -> list[Any]:
    return ["IQ4_XS by llama.cpp"] + [
        pytest.param(f"{t} by colibri", marks=[pytest.mark.slow] if t in slow else [])
        for t in COLIBRI_TYPES
    ]


# transformers' float32 reference (loading the GGUF into transformers, its forward over the
# text and a 30-token generate: about 1.5 minutes a file on the 2-core machine) is computed
# in the default run for llama.cpp's file only: the two tests that need it take the
# colibri-written files with `-m slow`. (Same order as the fixture's own parameters, so the
# module-scoped fixtures are shared.)
REFERENCE_FILES = _files(set(COLIBRI_TYPES))


@pytest.fixture(scope="module", params=_files(SLOW_TYPES))
def iq4_xs_file(request: pytest.FixtureRequest) -> str:
    """The GGUF under test (named for the first one; the fixtures below follow it)."""
    if request.param.startswith("IQ4_XS"):
        return str(requantized("IQ4_XS", pure=True))
    return str(colibri_quantized(request.param.split()[0]))


def colibri_type(path: str) -> str:
    """The type colibri wrote into a colibri-made fixture (its file name says which)."""
    return path.rsplit("/", 1)[-1].split(".")[1].split("-")[0]


@pytest.fixture(scope="module")
def tokens(iq4_xs_file: str) -> list[int]:
    llama_cpp = llama_cpp_or_skip()
    vocab = llama_cpp.Llama(iq4_xs_file, vocab_only=True, verbose=False)
    ids = vocab.tokenize(TEXT.encode(), add_bos=False)
    assert len(ids) >= 512
    return list(ids)


@pytest.fixture(scope="module")
def hf_model(iq4_xs_file: str) -> transformers.PreTrainedModel:
    """transformers loading the same GGUF (it dequantizes with gguf.quants), float32."""
    d, name = iq4_xs_file.rsplit("/", 1)
    return transformers.AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def reference(hf_model: transformers.PreTrainedModel, tokens: list[int]) -> np.ndarray:
    """transformers' logits at every position of the text."""
    with torch.no_grad():
        out = hf_model(torch.tensor([tokens])).logits[0].numpy()
    return out.astype(np.float32)


def test_file_mixes_types(iq4_xs_file: str) -> None:
    kinds = {t.tensor_type.name for t in gguf.GGUFReader(iq4_xs_file).tensors}
    if "colibri" in iq4_xs_file:
        assert kinds == {colibri_type(iq4_xs_file), "Q4_1", "Q8_0", "F32"} - ({"Q8_0"} - kinds)
    else:
        assert {"IQ4_XS", "IQ4_NL"} <= kinds <= {"IQ4_XS", "IQ4_NL", "F32"}


def test_colibri_file_against_gguf(iq4_xs_file: str) -> None:
    """The low-bit tensors colibri wrote decode with gguf (bit-identical to colibri's own
    decoding) to an approximation of the source weights within the type's error."""
    if "colibri" not in iq4_xs_file:
        pytest.skip("for the colibri-written file")
    kind = colibri_type(iq4_xs_file)
    src = {t.name: t for t in gguf.GGUFReader(smollm2_gguf()).tensors}
    worst, checked = 0.0, 0
    for t in gguf.GGUFReader(iq4_xs_file).tensors:
        if t.tensor_type.name != kind:
            continue
        cols = int(t.shape[0])
        b = np.asarray(t.data).reshape(-1, q.row_bytes(kind, cols))
        ref = np.asarray(gguf.quants.dequantize(b, gguf.GGMLQuantizationType[kind]), np.float32)
        assert np.array_equal(
            q.dequantize(kind, b, b.shape[0], cols).view(np.uint32), ref.view(np.uint32)
        )
        s = src[t.name]
        x = np.asarray(gguf.quants.dequantize(s.data, s.tensor_type), np.float32).reshape(ref.shape)
        worst = max(worst, float(np.sqrt(np.mean((ref - x) ** 2) / np.mean(x**2))))
        checked += 1
    print(f"{kind}: worst relative RMS weight error over {checked} tensors {worst:.4f}")
    assert checked == 30
    assert worst < WEIGHT_ERROR[kind]


def test_our_quantizers_reproduce_llama_cpp_bytes(iq4_xs_file: str) -> None:
    if "colibri" in iq4_xs_file:
        pytest.skip("for the llama.cpp-written file")
    src = {t.name: t for t in gguf.GGUFReader(smollm2_gguf()).tensors}
    checked = 0
    for t in gguf.GGUFReader(iq4_xs_file).tensors:
        kind = t.tensor_type.name
        if kind not in ("IQ4_XS", "IQ4_NL"):
            continue
        s = src[t.name]
        cols = int(t.shape[0])
        x = np.asarray(gguf.quants.dequantize(s.data, s.tensor_type), np.float32).reshape(-1, cols)
        ours = q.quantize(kind, x)
        assert np.array_equal(ours, np.asarray(t.data).reshape(ours.shape)), t.name
        checked += ours.shape[0]
    assert checked > 60000


@pytest.mark.parametrize("iq4_xs_file", REFERENCE_FILES, indirect=True, scope="module")
def test_float32_activations_equal_transformers(
    iq4_xs_file: str,
    tokens: list[int],
    reference: np.ndarray,
    hf_model: transformers.PreTrainedModel,
) -> None:
    eng = colibri.EngineConfig(context_length=1024, activation_precision="float32")
    s = colibri.Model.load(iq4_xs_file, engine=eng).session()
    got = s.forward(tokens, all_logits=True)
    np.testing.assert_array_equal(got.argmax(-1), reference.argmax(-1))
    assert float(np.abs(got - reference).max()) <= 1e-4 * float(np.abs(reference).max())
    # greedy continuation of the first 40 tokens, against transformers' own generate
    prompt = tokens[:40]
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=N_GREEDY, do_sample=False)[
            0, 40:
        ].tolist()
    s2 = colibri.Model.load(iq4_xs_file, engine=eng).session()
    logits = s2.forward(prompt)
    greedy: list[int] = []
    for _ in range(N_GREEDY):
        greedy.append(int(np.argmax(logits)))
        logits = s2.forward([greedy[-1]])
    assert greedy == ref


@pytest.fixture(scope="module")
def llama_logits(iq4_xs_file: str, tokens: list[int]) -> np.ndarray:
    """llama.cpp's logits at every position of the text, running the same file."""
    llama_cpp = llama_cpp_or_skip()
    llm = llama_cpp.Llama(iq4_xs_file, n_ctx=1024, logits_all=True, n_threads=2, verbose=False)
    llm.eval(tokens)
    out = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    del llm
    return out


@pytest.fixture(scope="module")
def colibri_logits(iq4_xs_file: str, tokens: list[int]) -> np.ndarray:
    """colibri's logits with default settings but int8 activations (llama.cpp's Q8_K; the
    default for this small file would be float32)."""
    ours = colibri.Model.load(
        iq4_xs_file, engine=colibri.EngineConfig(context_length=1024, activation_precision="int8")
    ).session()
    return ours.forward(tokens, all_logits=True)


@pytest.mark.parametrize("iq4_xs_file", REFERENCE_FILES, indirect=True, scope="module")
def test_default_settings_kld_vs_llama_cpp(
    iq4_xs_file: str,
    reference: np.ndarray,
    llama_logits: np.ndarray,
    colibri_logits: np.ndarray,
) -> None:
    mine, theirs = colibri_logits, llama_logits
    k_ours, k_llama = mean_kld(reference, mine), mean_kld(reference, theirs)
    top1_ours = float(np.mean(mine.argmax(-1) == reference.argmax(-1)))
    top1_llama = float(np.mean(theirs.argmax(-1) == reference.argmax(-1)))
    print(
        f"{iq4_xs_file.rsplit('/', 1)[-1]}, {len(mine)} tokens: "
        f"mean KLD colibri {k_ours:.3e} llama.cpp {k_llama:.3e} "
        f"(ratio {k_ours / k_llama:.3f}); top-1 colibri {top1_ours:.4f} llama.cpp {top1_llama:.4f}"
    )
    assert k_ours <= KLD_RATIO * k_llama


def test_logits_agree_with_llama_cpp(
    iq4_xs_file: str, llama_logits: np.ndarray, colibri_logits: np.ndarray
) -> None:
    """colibri and llama.cpp running the very same colibri-written file, position by
    position. Both quantize the activations (Q8_K for the i-quants, Q8_1 for Q4_1) and
    differ in rounding order, which 2-bit and 1-bit weights amplify over 30 layers; the
    KLD test above shows both are equally close to the float32 reference."""
    if "colibri" not in iq4_xs_file:
        pytest.skip("for the colibri-written files (the KLD test covers llama.cpp's)")
    kind = colibri_type(iq4_xs_file)
    diff = np.abs(colibri_logits - llama_logits).max(-1) / np.abs(llama_logits).max(-1)
    top1 = float(np.mean(colibri_logits.argmax(-1) == llama_logits.argmax(-1)))
    kld = mean_kld(llama_logits, colibri_logits)
    print(
        f"{kind}: colibri vs llama.cpp max |dlogit| / max |logit| median "
        f"{np.median(diff):.2e} worst {diff.max():.2e}; top-1 {top1:.4f}; KLD {kld:.2e}"
    )
    if kind not in LOGIT_MEASURED:
        pytest.skip(f"no measured tolerance for {kind} yet (figures printed above)")
    med, worst, agree, k = LOGIT_MEASURED[kind]
    assert float(np.median(diff)) < 2 * med
    assert float(diff.max()) < 2 * worst
    assert top1 >= agree - 0.03
    assert kld < 2 * k
