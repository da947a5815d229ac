"""The routing rules (csrc/model/routers/), each against transformers' own router module
fed the same logits (an identity router weight turns its input into its logits), with
ties broken deterministically, and bad specs refused. The MoE block and the lookahead
prefetch call these same objects (ffn_block.cpp), so a prediction applies the next layer's
full rule, its bias and groups included.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from colibri import _core
from colibri.errors import InvalidRequestError

K = _core.RouterKind
N_TOKENS = 64


def _logits(n_experts: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 2, (N_TOKENS, n_experts)).astype(np.float32)


def _identity_router(cls: type, config: object, n_experts: int) -> torch.nn.Module:
    gate = cls(config)
    with torch.no_grad():
        gate.weight.copy_(torch.eye(n_experts))
    return gate.eval()


def _same(ours: tuple[np.ndarray, np.ndarray], idx: torch.Tensor, w: torch.Tensor) -> None:
    """Same experts (as sets: transformers' topk is unsorted) and the same weights."""
    experts, weights = ours
    idx, w = idx.detach(), w.detach()
    order = np.argsort(experts, axis=1)
    ref_order = np.argsort(idx.numpy(), axis=1)
    np.testing.assert_array_equal(np.take_along_axis(experts, order, 1),
                                  np.take_along_axis(idx.numpy(), ref_order, 1))
    np.testing.assert_allclose(np.take_along_axis(weights, order, 1),
                               np.take_along_axis(w.numpy(), ref_order, 1), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize(("n_experts", "top_k", "n_group", "topk_group", "norm"), [
    (16, 4, 4, 2, True), (64, 8, 1, 1, True), (32, 6, 8, 3, False), (8, 2, 2, 1, True),
])  # fmt: skip
def test_sigmoid_grouped_matches_deepseek_v3_router(n_experts: int, top_k: int, n_group: int,
                                                    topk_group: int, norm: bool) -> None:
    cfg = transformers.DeepseekV3Config(
        hidden_size=n_experts, n_routed_experts=n_experts, num_experts_per_tok=top_k,
        n_group=n_group, topk_group=topk_group, norm_topk_prob=norm, routed_scaling_factor=2.5,
    )  # fmt: skip
    gate = _identity_router(transformers.models.deepseek_v3.modeling_deepseek_v3
                            .DeepseekV3TopkRouter, cfg, n_experts)  # fmt: skip
    bias = np.random.default_rng(7).normal(0, 0.3, n_experts).astype(np.float32)
    with torch.no_grad():
        gate.e_score_correction_bias.copy_(torch.from_numpy(bias))
    x = _logits(n_experts, n_experts + top_k)
    _, w, idx = gate(torch.from_numpy(x))
    ours = _core.route(K.sigmoid_grouped, x, top_k, norm, 2.5, n_group, topk_group, bias)
    _same(ours, idx, w)
    # The bias matters: without it the selection differs somewhere in these 64 tokens.
    plain = _core.route(K.sigmoid_grouped, x, top_k, norm, 2.5, n_group, topk_group)
    assert not np.array_equal(np.sort(plain[0], 1), np.sort(ours[0], 1))


@pytest.mark.parametrize(("method", "n_group", "topk_group", "scaling"), [
    ("greedy", 1, 1, 1.0), ("group_limited_greedy", 4, 2, 1.5), ("group_limited_greedy", 8, 1, 1.0),
])  # fmt: skip
def test_softmax_rules_match_deepseek_v2_router(method: str, n_group: int, topk_group: int,
                                                scaling: float) -> None:
    n_experts, top_k = 32, 3
    cfg = transformers.DeepseekV2Config(
        hidden_size=n_experts, n_routed_experts=n_experts, num_experts_per_tok=top_k,
        n_group=n_group, topk_group=topk_group, topk_method=method,
        routed_scaling_factor=scaling,
    )  # fmt: skip
    gate = _identity_router(transformers.models.deepseek_v2.modeling_deepseek_v2
                            .DeepseekV2TopkRouter, cfg, n_experts)  # fmt: skip
    x = _logits(n_experts, 3)
    _, w, idx = gate(torch.from_numpy(x))
    kind = K.softmax_topk if method == "greedy" else K.softmax_group_limited
    _same(_core.route(kind, x, top_k, False, scaling, n_group, topk_group), idx, w)


def test_softmax_topk_renormalized_matches_mixtral() -> None:
    x = _logits(8, 5)
    p = torch.softmax(torch.from_numpy(x), dim=-1)
    w, idx = torch.topk(p, 2, dim=-1)
    _same(_core.route(K.softmax_topk, x, 2, True), idx, w / w.sum(-1, keepdim=True))


@pytest.mark.parametrize("kind", [K.softmax_topk, K.sigmoid_grouped, K.softmax_group_limited])
def test_ties_go_to_the_lower_index(kind: _core.RouterKind) -> None:
    x = np.zeros((3, 16), dtype=np.float32)
    experts, weights = _core.route(kind, x, 4, False, 1.0, 4, 2)
    # Every score equal: groups 0 and 1 are kept, experts 0..3 chosen, best (lowest) first.
    np.testing.assert_array_equal(experts, np.tile(np.arange(4, dtype=np.int32), (3, 1)))
    assert np.all(weights == weights[0, 0])
    x[:, 9] = 1.0  # one expert of group 2 stands out
    experts, _ = _core.route(kind, x, 4, False, 1.0, 4, 2)
    np.testing.assert_array_equal(experts[0], [9, 0, 1, 2])


@pytest.mark.parametrize(("args", "message"), [
    ((K.sigmoid_grouped, 4, False, 1.0, 3, 1), "n_group 3 must divide n_experts 16"),
    ((K.sigmoid_grouped, 4, False, 1.0, 4, 5), "topk_group"),
    ((K.sigmoid_grouped, 12, False, 1.0, 4, 2), "exceeds the experts of the kept groups"),
    ((K.softmax_topk, 17, False, 1.0, 1, 1), "top_k"),
    ((K.softmax_topk, 2, False, 0.0, 1, 1), "routed_scaling_factor"),
    ((K.sigmoid_grouped, 2, False, 1.0, 16, 2), "at least 2 experts"),
])  # fmt: skip
def test_bad_router_specs_are_named(args: tuple[object, ...], message: str) -> None:
    kind, top_k, norm, scaling, n_group, topk_group = args
    with pytest.raises(InvalidRequestError, match=message):
        _core.route(kind, _logits(16, 0), top_k, norm, scaling, n_group, topk_group)
