"""Multi-token prediction (DeepSeek-V3 / GLM-4.5 MTP layer) against transformers 5.24's own
MTP runner (``transformers.modeling_layers.MtpModel``, what ``generate(use_mtp=True)`` uses).

transformers' ``MtpModel.from_pretrained`` finds MTP weights by the real checkpoints' layer
index (``model.layers.61``), so a tiny model's layer 3 is loaded into an ``MtpModel`` here
by hand: the decoder layer from the factory's deeper twin (asserted equal to the
checkpoint's tensors), eh_proj / enorm / hnorm / shared_head.norm (transformers'
``post_norm``) from the checkpoint. The trunk state is what ``MTPCandidateGenerator`` feeds
it: ``hidden_states[-1]``, the last decoder layer's output after the final norm (the
main model's output representation; vLLM and SGLang feed the same).

At every step of a 20-token greedy generation colibri's depth-1 draft logits equal
transformers' (full causal recompute, positions shifted by one as transformers does;
colibri numbers its MTP slots from 0, which RoPE's relative form makes the same attention)
within 1e-4 of the largest logit. Depth 2 (the layer chained on its own normed output and
the drafted token) is checked against transformers' layer run on that same input.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers.modeling_layers import MtpModel

import colibri
from support.deepseek_factory import (
    N_LAYERS,
    TinyDeepseek,
    build_hf_model,
    prompt_ids,
    transformers_model,
)

MTP_ORACLE_VARIANTS = ["deepseek_v3", "glm4_moe"]
N_STEPS = 20
TOL = 1e-4  # of the largest |logit|: F32 both sides, summation order and MLA absorption


def load(path: object, **kw: object) -> colibri.Model:
    return colibri.Model.load(path, engine=colibri.EngineConfig(
        context_length=128, activation_precision="float32", **kw))  # type: ignore[arg-type]


def transformers_mtp(tiny: TinyDeepseek, main: torch.nn.Module) -> MtpModel:
    """transformers' MtpModel for the tiny checkpoint's MTP layer (model.layers.N_LAYERS)."""
    mtp = MtpModel(main, 1).eval()
    sd = load_file(str(Path(tiny.hf_dir) / "model.safetensors"))
    p = f"model.layers.{N_LAYERS}."
    twin = build_hf_model(tiny.variant, 100, N_LAYERS + 1)  # as deepseek_factory._mtp_tensors
    block = twin.model.layers[N_LAYERS]
    for name, t in block.state_dict().items():
        if p + name in sd:  # the unfused tensors: the twin is the checkpoint's source
            assert torch.equal(sd[p + name], t), name
    layer = mtp.layers[0]
    with torch.no_grad():
        layer.mtp_block.load_state_dict(block.state_dict())
        layer.eh_proj.weight.copy_(sd[p + "eh_proj.weight"])
        layer.enorm.weight.copy_(sd[p + "enorm.weight"])
        layer.hnorm.weight.copy_(sd[p + "hnorm.weight"])
        assert layer.post_norm is not None
        layer.post_norm.weight.copy_(sd[p + "shared_head.norm.weight"])
    return mtp


def mtp_rows(mtp: MtpModel, hidden: torch.Tensor, next_ids: list[int]) -> torch.Tensor:
    """transformers' MTP layer over every pair (hidden[p], next_ids[p]) at positions p + 1
    (MTPCandidateGenerator's shift), full causal attention: the normed outputs [n, hidden]."""
    n = len(next_ids)
    with torch.no_grad():
        out = mtp.forward_layer(0, hidden[None, :n], torch.arange(1, n + 1)[None], None,
                                input_ids=torch.tensor([next_ids]))
    return out[0]


def close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert err <= TOL * scale, f"{what}: max |diff| {err:.3g} > {TOL} x {scale:.3g}"


@pytest.mark.parametrize("variant", MTP_ORACLE_VARIANTS)
def test_mtp_draft_logits_match_transformers(deepseek_models: dict[str, TinyDeepseek],
                                             variant: str) -> None:
    tiny = deepseek_models[variant]
    main = transformers_model(str(tiny.hf_dir))
    mtp = transformers_mtp(tiny, main)
    m = load(tiny.hf_dir)
    s = m.session()
    s._core.enable_mtp()
    ids = prompt_ids(12)
    logits = s.forward(ids)
    seq = list(ids)
    agreed = 0
    for step in range(N_STEPS):
        nxt = int(np.argmax(logits))  # the trunk's greedy token, not forwarded yet
        drafts, got = s._core.mtp_draft(nxt, 2, True)
        assert len(drafts) == 2 and got.shape == (2, m.config.vocab_size)
        with torch.no_grad():
            out = main(torch.tensor([seq]), output_hidden_states=True)
        hidden = out.hidden_states[-1][0]  # normed: MTPCandidateGenerator's input
        rows = mtp_rows(mtp, hidden, [*seq[1:], nxt])
        with torch.no_grad():
            want1 = mtp._project_to_logits(rows[-1]).numpy()
        close(got[0], want1, f"{variant} step {step} depth 1")
        assert drafts[0] == int(np.argmax(got[0]))
        # Depth 2: the layer again on its own normed output, joined with the first draft.
        chained = torch.cat([hidden, rows[-1:]], 0)
        rows2 = mtp_rows(mtp, chained, [*seq[1:], nxt, drafts[0]])
        with torch.no_grad():
            want2 = mtp._project_to_logits(rows2[-1]).numpy()
        close(got[1], want2, f"{variant} step {step} depth 2")
        agreed += int(np.argmax(want1)) == drafts[0]
        seq.append(nxt)
        logits = s.forward([nxt])
    assert agreed == N_STEPS
    # The MTP cache holds every pair whose token is in the session: all but the last slot.
    assert s._core.mtp_committed == len(seq) - 2  # slot of (h_{T-2}, x_{T-1}) is the last
