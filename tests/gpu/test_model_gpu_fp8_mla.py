"""The DeepSeek / GLM family's FP8 checkpoints with EngineConfig(device="gpu") on lavapipe
(issue 30's acceptance names "FP8 MLA"): DeepSeek-V3's MLA with q-LoRA and an MTP layer,
and GLM-4.5's GQA, their projections in F8_E4M3 with block scales whose blocks straddle
the heads (24 x 16), the rest BF16. The FP8 and BF16 projections run on the GPU (the FP8
codes with their scales); MLA's per-head products, routers and routed experts on the CPU
(docs/gpu.md). Against transformers on the dequantized twin in float32, the families'
bound (1e-4 of the largest logit), prefill and prefill + token-by-token decode.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.settings.config import EngineConfig, GPUConfig
from support.deepseek_factory import prompt_ids, transformers_model
from support.fp8_factory import fp8_deepseek
from support.logit_checks import assert_within
from support.modelfactory import reference_logits

BLOCK = (24, 16)
N_PROMPT = 24


@pytest.mark.parametrize("variant", ["deepseek_v3", "glm4_moe"])
def test_fp8_family_on_the_gpu_matches_transformers(
        variant: str, lavapipe: str, tmp_path: Path) -> None:  # fmt: skip
    fp8_dir, ref_dir = fp8_deepseek(tmp_path, BLOCK, variant)
    ids = prompt_ids(N_PROMPT)
    ref = reference_logits(transformers_model(str(ref_dir)), ids)
    eng = EngineConfig(context_length=64, activation_precision="float32", kv_cache_type="f32",
                       device="gpu", gpu=GPUConfig(adapter="llvmpipe"))  # fmt: skip
    with colibri.Model.load(fp8_dir, engine=eng) as m:
        st = m.stats().gpu
        assert st is not None and "llvmpipe" in st.adapter
        fp8_on_gpu = [x for x in st.on_gpu if x.dtype == "F8_E4M3"]
        assert fp8_on_gpu, [(x.name, x.dtype, x.reason) for x in st.matrices]
        whole = m.session().forward(ids, all_logits=True)
        s = m.session()
        steps = [s.forward(ids[:12], all_logits=True)] + [s.forward([t])[None] for t in ids[12:]]
        assert m.stats().gpu.dispatches > 0
    assert_within(whole, ref, f"{variant} FP8 on the GPU, prefill")
    assert_within(np.concatenate(steps), ref, f"{variant} FP8 on the GPU, decode")
