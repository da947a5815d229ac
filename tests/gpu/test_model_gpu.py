"""Models with EngineConfig(device="gpu") on lavapipe: issue 30's first forward-pass slice.

The linear layers (attention projections, dense FFN, shared experts, LM head) run on the
GPU, everything else on the CPU (docs/gpu.md). The oracle checks are the families' bound
(support/logit_checks.py: 1e-4 of the largest logit) against transformers in float32, on
the dense family and a MoE family with a shared expert; the GPU sums each product in
another order than transformers (and than the CPU), so bit-equality is asked only between
two GPU runs. Kept small: lavapipe computes on the CPU, one submission per matvec.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri._core import gpu as core_gpu
from colibri.cli.parser import engine_from_args, parse_args
from colibri.errors import ConfigError, GPUUnavailableError
from colibri.settings.config import EngineConfig, GPUConfig
from support.fp8_factory import write_fp8_pair
from support.logit_checks import assert_decode_matches, assert_greedy_matches, assert_within
from support.modelfactory import (
    TinyModel,
    build_tiny_model,
    prompt_ids,
    reference_greedy,
    reference_logits,
    transformers_model,
)

N_PROMPT = 16
N_GREEDY = 20
ON_LAVAPIPE = GPUConfig(adapter="llvmpipe")


def gpu_engine(**changes: object) -> EngineConfig:
    return EngineConfig(context_length=64, device="gpu", gpu=ON_LAVAPIPE).replace(**changes)


@pytest.fixture(scope="module", params=["llama", "qwen2_moe"])
def tiny(request: pytest.FixtureRequest) -> TinyModel:
    """The dense family, and a MoE family with Q/K/V biases and a gated shared expert."""
    return build_tiny_model(request.param)


@pytest.fixture(scope="module")
def reference(tiny: TinyModel) -> tuple[list[int], np.ndarray, list[int], np.ndarray]:
    hf = transformers_model(str(tiny.hf_dir))
    ids = prompt_ids(N_PROMPT)
    tokens, steps = reference_greedy(hf, ids, N_GREEDY)
    return ids, reference_logits(hf, ids), tokens, steps


@pytest.fixture(scope="module")
def gpu_model(tiny: TinyModel, lavapipe: str) -> Iterator[colibri.Model]:
    with colibri.Model.load(tiny.hf_dir, engine=gpu_engine()) as m:
        yield m


def test_prefill_and_decode_match_transformers(gpu_model: colibri.Model, reference: tuple) -> None:
    ids, ref, _, _ = reference
    assert_within(gpu_model.session().forward(ids, all_logits=True), ref, "GPU prefill")
    assert_decode_matches(gpu_model.session(), ids, ref, "GPU")


def test_greedy_matches_transformers(gpu_model: colibri.Model, reference: tuple) -> None:
    ids, _, tokens, steps = reference
    assert_greedy_matches(gpu_model.session(), ids, tokens, steps)


def test_two_runs_are_bit_identical(gpu_model: colibri.Model, reference: tuple) -> None:
    ids = reference[0]
    a = gpu_model.session().forward(ids, all_logits=True)
    b = gpu_model.session().forward(ids, all_logits=True)
    np.testing.assert_array_equal(a, b)
    # One matvec per token: a prefill row is the decode of that token alone, bit for bit.
    s = gpu_model.session()
    s.forward(ids[:-1])
    np.testing.assert_array_equal(s.forward(ids[-1:]), a[-1])


def test_stats_name_the_adapter_and_say_what_runs_where(gpu_model: colibri.Model,
                                                        tiny: TinyModel) -> None:
    gpu_model.session().forward([5, 6, 7])
    st = gpu_model.stats().gpu
    assert st is not None
    assert "llvmpipe" in st.adapter and st.backend == "vulkan" and st.adapter_type == "cpu"
    assert st.dispatches > 0 and st.products > 0 and st.columns >= 3
    assert st.bytes_uploaded > 0 and st.bytes_read_back > 0 and st.seconds > 0
    on_gpu = {m.name for m in st.on_gpu}
    assert {"blk.0.attn_q", "blk.0.attn_k", "blk.0.attn_v", "blk.0.attn_output", "output"} <= on_gpu
    assert st.weight_bytes == sum(m.bytes for m in st.on_gpu)
    reasons = {m.name: m.reason for m in st.on_cpu}
    assert "embedding" in reasons["token_embd"]
    if tiny.family == "llama":
        assert {"blk.2.ffn_gate", "blk.2.ffn_up", "blk.2.ffn_down"} <= on_gpu
        assert st.routed_experts == 0
    else:
        assert {"blk.2.ffn_gate_shexp", "blk.2.ffn_up_shexp", "blk.2.ffn_down_shexp"} <= on_gpu
        assert "router" in reasons["blk.0.ffn_gate_inp"]
        assert st.routed_experts == 3 * 16
        assert any("routed experts" in why for why in st.cpu_reasons())
    assert "llvmpipe" in repr(st) and "gpu" in dict(gpu_model.stats()._display_rows())
    gpu_model.reset_stats()
    assert gpu_model.stats().gpu.dispatches == 0  # type: ignore[union-attr]


def test_the_cpu_default_and_auto_use_no_gpu(lavapipe: str) -> None:
    tiny = llama()
    assert EngineConfig().device == "cpu"
    with colibri.Model.load(tiny.hf_dir, engine=EngineConfig(context_length=64)) as m:
        assert m.stats().gpu is None
    # "auto" is the CPU until a GPU is measured faster (lavapipe, a software one, never is).
    auto = EngineConfig(context_length=64, device="auto", gpu=ON_LAVAPIPE)
    with colibri.Model.load(tiny.hf_dir, engine=auto) as m:
        assert m.stats().gpu is None


def llama() -> TinyModel:
    return build_tiny_model("llama")


def test_matrices_past_the_memory_budget_stay_on_the_cpu(lavapipe: str) -> None:
    """A budget that holds a few matrices: the rest stays on the CPU, said, and the logits
    are still the model's."""
    budget = 3 * 64 * 64 * 4
    tiny = llama()
    ids = prompt_ids(N_PROMPT)
    ref = reference_logits(transformers_model(str(tiny.hf_dir)), ids)
    with colibri.Model.load(tiny.hf_dir, engine=gpu_engine(gpu={"adapter": "llvmpipe",
                                                                "memory_budget": budget})) as m:
        st = m.stats().gpu
        assert st is not None and 0 < len(st.on_gpu) and st.weight_bytes <= budget
        assert any("memory_budget" in m.reason for m in st.on_cpu)
        assert_within(m.session().forward(ids, all_logits=True), ref, "GPU and CPU mixed")


