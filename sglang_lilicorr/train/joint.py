"""One joint forward of drafter + head on a batch (paper Sec. 3.4, Eq. 7): target features -> drafter over N blocks a
sequence -> slot hidden [R, S, Hm] -> LM head -> logits -> the torch-route proposal pipeline (candidates, start/pair
scores with grad, draft) -> losses.lilicorr_objective; a Domino or DSpark head is teacher-forced
(losses.corrector_objective). The anchor hidden is the projected context row before the anchor, as served."""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch import nn

from ..baselines import DominoHead
from ..drafter import DFlashDrafter, block_layout
from ..fast_path.pipeline import head_forward, propose
from ..fast_path.plan import Device, torch_plan
from ..frozen_target import FrozenTarget
from ..head import LiLiCorrHead
from ..losses import ObjectiveTerms, ObjectiveWeights, corrector_objective, lilicorr_objective
from ..oracle import oracle_prefix_coverage
from .timing import PhaseTimer


@dataclasses.dataclass
class JointOutput:
    terms: ObjectiveTerms
    draft_hits: torch.Tensor  # [S] drafter argmax == ground truth, per slot (valid slots)
    valid_counts: torch.Tensor  # [S] valid slots
    reranker_hits: torch.Tensor | None  # [S] head's argmax == truth (LiLiCorr: on the oracle prefix; teacher-forced)
    prefix_counts: torch.Tensor | None  # [S] the slots reranker_hits counts over
    coverage: dict[str, torch.Tensor]  # oracle-prefix coverage (empty without a LiLiCorr head)
    accept_draft: torch.Tensor  # [R] acceptance length of the drafter's argmax, greedy target
    accept_walk: torch.Tensor | None  # [R] acceptance length of the head's proposal (LiLiCorr: its greedy walk)
    head_name: str = "lilicorr_walk"  # the metric name of accept_walk: lilicorr_walk, domino or dspark

    @property
    def blocks(self) -> int:
        return int(self.accept_draft.shape[0])

    def metrics(self) -> dict[str, float]:
        return pooled_metrics([self])


def metric_sums(outputs: list[JointOutput]) -> dict[str, tuple[float, float]]:
    """Every metric of several forwards as (numerator, denominator) sums, which other ranks' add to."""
    sums: dict[str, tuple[float, float]] = {}

    def add(name: str, numerator: float, denominator: float) -> None:
        n, d = sums.get(name, (0.0, 0.0))
        sums[name] = (n + numerator, d + denominator)

    for o in outputs:
        w = max(o.blocks, 1)
        for k, v in o.terms.scalars().items():
            add(f"loss/{k}", v * w, w)
        for k, v in o.coverage.items():
            add(f"coverage/{k}", float(v) * w, w)
        for name, hits, counts in (
            ("draft", o.draft_hits, o.valid_counts),
            ("reranker", o.reranker_hits, o.prefix_counts),
        ):
            if hits is not None:
                for s, (h, c) in enumerate(zip(hits.tolist(), counts.tolist())):
                    add(f"top1_{name}/slot{s + 1}", h, c)
        for name, accept in (("draft_argmax", o.accept_draft), (o.head_name, o.accept_walk)):
            if accept is not None:
                add(f"accept_len/{name}", float(accept.sum()), accept.numel())
    return sums


def ratios(sums: dict[str, tuple[float, float]]) -> dict[str, float]:
    """metric_sums -> the metrics (NaN where nothing was counted)."""
    return {k: n / d if d else float("nan") for k, (n, d) in sums.items()}


def pooled_metrics(outputs: list[JointOutput]) -> dict[str, float]:
    """Metrics of several forwards as one (metric_sums)."""
    return ratios(metric_sums(outputs))


