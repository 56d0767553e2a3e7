"""The training objective (paper Eqs. 3-7, App. D identities, App. G hinge) and the oracle prefix."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_lilicorr.losses import (
    ObjectiveWeights,
    corrector_objective,
    distractor_penalty,
    dflash_block_ce,
    dflash_slot_weights,
    lilicorr_objective,
    margin_hinge,
    reranker_ce,
)
from sglang_lilicorr.oracle import (
    ObjectiveInputError,
    oracle_prefix,
    oracle_prefix_coverage,
    teacher_forced_scores,
)

from devices import DevicesMade

N, S, K, V = 3, 5, 4, 11
F64 = torch.float64


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def single_slot(z_row, g: int, log_q_row=None):
    """One supervised slot (N = S = 1) as the loss functions want it."""
    z = torch.tensor(z_row, dtype=F64).view(1, 1, -1).requires_grad_(True)
    gt = torch.tensor([[g]])
    prefix = torch.ones(1, 1, dtype=torch.bool)
    log_q = None if log_q_row is None else torch.tensor(log_q_row, dtype=F64).view(1, 1, -1)
    return z, gt, prefix, log_q


def batch(seed: int = 0, dtype=F64):
    """Random objective inputs where row 0 misses at slot 1, row 1 is fully covered and
    row 2 misses from slot 3 on."""
    g = gen(seed)
    cand = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(N * S)]).view(N, S, K)
    pick = torch.randint(0, K, (N, S), generator=g)
    targets = cand.gather(-1, pick.unsqueeze(-1)).squeeze(-1).clone()
    targets[0, 0] = next(t for t in range(V) if t not in cand[0, 0].tolist())
    targets[2, 2] = next(t for t in range(V) if t not in cand[2, 2].tolist())
    valid = torch.ones(N, S, dtype=torch.bool)
    start = torch.randn(N, K, generator=g, dtype=dtype).requires_grad_(True)
    pair = torch.randn(N, S - 1, K, K, generator=g, dtype=dtype).requires_grad_(True)
    logits = torch.randn(N, S, V, generator=g, dtype=dtype).requires_grad_(True)
    log_q = torch.randn(N, S, K, generator=g, dtype=dtype).log_softmax(-1)
    return dict(
        draft_logits=logits,
        targets=targets,
        valid=valid,
        candidate_ids=cand,
        start=start,
        pair=pair,
        target_log_probs=log_q,
    )


# --- oracle prefix ---------------------------------------------------------------------------


def test_oracle_prefix_hand_made():
    cand = torch.tensor(
        [[[5, 6], [7, 8], [9, 10]], [[5, 6], [7, 8], [9, 10]], [[5, 6], [7, 8], [9, 10]], [[5, 6], [7, 8], [9, 10]]]
    )
    targets = torch.tensor(
        [
            [6, 7, 10],  # all covered
            [6, 1, 9],  # slot 2 misses -> slot 3 off the prefix though covered
            [0, 7, 10],  # first slot misses -> empty prefix
            [5, 8, 9],
        ]
    )  # covered, but slot 3 is padding
    valid = torch.tensor([[True] * 3, [True] * 3, [True] * 3, [True, True, False]])
    gt, prefix = oracle_prefix(cand, targets, valid)
    assert gt.dtype == torch.int64
    assert gt.tolist() == [[1, 0, 1], [1, -1, 0], [-1, 0, 1], [0, 1, -1]]
    assert prefix.tolist() == [[True, True, True], [True, False, False], [False, False, False], [True, True, False]]
    cov = oracle_prefix_coverage(prefix, valid)
    assert cov["mean_prefix_len"].item() == pytest.approx((3 + 1 + 0 + 2) / 4)
    assert cov["supervised_fraction"].item() == pytest.approx(6 / 11)


def test_teacher_forced_scores_follow_ground_truth_predecessor():
    b = batch()
    gt, _ = oracle_prefix(b["candidate_ids"], b["targets"], b["valid"])
    z = teacher_forced_scores(b["start"], b["pair"], gt)
    assert z.shape == (N, S, K)
    for n in range(N):
        assert torch.equal(z[n, 0], b["start"][n])
        for s in range(1, S):
            prev = max(int(gt[n, s - 1]), 0)
            assert torch.equal(z[n, s], b["pair"][n, s - 1, prev])


# --- DFlash block cross-entropy (Eq. 6) ------------------------------------------------------


def test_dflash_weights_decay_as_stated():
    w = dflash_slot_weights(15, 7.0, dtype=F64)
    assert w[0].item() == 1.0
    assert torch.allclose(w, torch.exp(-torch.arange(15, dtype=F64) / 7.0))
    assert torch.allclose(w[1:] / w[:-1], torch.full((14,), math.exp(-1 / 7.0), dtype=F64))


def test_dflash_block_ce_is_weighted_sum_per_block_mean_over_blocks():
    """Eq. 6: sum_s w_s CE_s within a block (not normalised by the weights), averaged over the
    blocks that have a valid slot."""
    b = batch()
    valid = b["valid"].clone()
    valid[1, 3:] = False
    valid[2] = False  # a block with no valid slot is not counted
    targets = torch.where(valid, b["targets"], -100)  # padding ids are ignored
    loss = dflash_block_ce(b["draft_logits"], targets, valid, beta=2.0)
    ce = torch.nn.functional.cross_entropy(
        b["draft_logits"].reshape(-1, V), b["targets"].reshape(-1), reduction="none"
    ).view(N, S)
    w = torch.exp(-torch.arange(S, dtype=F64) / 2.0).expand(N, S) * valid
    assert torch.allclose(loss, (w * ce).sum() / (N - 1))
    # a single valid slot s gives w_s times its cross-entropy
    one = torch.zeros_like(valid)
    one[2, 4] = True
    assert torch.allclose(
        dflash_block_ce(b["draft_logits"], b["targets"], one, beta=2.0), math.exp(-4 / 2.0) * ce[2, 4]
    )


def test_dflash_block_ce_full_block_weighs_the_sum_of_the_weights():
    """A block whose every slot has the same cross-entropy c costs c * sum_s w_s (~6.6 c at beta 7)."""
    logits = torch.zeros(3, 15, 11, dtype=F64, requires_grad=True)  # uniform: CE = log 11 everywhere
    loss = dflash_block_ce(logits, torch.zeros(3, 15, dtype=torch.long), torch.ones(3, 15, dtype=torch.bool), beta=7.0)
    assert torch.allclose(loss, math.log(11) * dflash_slot_weights(15, 7.0, dtype=F64).sum())
    assert 6.5 < dflash_slot_weights(15, 7.0, dtype=F64).sum().item() < 6.7


def test_dflash_block_ce_empty_is_zero_with_finite_grad():
    b = batch()
    loss = dflash_block_ce(b["draft_logits"], b["targets"], torch.zeros(N, S, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(b["draft_logits"].grad, torch.zeros_like(b["draft_logits"]))


# --- oracle-prefix masking -------------------------------------------------------------------


@pytest.mark.parametrize("use_margin", [False, True])
def test_block_missing_first_slot_contributes_nothing(use_margin):
    b = batch()
    weights = ObjectiveWeights(use_margin=use_margin)
    full = lilicorr_objective(**b, weights=weights)
    assert not full.prefix[0].any()
    reranker = full.ce + full.dist + (full.margin if use_margin else 0)
    reranker.backward()
    assert torch.equal(b["start"].grad[0], torch.zeros(K, dtype=F64))
    assert torch.equal(b["pair"].grad[0], torch.zeros(S - 1, K, K, dtype=F64))
    assert b["start"].grad[1:].abs().sum() > 0
    # dropping the row changes nothing: the mean runs over supervised slots only
    rest = {k: (v[1:].detach() if torch.is_tensor(v) else v) for k, v in b.items()}
    part = lilicorr_objective(**rest, weights=weights)
    for name in ("ce", "dist") + (("margin",) if use_margin else ()):
        assert torch.allclose(getattr(full, name), getattr(part, name)), name
    # slots after the first miss (row 2, slots 3..) reach no score either
    assert torch.equal(b["pair"].grad[2, 2:], torch.zeros(S - 3, K, K, dtype=F64))


def test_empty_oracle_prefix_gives_zero_finite_gradient():
    b = batch()
    b["candidate_ids"] = b["candidate_ids"] + V  # no target is ever a candidate
    b["target_log_probs"] = torch.full((N, S, K), -math.inf, dtype=F64)  # even garbage costs
    out = lilicorr_objective(**b, weights=ObjectiveWeights(use_margin=True))
    assert out.ce.item() == out.dist.item() == out.margin.item() == 0.0
    (out.ce + out.dist + out.margin).backward()
    for t in (b["start"], b["pair"]):
        assert t.grad is not None and torch.equal(t.grad, torch.zeros_like(t))


def test_garbage_off_the_prefix_never_reaches_loss_or_gradient():
    g = gen(3)
    z = torch.randn(N, S, K, generator=g, dtype=F64)
    gt = torch.randint(0, K, (N, S), generator=g)
    log_q = torch.randn(N, S, K, generator=g, dtype=F64)
    prefix = torch.tensor([[True] * S, [True, True] + [False] * (S - 2), [False] * S])
    clean = [f(z, gt, prefix) for f in (reranker_ce, margin_hinge)] + [distractor_penalty(z, gt, log_q, prefix)]
    z, log_q = z.clone(), log_q.clone()
    z[~prefix] = math.nan
    log_q[~prefix] = math.nan
    gt[~prefix] = -1
    z.requires_grad_(True)
    dirty = [f(z, gt, prefix) for f in (reranker_ce, margin_hinge)] + [distractor_penalty(z, gt, log_q, prefix)]
    for a, b in zip(clean, dirty):
        assert torch.allclose(a, b)
    sum(dirty).backward()
    assert torch.isfinite(z.grad).all() and torch.equal(z.grad[~prefix], torch.zeros_like(z.grad[~prefix]))


# --- reranker cross-entropy (Eq. 3) ----------------------------------------------------------


def test_ce_gradient_on_ground_truth_is_p_minus_one():
    z, gt, prefix, _ = single_slot([0.3, -1.2, 2.0, 0.7], g=1)
    loss = reranker_ce(z, gt, prefix)
    loss.backward()
    p = z.detach().softmax(-1)[0, 0]
    assert torch.allclose(loss, -p[1].log())
    assert torch.allclose(z.grad[0, 0, 1], p[1] - 1)
    assert torch.allclose(z.grad[0, 0], p - torch.nn.functional.one_hot(torch.tensor(1), 4).to(F64))


# --- distractor penalty (Eqs. 4-5, App. D) ---------------------------------------------------


def test_distractor_gradient_equals_expected_target_cost_when_g_is_best():
    g = gen(1)
    z = torch.randn(N, S, K, generator=g, dtype=F64, requires_grad=True)
    gt = torch.randint(0, K, (N, S), generator=g)
    log_q = torch.randn(N, S, K, generator=g, dtype=F64).log_softmax(-1)
    log_q.scatter_(-1, gt.unsqueeze(-1), 0.5)  # g is the target's best in the pool
    prefix = torch.ones(N, S, dtype=torch.bool)
    (grad_omega,) = torch.autograd.grad(distractor_penalty(z, gt, log_q, prefix), z)
    cross_entropy = (z.softmax(-1) * -log_q).sum(-1).mean()  # H(P, q) averaged over |S|
    (grad_h,) = torch.autograd.grad(cross_entropy, z)
    assert torch.allclose(grad_omega, grad_h, atol=1e-12)
    # and Omega = H(P, q) - c_g (Eq. omega-ce)
    c_g = -log_q.gather(-1, gt.unsqueeze(-1)).mean()
    assert torch.allclose(distractor_penalty(z, gt, log_q, prefix), cross_entropy - c_g)


def test_distractor_gradient_on_ground_truth():
    # g = 2 is not the target's best: the rectifier clips candidate 0's negative cost
    z, gt, prefix, log_q = single_slot([0.4, 1.1, -0.3, 0.9, -2.0], 2, [-0.5, -3.0, -1.0, -2.2, -7.0])
    omega = distractor_penalty(z, gt, log_q, prefix)
    omega.backward()
    p = z.detach().softmax(-1)[0, 0]
    w = (log_q[0, 0, 2] - log_q[0, 0]).relu()
    assert w[0] == 0 and w[2] == 0
    assert torch.allclose(omega, (p * w).sum())
    assert torch.allclose(z.grad[0, 0, 2], -p[2] * (p * w).sum())  # -P(g) E_P[w]
    assert torch.allclose(z.grad[0, 0], p * (w - (p * w).sum()))  # full softmax-linear gradient


def test_distractor_unchanged_by_renormalising_q_over_pool():
    g = gen(2)
    z = torch.randn(N, S, K, generator=g, dtype=F64)
    gt = torch.randint(0, K, (N, S), generator=g)
    prefix = torch.rand(N, S, generator=g) < 0.7
    log_q = torch.randn(N, S, K, generator=g, dtype=F64) - 5.0
    base = distractor_penalty(z, gt, log_q, prefix)
    pooled = log_q - log_q.logsumexp(-1, keepdim=True)
    shifted = log_q + torch.randn(N, S, 1, generator=g, dtype=F64) * 10  # raw logits work too
    assert torch.allclose(base, distractor_penalty(z, gt, pooled, prefix))
    assert torch.allclose(base, distractor_penalty(z, gt, shifted, prefix))


def test_target_log_probs_are_constants():
    z, gt, prefix, log_q = single_slot([0.1, 0.2, 0.3], 0, [-1.0, -2.0, -3.0])
    log_q.requires_grad_(True)
    loss = distractor_penalty(z, gt, log_q, prefix)
    assert loss.requires_grad
    loss.backward()
    assert log_q.grad is None and z.grad is not None


def test_zero_probability_candidate_stays_finite():
    z, gt, prefix, log_q = single_slot([0.1, 0.2, 0.3], 0, [-1.0, -math.inf, -3.0])
    loss = distractor_penalty(z, gt, log_q, prefix)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()


# --- margin hinge (App. G) -------------------------------------------------------------------


def test_hinge_inactive_once_gap_clears_rho():
    z, gt, prefix, _ = single_slot([1.0, 3.5, 1.5, -1.0], g=1)  # gap 2.0 = rho
    loss = margin_hinge(z, gt, prefix, rho=2.0)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(z.grad, torch.zeros_like(z))


def test_hinge_active_inside_margin():
    z, gt, prefix, _ = single_slot([1.0, 2.5, 1.8, -1.0], g=1)  # gap 0.7
    loss = margin_hinge(z, gt, prefix, rho=2.0)
    loss.backward()
    assert loss.item() == pytest.approx(1.3)
    assert z.grad[0, 0].tolist() == [0.0, -1.0, 1.0, 0.0]


def test_hinge_with_single_candidate_is_zero():
    z, gt, prefix, _ = single_slot([0.7], g=0)
    loss = margin_hinge(z, gt, prefix)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(z.grad, torch.zeros_like(z))


# --- the total (Eq. 7 and the margin blend) --------------------------------------------------


def test_gamma_zero_is_plain_dflash():
    b = batch()
    dflash = dflash_block_ce(b["draft_logits"], b["targets"], b["valid"], beta=7.0)
    out = lilicorr_objective(b["draft_logits"], b["targets"], b["valid"], weights=ObjectiveWeights(gamma=0.0))
    assert out.total is out.dflash and torch.equal(out.total, dflash)
    assert out.ce is None and out.dist is None and out.margin is None
    full = lilicorr_objective(**b, weights=ObjectiveWeights(gamma=0.0))
    assert torch.equal(full.total, dflash)
    assert set(full.scalars()) == {"total", "dflash"}


def test_total_formulas():
    b = batch()
    w = ObjectiveWeights(gamma=0.25, lam=1.5)
    out = lilicorr_objective(**b, weights=w)
    assert out.margin is None
    assert torch.allclose(out.total, out.dflash + 0.25 * (out.ce + 1.5 * out.dist))
    wm = ObjectiveWeights(gamma=0.25, lam=1.5, use_margin=True, mu=0.5, rho=2.0)
    m = lilicorr_objective(**b, weights=wm)
    expect = m.dflash + 0.25 * (0.5 * m.ce + 1.5 * m.dist + 0.5 * m.margin)
    assert torch.allclose(m.total, expect)
    assert torch.allclose(m.margin, margin_hinge(m.z, m.gt_index, m.prefix, rho=2.0))
    assert torch.allclose(out.ce, m.ce) and torch.allclose(out.dist, m.dist)
    m.total.backward()
    for t in (b["start"], b["pair"], b["draft_logits"]):
        assert torch.isfinite(t.grad).all()


def test_bf16_scores_are_computed_in_fp32():
    b = batch(dtype=torch.bfloat16)
    b["target_log_probs"] = b["target_log_probs"].float()
    out = lilicorr_objective(**b, weights=ObjectiveWeights(use_margin=True))
    assert out.total.dtype == torch.float32 and torch.isfinite(out.total)
    out.total.backward()
    assert b["pair"].grad.dtype == torch.bfloat16


# --- metrics ---------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    b = batch()
    with pytest.raises(ObjectiveInputError, match="pair: expected shape"):
        teacher_forced_scores(b["start"], b["pair"][:, :, :2], torch.zeros(N, S, dtype=torch.int64))
    with pytest.raises(ObjectiveInputError, match="valid: expected a bool"):
        oracle_prefix(b["candidate_ids"], b["targets"], b["valid"].int())
    with pytest.raises(ObjectiveInputError, match="targets: expected shape"):
        dflash_block_ce(b["draft_logits"], b["targets"][:, :-1], b["valid"])
    with pytest.raises(ObjectiveInputError, match="target_log_probs: expected shape"):
        distractor_penalty(
            torch.zeros(N, S, K), torch.zeros(N, S, dtype=torch.int64), torch.zeros(N, S, K + 1), b["valid"]
        )
    with pytest.raises(ObjectiveInputError, match="needs candidate_ids, start, pair, target_log_probs"):
        lilicorr_objective(b["draft_logits"], b["targets"], b["valid"])
    with pytest.raises(ObjectiveInputError, match="ObjectiveWeights.mu"):
        ObjectiveWeights(mu=1.5)
    with pytest.raises(ObjectiveInputError, match="rho"):
        margin_hinge(
            torch.zeros(1, 1, 2), torch.zeros(1, 1, dtype=torch.int64), torch.ones(1, 1, dtype=torch.bool), rho=0.0
        )


# --- parameters off their symmetric defaults (mutation testing) -----------------------------------------


def test_paper_defaults():
    assert ObjectiveWeights() == ObjectiveWeights(beta=7.0, gamma=0.25, lam=1.0, use_margin=False, mu=0.5, rho=2.0)
    b = batch()
    assert torch.equal(
        dflash_block_ce(b["draft_logits"], b["targets"], b["valid"]),
        dflash_block_ce(b["draft_logits"], b["targets"], b["valid"], beta=7.0),
    )
    z, gt, prefix, _ = single_slot([1.0, 2.5, 1.8, -1.0], g=1)
    assert margin_hinge(z, gt, prefix).item() == pytest.approx(1.3)


@pytest.mark.parametrize(
    "gamma,lam,mu,rho,beta",
    [(0.4, 0.7, 0.3, 1.5, 3.0), (1.3, 0.0, 0.8, 0.4, 11.0), (0.1, 2.0, 0.0, 2.5, 0.5), (0.7, 0.2, 1.0, 3.0, 7.0)],
)
def test_total_formulas_off_the_defaults(gamma, lam, mu, rho, beta):
    """mu away from 0.5 tells (1 - mu) CE from mu CE; every weight reaches the total with its own value."""
    b = batch(seed=3)
    out = lilicorr_objective(**b, weights=ObjectiveWeights(gamma=gamma, lam=lam, beta=beta))
    m = lilicorr_objective(
        **b, weights=ObjectiveWeights(gamma=gamma, lam=lam, use_margin=True, mu=mu, rho=rho, beta=beta)
    )
    gt, prefix = oracle_prefix(b["candidate_ids"], b["targets"], b["valid"])
    z = teacher_forced_scores(b["start"], b["pair"], gt)
    dflash = dflash_block_ce(b["draft_logits"], b["targets"], b["valid"], beta=beta)
    ce, dist = reranker_ce(z, gt, prefix), distractor_penalty(z, gt, b["target_log_probs"], prefix)
    margin = margin_hinge(z, gt, prefix, rho=rho)
    assert torch.allclose(out.total, dflash + gamma * (ce + lam * dist))
    assert torch.allclose(m.total, dflash + gamma * ((1 - mu) * ce + lam * dist + mu * margin))
    assert torch.allclose(m.margin, margin) and torch.equal(m.gt_index, gt) and torch.equal(m.prefix, prefix)
    assert m.scalars() == pytest.approx(
        {
            "total": m.total.item(),
            "dflash": dflash.item(),
            "ce": ce.item(),
            "dist": dist.item(),
            "margin": margin.item(),
        }
    )


def test_single_slot_values_by_hand():
    """CE, distractor and hinge of one slot computed by hand, rho off 2 and a log q with a zero-probability
    candidate (floored at LOG_Q_FLOOR)."""
    from sglang_lilicorr.losses import LOG_Q_FLOOR

    zr = [0.3, -0.2, 1.1, 0.4]
    z, gt, prefix, log_q = single_slot(zr, 2, [-2.0, -math.inf, -0.5, -0.1])
    p = torch.tensor(zr, dtype=F64).softmax(-1)
    assert reranker_ce(z, gt, prefix).item() == pytest.approx(-math.log(p[2].item()))
    cost = [1.5, -0.5 - LOG_Q_FLOOR, 0.0, 0.0]  # relu(log q_g - log q_k)
    assert distractor_penalty(z, gt, log_q, prefix).item() == pytest.approx(
        sum(pi * c for pi, c in zip(p.tolist(), cost))
    )
    assert LOG_Q_FLOOR == -1.0e4
    assert margin_hinge(z, gt, prefix, rho=1.0).item() == pytest.approx(1.0 - 0.7)
    assert margin_hinge(z, gt, prefix, rho=0.5).item() == 0.0
    # a negative ground-truth index (off the prefix) is clamped, never used
    z2, _, _, _ = single_slot(zr, 0)
    assert reranker_ce(z2, torch.tensor([[-1]]), torch.zeros(1, 1, dtype=torch.bool)).item() == 0.0


WANTED = {
    "beta": "> 0 (paper: 7.0)",
    "gamma": ">= 0 (paper: 0.25; 0 = plain DFlash)",
    "lam": ">= 0 (paper: 1.0)",
    "mu": "in [0, 1] (paper: 0.5)",
    "rho": "> 0 (paper: 2.0)",
}


@pytest.mark.parametrize(
    "name,bad,good",
    [
        ("beta", 0.0, 1e-3),
        ("gamma", -0.1, 0.0),
        ("lam", -0.1, 0.0),
        ("mu", -0.1, 0.0),
        ("mu", 1.1, 1.0),
        ("rho", 0.0, 1e-3),
        ("beta", math.inf, 7.0),
        ("lam", math.nan, 1.0),
    ],
)
def test_each_weight_refusal(name, bad, good):
    with pytest.raises(ObjectiveInputError) as refused:
        ObjectiveWeights(**{name: bad})
    assert str(refused.value) == f"ObjectiveWeights.{name}={bad!r}: expected {WANTED[name]}."
    assert getattr(ObjectiveWeights(**{name: good}), name) == good


def test_slot_weights_refuse_a_non_positive_beta():
    for beta in (0.0, -1.0, math.nan):
        with pytest.raises(ObjectiveInputError, match="beta"):
            dflash_slot_weights(3, beta)
    assert dflash_slot_weights(3, 0.5, dtype=F64).tolist() == pytest.approx([1.0, math.exp(-2.0), math.exp(-4.0)])


# --- oracle.py: each input refusal, and the edges of coverage and teacher forcing ---------------


def test_expect_refuses_each_way_a_tensor_can_be_wrong():
    from sglang_lilicorr.oracle import expect

    expect(torch.zeros(2, 3, dtype=torch.int32), "x", (2, None), "int")
    expect(torch.zeros(2, 3), "x", (None, 3))
    for bad, shape, kind, match in (
        ([1, 2], (2,), None, "x: expected a torch.Tensor, got list"),
        (torch.zeros(2, 3), (2, 3, 1), None, r"x: expected shape \[2, 3, 1\], got \[2, 3\]"),
        (torch.zeros(2, 3), (None, 4), None, r"x: expected shape \[\*, 4\], got \[2, 3\]"),
        (torch.zeros(2, 3), (2, 3), "int", "expected a int tensor, got dtype torch.float32"),
        (torch.zeros(2, dtype=torch.bool), (2,), "int", "expected a int tensor"),
        (torch.zeros(2, dtype=torch.complex64), (2,), "int", "expected a int tensor"),
        (torch.zeros(2, dtype=torch.int64), (2,), "bool", "expected a bool tensor"),
        (torch.zeros(2, dtype=torch.int64), (2,), "float", "expected a float tensor"),
    ):
        with pytest.raises(ObjectiveInputError, match=match):
            expect(bad, "x", shape, kind)


def test_coverage_edges_and_teacher_forcing_off_the_prefix():
    cov = oracle_prefix_coverage(torch.zeros(0, 3, dtype=torch.bool), torch.zeros(0, 3, dtype=torch.bool))
    assert cov["mean_prefix_len"].item() == 0.0 and cov["supervised_fraction"].item() == 0.0
    prefix = torch.tensor([[True, False, False], [True, True, False]])
    cov = oracle_prefix_coverage(prefix, torch.tensor([[True, True, False], [True, True, True]]))
    assert cov["mean_prefix_len"].item() == 1.5 and cov["supervised_fraction"].item() == pytest.approx(3 / 5)
    start = torch.arange(6, dtype=torch.float32).view(2, 3)
    pair = torch.arange(2 * 2 * 3 * 3, dtype=F64).view(2, 2, 3, 3)
    z = teacher_forced_scores(start, pair, torch.tensor([[2, -1, 1], [0, 1, 2]]))
    assert z.dtype == F64
    assert z[0].tolist() == [[0.0, 1.0, 2.0], pair[0, 0, 2].tolist(), pair[0, 1, 0].tolist()]  # -1 reads row 0
    assert z[1].tolist() == [[3.0, 4.0, 5.0], pair[1, 0, 0].tolist(), pair[1, 1, 1].tolist()]
    gt, prefix = oracle_prefix(torch.tensor([[[4, 5], [6, 7]]]), torch.tensor([[5, 6]]), torch.tensor([[False, True]]))
    assert gt.tolist() == [[-1, 0]] and prefix.tolist() == [[False, False]]  # an invalid slot is not covered


def test_validated_weights_cannot_change_and_padding_ids_need_not_be_tokens():
    import dataclasses

    w = ObjectiveWeights(mu=0.3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.mu = 7.0  # would skip the validation
    # padding slots may hold any id, even where the vocabulary has a single token (id 0)
    logits = torch.tensor([[[2.0], [5.0]]], dtype=F64, requires_grad=True)
    loss = dflash_block_ce(logits, torch.tensor([[0, 123]]), torch.tensor([[True, False]]))
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(logits.grad).all()


def _corrector_case(gen):
    n, s, v = 3, 5, 7  # N != S, so a mask built over the wrong axis cannot pass
    draft = torch.randn(n, s, v, generator=gen)
    step = torch.randn(n, s, v, generator=gen)
    targets = torch.randint(0, v, (n, s), generator=gen)
    targets[0, :3] = step[0, :3].argmax(-1)  # some slots the head gets right, so accepted holds both labels
    valid = torch.ones(n, s, dtype=torch.bool)
    valid[1, 3:] = False
    valid[2, 0] = False
    confidence = torch.randn(n, s, generator=gen)
    return draft, step, targets, valid, confidence


@pytest.mark.parametrize("corrected_from", [0, 1, 2])
def test_corrector_objective_values(gen, corrected_from):
    """L_dflash + gamma * (L_step + L_conf), each term computed here from its definition: L_step the decayed block CE
    over the valid slots from `corrected_from` on, L_conf the mean over valid slots of the BCE of the confidence
    against "the head's argmax is the target"."""
    draft, step, targets, valid, confidence = _corrector_case(gen)
    weights = ObjectiveWeights(gamma=0.3, beta=3.0)
    slot = torch.arange(valid.shape[1])[None, :].expand_as(valid)
    head_valid = valid & (slot >= corrected_from)
    want_step = dflash_block_ce(step, targets, head_valid, weights.beta)
    accepted = (step.argmax(-1) == targets).float()
    bce = -(
        accepted * torch.nn.functional.logsigmoid(confidence)
        + (1 - accepted) * torch.nn.functional.logsigmoid(-confidence)
    )
    want_conf = bce[valid].mean()
    want_dflash = dflash_block_ce(draft, targets, valid, weights.beta)

    got = corrector_objective(
        draft, step, targets, valid, weights, corrected_from=corrected_from, confidence=confidence
    )
    assert torch.allclose(got.dflash, want_dflash) and torch.allclose(got.ce, want_step)
    assert torch.allclose(got.confidence, want_conf)
    assert torch.allclose(got.total, want_dflash + 0.3 * (want_step + want_conf))
    if corrected_from == 0:  # the default corrects every slot
        default = corrector_objective(draft, step, targets, valid, weights, confidence=confidence)
        assert torch.equal(default.ce, got.ce)

    plain = corrector_objective(draft, step, targets, valid, weights, corrected_from=corrected_from)
    assert plain.confidence is None and torch.allclose(plain.total, want_dflash + 0.3 * want_step)


def test_corrector_objective_with_no_valid_slot_is_finite(gen):
    draft, step, targets, valid, confidence = _corrector_case(gen)
    none = torch.zeros_like(valid)
    got = corrector_objective(draft, step, targets, none, ObjectiveWeights(), confidence=confidence)
    assert torch.isfinite(got.total) and got.confidence.item() == 0.0


# --- what mutation testing found untested: each refusal's whole message, index dtypes, devices -------


def _arguments():
    """One valid value of every tensor argument of the loss and oracle functions."""
    b = batch()
    gt, prefix = oracle_prefix(b["candidate_ids"], b["targets"], b["valid"])
    return dict(
        b,
        z=teacher_forced_scores(b["start"], b["pair"], gt),
        gt_index=gt,
        prefix=prefix,
        step_logits=b["draft_logits"],
        confidence=torch.zeros(N, S, dtype=F64),
    )


CALLS = {
    "dflash_block_ce": lambda a: dflash_block_ce(a["draft_logits"], a["targets"], a["valid"]),
    "reranker_ce": lambda a: reranker_ce(a["z"], a["gt_index"], a["prefix"]),
    "distractor_penalty": lambda a: distractor_penalty(a["z"], a["gt_index"], a["target_log_probs"], a["prefix"]),
    "lilicorr_objective": lambda a: lilicorr_objective(
        a["draft_logits"], a["targets"], a["valid"], a["candidate_ids"], a["start"], a["pair"], a["target_log_probs"]
    ),
    "corrector_objective": lambda a: corrector_objective(
        a["draft_logits"], a["step_logits"], a["targets"], a["valid"], ObjectiveWeights(), confidence=a["confidence"]
    ),
    "oracle_prefix": lambda a: oracle_prefix(a["candidate_ids"], a["targets"], a["valid"]),
    "teacher_forced_scores": lambda a: teacher_forced_scores(a["start"], a["pair"], a["gt_index"]),
    "oracle_prefix_coverage": lambda a: oracle_prefix_coverage(a["prefix"], a["valid"]),
}
WRONG = {"float": torch.int64, "int": torch.float32, "bool": torch.uint8}  # a dtype each kind refuses


@pytest.mark.parametrize(
    "call,argument,kind",
    [
        ("dflash_block_ce", "draft_logits", "float"),
        ("dflash_block_ce", "targets", "int"),
        ("dflash_block_ce", "valid", "bool"),
        ("reranker_ce", "z", "float"),
        ("reranker_ce", "gt_index", "int"),
        ("reranker_ce", "prefix", "bool"),
        ("distractor_penalty", "target_log_probs", "float"),
        ("lilicorr_objective", "candidate_ids", "int"),
        ("lilicorr_objective", "start", "float"),
        ("corrector_objective", "confidence", "float"),
        ("oracle_prefix", "candidate_ids", "int"),
        ("oracle_prefix", "targets", "int"),
        ("oracle_prefix", "valid", "bool"),
        ("teacher_forced_scores", "start", "float"),
        ("teacher_forced_scores", "pair", "float"),
        ("teacher_forced_scores", "gt_index", "int"),
        ("oracle_prefix_coverage", "prefix", "bool"),
        ("oracle_prefix_coverage", "valid", "bool"),
    ],
)
def test_each_tensor_of_the_wrong_kind_is_refused_by_name(call, argument, kind):
    a = _arguments()
    a[argument] = a[argument].detach().to(WRONG[kind])
    with pytest.raises(ObjectiveInputError) as refused:
        CALLS[call](a)
    name = {"draft_logits": "logits", "step_logits": "logits"}.get(argument, argument)
    assert str(refused.value) == f"{name}: expected a {kind} tensor, got dtype {WRONG[kind]}; cast it first."


def test_the_first_bad_argument_is_the_one_named():
    a = _arguments()
    a["candidate_ids"], a["start"] = a["candidate_ids"].float(), a["start"].detach().long()
    with pytest.raises(ObjectiveInputError, match="^candidate_ids: expected a int tensor"):
        CALLS["lilicorr_objective"](a)


def test_whole_messages_of_a_shape_and_a_missing_input():
    from sglang_lilicorr.oracle import expect

    with pytest.raises(ObjectiveInputError) as refused:
        expect(torch.zeros(2, 3), "x", (2, None, 1))
    assert str(refused.value) == (
        "x: expected shape [2, *, 1], got [2, 3]; check the N (rows), S (drafted slots = "
        "block_size-1) and K (candidates) axes."
    )
    b = batch()
    with pytest.raises(ObjectiveInputError) as refused:
        lilicorr_objective(
            b["draft_logits"], b["targets"], b["valid"], start=b["start"], weights=ObjectiveWeights(gamma=0.5)
        )
    assert str(refused.value) == (
        "lilicorr_objective: gamma=0.5 needs candidate_ids, pair, target_log_probs; pass them or "
        "set ObjectiveWeights(gamma=0) for plain DFlash."
    )


def test_narrow_index_dtypes_give_the_int64_values():
    """An int16 or int32 index tensor (the "int" kind) is widened before it indexes: the same values as int64."""
    a = _arguments()
    want = {
        name: CALLS[name](a)
        for name in ("dflash_block_ce", "reranker_ce", "distractor_penalty", "teacher_forced_scores")
    }
    want["margin_hinge"] = margin_hinge(a["z"], a["gt_index"], a["prefix"], rho=1.5)
    for dtype in (torch.int16, torch.int32):
        narrow = dict(a, targets=a["targets"].to(dtype), gt_index=a["gt_index"].to(dtype))
        for name in ("dflash_block_ce", "reranker_ce", "distractor_penalty", "teacher_forced_scores"):
            assert torch.equal(CALLS[name](narrow), want[name]), (name, dtype)
        assert torch.equal(
            margin_hinge(narrow["z"], narrow["gt_index"], narrow["prefix"], rho=1.5), want["margin_hinge"]
        )


def test_score_dtypes_follow_the_scores():
    """teacher_forced_scores returns pair's dtype (start is cast to it); distractor_penalty computes in z's dtype
    (fp32 log q for fp32 scores even when given fp64)."""
    a = _arguments()
    z = teacher_forced_scores(a["start"].detach(), a["pair"].detach().float(), a["gt_index"])
    assert z.dtype == torch.float32 and torch.equal(z[:, 0], a["start"].detach().float())
    omega = distractor_penalty(a["z"].detach().float(), a["gt_index"], a["target_log_probs"], a["prefix"])
    assert omega.dtype == torch.float32


def test_block_ce_weights_in_the_logits_dtype():
    """fp64 logits get fp64 slot weights: the loss matches an fp64 computation to rounding, not to fp32's 1e-8."""
    b = batch()
    logits = b["draft_logits"].detach()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, V), b["targets"].reshape(-1), reduction="none").view(N, S)
    want = (ce * torch.exp(-torch.arange(S, dtype=F64) / 3.0)).sum() / N
    torch.testing.assert_close(dflash_block_ce(logits, b["targets"], b["valid"], beta=3.0), want, rtol=1e-14, atol=0)