def test_a_quantized_model_on_the_gpu_matches_the_cpu_float32_path(lavapipe: str) -> None:
    """Q8_0 (row-lane packed on AVX-512 hosts: the upload undoes it) and the F32 norms of
    a GGUF: the GPU's exact dequantization against the CPU's float32 activations."""
    path = llama().gguf["Q8_0"]
    ids = prompt_ids(N_PROMPT)
    cpu_cfg = EngineConfig(context_length=64, activation_precision="float32")
    with colibri.Model.load(path, engine=cpu_cfg) as m:
        cpu = m.session().forward(ids, all_logits=True)
    with colibri.Model.load(path, engine=cpu_cfg.replace(device="gpu", gpu=ON_LAVAPIPE)) as m:
        st = m.stats().gpu
        assert st is not None and "Q8_0" in {x.dtype for x in st.on_gpu}
        assert_within(m.session().forward(ids, all_logits=True), cpu, "Q8_0 on the GPU")


def test_an_fp8_matrix_runs_on_the_gpu_with_its_block_scales(
        lavapipe: str, tmp_path: Path) -> None:  # fmt: skip
    """The tiny Llama with its q_proj in FP8 (F8_E4M3 with 32 x 48 block scales, so blocks
    straddle rows and columns), the rest BF16: both go to the GPU, the FP8 codes with their
    scales, and the logits are the dequantized twin's within the bound."""
    fp8, twin = write_fp8_pair(llama().hf_dir, tmp_path / "fp8", tmp_path / "deq", (32, 48),
                               ("q_proj",))
    ids = prompt_ids(N_PROMPT)
    ref = reference_logits(transformers_model(str(twin)), ids)
    kernels = set(core_gpu.kernel_types())
    with colibri.Model.load(fp8, engine=gpu_engine()) as m:
        st = m.stats().gpu
        assert st is not None
        q = next(x for x in st.matrices if x.name == "blk.0.attn_q")
        assert q.dtype == "F8_E4M3" and q.on_gpu, q
        for x in st.matrices:
            if x.dtype not in kernels:
                assert not x.on_gpu and x.dtype in x.reason
        assert "BF16" in {x.dtype for x in st.on_gpu}
        assert_within(m.session().forward(ids, all_logits=True), ref, "FP8 and BF16")


def test_a_bogus_adapter_is_a_clear_error_and_the_cpu_still_works(lavapipe: str) -> None:
    tiny = llama()
    with pytest.raises(GPUUnavailableError, match="matches no adapter's name; found: 0: llvmpipe"):
        colibri.Model.load(tiny.hf_dir, engine=gpu_engine(gpu={"adapter": "no-such-gpu"}))
    with pytest.raises(GPUUnavailableError, match="only 1 adapter"):
        colibri.Model.load(tiny.hf_dir, engine=gpu_engine(gpu={"adapter": 7}))
    with colibri.Model.load(tiny.hf_dir, engine=EngineConfig(context_length=64)) as m:
        assert m.session().forward([5, 6, 7]).shape == (256,)


def test_no_wgpu_package_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = llama()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wgpu" else real(name, *a))
    with pytest.raises(GPUUnavailableError, match="the wgpu package is not installed"):
        colibri.Model.load(tiny.hf_dir, engine=gpu_engine())
    with colibri.Model.load(tiny.hf_dir, engine=EngineConfig(context_length=64)) as m:
        assert m.session().forward([5, 6, 7]).shape == (256,)


def test_device_is_validated_and_has_a_flag() -> None:
    with pytest.raises(ConfigError, match="EngineConfig.device: 'gpus' is not allowed; use one "
                                          "of 'cpu', 'gpu', 'auto'"):
        EngineConfig(device="gpus")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="did you mean 'device'"):
        EngineConfig(devise="gpu")  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="did you mean 'memory_budget'"):
        EngineConfig(gpu={"memory_budgit": "1GiB"})
    assert EngineConfig(gpu={"adapter": "nvidia"}).gpu == GPUConfig(adapter="nvidia")
    def flags(*argv: str) -> EngineConfig:
        return engine_from_args(parse_args(["run", *argv, "hi"], colibri.__version__))

    cfg = flags("--device", "gpu", "--gpu-adapter", "0", "--gpu-memory-budget", "2GiB")
    assert cfg.device == "gpu" and cfg.gpu == GPUConfig(adapter=0, memory_budget="2GiB")
    assert flags("--gpu-adapter", "llvm").gpu.adapter == "llvm"
    assert flags().device == "cpu"