def acceptance_length(drafted: torch.Tensor, greedy: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Tokens a greedy target commits per block (1 + the drafts matching its choices): [R, S] x3 -> [R] int64."""
    return 1 + ((drafted == greedy) & valid).long().cumprod(dim=1).sum(dim=1)


class JointModel(nn.Module):
    """The trainable modules (drafter, optional head); the frozen target is a plain attribute, unseen by DDP."""

    def __init__(self, drafter: DFlashDrafter, head: nn.Module | None, target: FrozenTarget) -> None:
        super().__init__()
        self.drafter, self.head, self.target = drafter, head, target
        self.timer: PhaseTimer | None = None  # set by the trainer to time the forward's phases
        target.check_fits(drafter.config.hidden_size, drafter.config.vocab_size)

    @property
    def trains_drafter(self) -> bool:
        """False when the drafter is frozen (--train head): its forward then keeps no graph."""
        return any(p.requires_grad for p in self.drafter.parameters())

    def mark(self, phase: str) -> None:
        if self.timer is not None:
            self.timer.mark(phase)

    def forward(
        self,
        input_ids: torch.Tensor,  # [b, T]
        attention_mask: torch.Tensor,  # [b, T] 1 = real token
        loss_mask: torch.Tensor,  # [b, T] bool, response tokens
        anchors: torch.Tensor,  # [b, N]
        anchor_valid: torch.Tensor,  # [b, N] bool
        weights: ObjectiveWeights,
    ) -> JointOutput:
        cfg = self.drafter.config
        b, t = input_ids.shape
        bsz, slots = cfg.block_size, cfg.num_slots
        if weights.gamma > 0 and self.head is None:
            raise ValueError("gamma > 0 needs a head; build the JointModel with one (or set gamma = 0).")
        features, final_hidden = self.target.run(input_ids, attention_mask)
        self.mark("target")
        lay = block_layout(input_ids, loss_mask, anchors, anchor_valid, bsz, cfg.mask_token_id)

        with contextlib.nullcontext() if self.trains_drafter else torch.no_grad():  # --train head: no drafter graph
            context = self.drafter.project_target_hidden(features)  # [b, T, Hm]
            embeds = self.target.embed(lay.block_ids.view(b, -1))  # [b, Q, Hm]
            ctx_pos = torch.arange(t, device=input_ids.device).expand(b, t)
            hidden = self.drafter(embeds, lay.positions, context, ctx_pos, lay.attend)
            hidden = hidden.view(b, -1, bsz, hidden.shape[-1])

        # the R valid blocks as (sequence, anchor) indices: one host read here, not one per boolean-mask use (backward)
        seq, block = lay.anchor_valid.nonzero(as_tuple=True)  # [R], [R]
        pass_hidden = hidden[seq, block, 1:]  # [R, S, Hm]
        targets, valid = lay.targets[seq, block], lay.target_valid[seq, block]  # [R, S]
        anchor_pos = lay.anchors[seq, block]  # [R]
        draft_logits = self.target.logits(pass_hidden).float()  # [R, S, V]

        # the greedy target's teacher-forced choice at slot s: its distribution at anchor + s - 1
        slot_pos = (anchor_pos[:, None] + torch.arange(slots, device=seq.device)).clamp(max=t - 1)  # [R, S]
        slot_rows = final_hidden[seq[:, None], slot_pos].reshape(-1, final_hidden.shape[-1])  # [R*S, Hm]
        lse, greedy = self.target.slot_targets(slot_rows)
        greedy = greedy.view(-1, slots)

        draft_hits = ((draft_logits.argmax(-1) == targets) & valid).sum(0).float()
        accept_draft = acceptance_length(draft_logits.argmax(-1), greedy, valid)
        self.mark("drafter")
        if weights.gamma == 0:
            terms = lilicorr_objective(draft_logits, targets, valid, weights=weights)
            self.mark("head")
            return JointOutput(terms, draft_hits, valid.sum(0), None, None, {}, accept_draft, None)

        if not isinstance(self.head, LiLiCorrHead):
            anchor_ids = lay.block_ids[seq, block, 0]  # [R]
            return self.corrector(
                pass_hidden, draft_logits, anchor_ids, targets, valid, greedy, weights, draft_hits, accept_draft
            )

        proposal = propose(  # the candidates' log-probs, start and pair carry the gradient; ids and draft do not
            draft_logits.flatten(0, 1),
            pass_hidden,
            context[seq, anchor_pos - 1],  # [R, Hm]
            topk=self.head.config.candidate_topk,
            scores=head_forward(self.head, lambda ids: self.head.project_tokens(self.target.embed(ids))),
            plan=torch_plan(Device.of(draft_logits)),
        )
        cand_ids, cand_lp = proposal.ids, proposal.log_probs  # [R, S, K]
        target_lp = self.target.candidate_log_probs(slot_rows, lse, cand_ids.reshape(-1, cand_ids.shape[-1]))
        terms = lilicorr_objective(
            draft_logits, targets, valid, cand_ids, proposal.start, proposal.pair, target_lp.view_as(cand_lp), weights
        )
        reranker_hits = ((terms.z.detach().argmax(-1) == terms.gt_index) & terms.prefix).sum(0).float()
        self.mark("head")
        prefix_counts, coverage = terms.prefix.sum(0), oracle_prefix_coverage(terms.prefix, valid)
        walk = acceptance_length(proposal.draft, greedy, valid)
        return JointOutput(terms, draft_hits, valid.sum(0), reranker_hits, prefix_counts, coverage, accept_draft, walk)

    def corrector(
        self, pass_hidden, draft_logits, anchor_ids, targets, valid, greedy, weights, draft_hits, accept_draft
    ) -> JointOutput:
        """The Domino or DSpark head's part: teacher-forced step logits -> objective; free proposal -> acceptance."""
        forced = self.head(pass_hidden, draft_logits, anchor_ids, self.target.embed, forced=targets)
        first = 1 if isinstance(self.head, DominoHead) else 0  # Domino's slot 1 is the drafter's argmax
        terms = corrector_objective(draft_logits, forced.logits, targets, valid, weights, first, forced.confidence)
        with torch.no_grad():
            free = self.head(pass_hidden, draft_logits, anchor_ids, self.target.embed)
        hits = ((forced.ids == targets) & valid).sum(0).float()
        self.mark("head")
        walk, kind = acceptance_length(free.ids, greedy, valid), self.head.config.kind
        return JointOutput(terms, draft_hits, valid.sum(0), hits, valid.sum(0), {}, accept_draft, walk, kind)