def test_hinge_rival_is_per_slot():
    z = torch.tensor([[[3.0, 1.0, 0.0], [0.0, 0.5, 4.0]]], dtype=F64)  # slot 2's rival 4.0 is above slot 1's (1.0)
    gt, prefix = torch.tensor([[0, 1]]), torch.ones(1, 2, dtype=torch.bool)
    assert margin_hinge(z, gt, prefix, rho=2.0).item() == pytest.approx((0.0 + 5.5) / 2)


def test_means_over_a_single_valid_slot():
    one = torch.tensor([[True, False]])
    assert oracle_prefix_coverage(one, one)["supervised_fraction"].item() == 1.0
    step = torch.tensor([[[2.0, 0.0], [0.0, 1.0]]])
    out = corrector_objective(
        step, step, torch.tensor([[0, 0]]), one, ObjectiveWeights(), confidence=torch.tensor([[0.5, 9.0]])
    )
    assert out.confidence.item() == pytest.approx(math.log1p(math.exp(-0.5)))  # slot 1 accepted: BCE(0.5, 1), alone


def test_every_tensor_stays_on_the_inputs_device():
    m = "meta"
    logits, targets = torch.empty(2, 3, 5, device=m), torch.zeros(2, 3, dtype=torch.long, device=m)
    valid = torch.ones(2, 3, dtype=torch.bool, device=m)
    with DevicesMade() as made:
        dflash_slot_weights(3, 7.0, device=m)
        dflash_block_ce(logits, targets, valid)
        corrector_objective(
            logits, logits, targets, valid, ObjectiveWeights(), corrected_from=1, confidence=torch.empty(2, 3, device=m)
        )
    assert made.devices == {m}
