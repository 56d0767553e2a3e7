"""The joint training objective (paper Eqs. 3-7; App. D, G): L = L_dflash + gamma * (L_CE + lambda L_dist), with the
margin L_dflash + gamma * ((1 - mu) L_CE + lambda L_dist + mu L_margin); the baselines' heads: L_dflash + gamma *
(L_step + L_conf). Reranker terms average over the oracle-prefix slots (oracle.py; none -> exactly 0)."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from .oracle import ObjectiveInputError, expect, oracle_prefix, teacher_forced_scores

# log q floored: a candidate of zero target probability costs a large finite amount, not inf (NaN gradients)
LOG_Q_FLOOR = -1.0e4


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def dflash_slot_weights(num_slots: int, beta: float, device=None, dtype=torch.float32) -> torch.Tensor:
    """w_s = exp(-(s-1)/beta) for slots s = 1..S -> [S] (Eq. 6)."""
    if not beta > 0:
        raise ObjectiveInputError(f"beta={beta!r}: the DFlash decay must be > 0 (paper: 7.0).")
    return torch.exp(-torch.arange(num_slots, device=device, dtype=dtype) / beta)


def dflash_block_ce(
    logits: torch.Tensor,  # [N, S, V] drafter logits at slots 1..S
    targets: torch.Tensor,  # [N, S] ground-truth tokens (any value where not valid)
    valid: torch.Tensor,  # [N, S] bool
    beta: float = 7.0,
) -> torch.Tensor:
    """DFlash block CE (Eq. 6): sum_s w_s * CE_{n,s} over valid slots, mean over blocks with one (none: 0)."""
    expect(logits, "logits", (None, None, None), "float")
    n, s, v = logits.shape
    expect(targets, "targets", (n, s), "int")
    expect(valid, "valid", (n, s), "bool")
    safe_targets = torch.where(valid, targets, 0).to(torch.int64)
    ce = F.cross_entropy(_at_least_fp32(logits).reshape(n * s, v), safe_targets.reshape(-1), reduction="none")
    ce = ce.view(n, s)
    weight = dflash_slot_weights(s, beta, logits.device, ce.dtype).expand(n, s)  # [N, S]
    per_block = torch.where(valid, ce * weight, 0.0).sum(dim=1)  # [N]
    return per_block.sum() / valid.any(dim=1).sum().clamp(min=1)


def _supervised(z: torch.Tensor, gt_index: torch.Tensor, prefix: torch.Tensor):
    """-> (z [N,S,K] >= fp32 with off-prefix rows zeroed (no gradient), g [N,S,1] int64 clamped legal)."""
    expect(z, "z", (None, None, None), "float")
    n, s, _ = z.shape
    expect(gt_index, "gt_index", (n, s), "int")
    expect(prefix, "prefix", (n, s), "bool")
    z = torch.where(prefix.unsqueeze(-1), _at_least_fp32(z), 0.0)
    return z, gt_index.clamp(min=0).to(torch.int64).unsqueeze(-1)


def _prefix_mean(per_slot: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """Mean of per_slot [N, S] over the oracle-prefix slots of the batch; 0 when |S| = 0."""
    return torch.where(prefix, per_slot, 0.0).sum() / prefix.sum().clamp(min=1)


def reranker_ce(z: torch.Tensor, gt_index: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """L_CE (Eq. 3): -1/|S| sum_{s in S} log softmax_k(z_s)[g_s]."""
    z, g = _supervised(z, gt_index, prefix)
    nll = -z.log_softmax(dim=-1).gather(-1, g).squeeze(-1)  # [N, S]
    return _prefix_mean(nll, prefix)


def distractor_penalty(
    z: torch.Tensor,
    gt_index: torch.Tensor,
    target_log_probs: torch.Tensor,  # [N, S, K] target log q_k of each candidate (constant)
    prefix: torch.Tensor,
) -> torch.Tensor:
    """L_dist (Eqs. 4-5): 1/|S| sum_s Omega_s, Omega_s = sum_k softmax(z_s)_k relu(log q_{g_s} - log q_k); any
    per-slot offset of ``target_log_probs`` cancels (raw logits serve, App. D)."""
    z, g = _supervised(z, gt_index, prefix)
    expect(target_log_probs, "target_log_probs", tuple(z.shape), "float")
    log_q = _at_least_fp32(target_log_probs.detach()).to(z.dtype).clamp(min=LOG_Q_FLOOR)
    cost = (log_q.gather(-1, g) - log_q).relu()  # [N, S, K] w_k = relu(c_k - c_g)
    omega = (z.softmax(dim=-1) * cost).sum(dim=-1)  # [N, S]
    return _prefix_mean(omega, prefix)


def margin_hinge(z: torch.Tensor, gt_index: torch.Tensor, prefix: torch.Tensor, rho: float = 2.0) -> torch.Tensor:
    """L_margin (App. G): 1/|S| sum_s relu(rho - (z_s[g] - max_{k != g} z_s[k])); 0 with K = 1."""
    if not rho > 0:
        raise ObjectiveInputError(f"rho={rho!r}: the margin must be > 0 (paper: 2.0).")
    z, g = _supervised(z, gt_index, prefix)
    is_g = torch.zeros_like(z, dtype=torch.bool).scatter_(-1, g, True)
    rival = z.masked_fill(is_g, -math.inf).amax(dim=-1)  # [N, S]
    gap = z.gather(-1, g).squeeze(-1) - rival
    return _prefix_mean((rho - gap).relu(), prefix)


@dataclasses.dataclass(frozen=True)
class ObjectiveWeights:
    """Loss weights (paper Table hparams; App. G for the margin variant)."""

    beta: float = 7.0  # DFlash decay
    gamma: float = 0.25  # weight of the reranker objective
    lam: float = 1.0  # lambda: distractor weight
    use_margin: bool = False  # App. G blend (LiLiCorr-M)
    mu: float = 0.5  # margin share of the hard label
    rho: float = 2.0  # hinge margin

    def __post_init__(self) -> None:
        for name, ok, what in (
            ("beta", self.beta > 0, "> 0 (paper: 7.0)"),
            ("gamma", self.gamma >= 0, ">= 0 (paper: 0.25; 0 = plain DFlash)"),
            ("lam", self.lam >= 0, ">= 0 (paper: 1.0)"),
            ("mu", 0 <= self.mu <= 1, "in [0, 1] (paper: 0.5)"),
            ("rho", self.rho > 0, "> 0 (paper: 2.0)"),
        ):
            if not (ok and math.isfinite(getattr(self, name))):
                raise ObjectiveInputError(f"ObjectiveWeights.{name}={getattr(self, name)!r}: expected {what}.")


@dataclasses.dataclass
class ObjectiveTerms:
    """Every term of the objective; reranker fields are None when gamma = 0 (not computed)."""

    total: torch.Tensor
    dflash: torch.Tensor
    ce: torch.Tensor | None = None
    dist: torch.Tensor | None = None
    margin: torch.Tensor | None = None
    confidence: torch.Tensor | None = None  # DSpark's confidence BCE
    z: torch.Tensor | None = None  # [N, S, K] teacher-forced node scores
    gt_index: torch.Tensor | None = None  # [N, S]
    prefix: torch.Tensor | None = None  # [N, S] oracle prefix

    def scalars(self) -> dict[str, float]:
        """Loss values as floats for logging (terms not computed are left out)."""
        names = ("total", "dflash", "ce", "dist", "margin", "confidence")
        return {k: float(getattr(self, k).detach()) for k in names if getattr(self, k) is not None}


def lilicorr_objective(
    draft_logits: torch.Tensor,  # [N, S, V] drafter logits at slots 1..S
    targets: torch.Tensor,  # [N, S] ground-truth tokens g_s
    valid: torch.Tensor,  # [N, S] bool
    candidate_ids: torch.Tensor | None = None,  # [N, S, K] drafter top-K ids (fixed, no grad)
    start: torch.Tensor | None = None,  # [N, K] head start scores
    pair: torch.Tensor | None = None,  # [N, S-1, K, K] head pair scores
    target_log_probs: torch.Tensor | None = None,  # [N, S, K] target log q at the candidates
    weights: ObjectiveWeights = ObjectiveWeights(),
) -> ObjectiveTerms:
    """Eq. 7 (App. G blend with ``weights.use_margin``); gamma = 0: the DFlash loss (reranker inputs may be None)."""
    dflash = dflash_block_ce(draft_logits, targets, valid, weights.beta)
    if weights.gamma == 0:
        return ObjectiveTerms(total=dflash, dflash=dflash)
    given = {"candidate_ids": candidate_ids, "start": start, "pair": pair, "target_log_probs": target_log_probs}
    missing = [k for k, t in given.items() if t is None]
    if missing:
        raise ObjectiveInputError(
            f"lilicorr_objective: gamma={weights.gamma} needs {', '.join(missing)}; "
            "pass them or set ObjectiveWeights(gamma=0) for plain DFlash."
        )
    n, s = targets.shape
    expect(candidate_ids, "candidate_ids", (n, s, None), "int")
    expect(start, "start", (n, candidate_ids.shape[-1]), "float")
    gt_index, prefix = oracle_prefix(candidate_ids, targets, valid)
    z = teacher_forced_scores(start, pair, gt_index)
    ce = reranker_ce(z, gt_index, prefix)
    dist = distractor_penalty(z, gt_index, target_log_probs, prefix)
    if weights.use_margin:
        margin = margin_hinge(z, gt_index, prefix, weights.rho)
        reranker = (1 - weights.mu) * ce + weights.lam * dist + weights.mu * margin
    else:
        margin = None
        reranker = ce + weights.lam * dist
    total = dflash + weights.gamma * reranker
    return ObjectiveTerms(total, dflash, ce, dist, margin, z=z, gt_index=gt_index, prefix=prefix)


def corrector_objective(
    draft_logits: torch.Tensor,  # [N, S, V] drafter (base) logits at slots 1..S
    step_logits: torch.Tensor,  # [N, S, V] the head's corrected logits, teacher-forced
    targets: torch.Tensor,  # [N, S] ground-truth tokens
    valid: torch.Tensor,  # [N, S] bool
    weights: ObjectiveWeights,
    corrected_from: int = 0,  # first slot index (0-based) the head corrects
    confidence: torch.Tensor | None = None,  # [N, S] raw confidence logits (DSpark)
) -> ObjectiveTerms:
    """L_dflash + gamma * (L_step + L_conf) (module docstring; Sec. 4, Baselines); `ce` holds L_step."""
    dflash = dflash_block_ce(draft_logits, targets, valid, weights.beta)
    head_valid = valid & (torch.arange(valid.shape[1], device=valid.device) >= corrected_from)
    step = dflash_block_ce(step_logits, targets, head_valid, weights.beta)
    head, conf = step, None
    if confidence is not None:
        expect(confidence, "confidence", tuple(targets.shape), "float")
        accepted = (step_logits.detach().argmax(-1) == targets).to(torch.float32)
        bce = F.binary_cross_entropy_with_logits(_at_least_fp32(confidence), accepted, reduction="none")
        conf = torch.where(valid, bce, 0.0).sum() / valid.sum().clamp(min=1)
        head = step + conf
    return ObjectiveTerms(total=dflash + weights.gamma * head, dflash=dflash, ce=step, confidence=conf)
