"""The serving select of a trained LiLiCorr head: the proposal pipeline (pipeline.py) on the head's routes, with
constants folded from it (constants.py), a plan per batch size (plan.py). The fused routes run Triton kernels around the
GEMMs (the cosine kernel may also walk); the folded route runs every GEMM in Triton. No host sync: graph-safe."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..head import LiLiCorrHead
from ..kernels import head_nodes, head_norm, head_scores
from ..kernels import tuning
from ..kernels.gemm_epilogue import gemm_epilogue_triton, linear_silu_triton
from ..kernels.lattice_attention import lattice_attention_triton
from .constants import SelectConstants
from .counters import KernelCounters
from .pipeline import Proposal, head_forward, propose
from .plan import Device, HeadGeometry, SelectPlan, SelectPlans, plans_for
from .side_stream import SideStream


def _norm_eps(norm: torch.nn.RMSNorm) -> float:
    return float(norm.eps) if norm.eps is not None else float(torch.finfo(norm.weight.dtype).eps)


class FastLiLiCorrSelect(SelectConstants):
    """propose(logits [b*S, V], hidden [b, S, Hm], anchor_hidden [b, Hm]) -> Proposal (pipeline.py)."""

    def __init__(
        self,
        head: LiLiCorrHead,
        *,
        embed_weight: torch.Tensor | None = None,  # [V, Hm] target input embedding
        token_table: torch.Tensor | None = None,  # [V, H] head.token_table(embed_weight), if already built
        plans: SelectPlans | None = None,  # None: plans_for(this head, its device), kernels/tuning.py's tables
    ) -> None:
        if (embed_weight is None) == (token_table is None):
            raise ValueError("FastLiLiCorrSelect: pass exactly one of embed_weight=[V, Hm] or token_table=[V, H].")
        if not isinstance(head, LiLiCorrHead):
            raise TypeError(f"FastLiLiCorrSelect wraps a sglang_lilicorr.head.LiLiCorrHead, got {type(head).__name__}.")
        self.geometry, device = HeadGeometry.of(head), Device.of(head.pass_hidden_proj.weight)
        self.plans = plans_for(self.geometry, device) if plans is None else plans
        for plan in self.plans.plans:
            plan.check(device)
        rules = {plan.walk for plan in self.plans.plans}
        if len(rules) != 1:
            raise ValueError(f"FastLiLiCorrSelect: one walk rule at every batch size, got {sorted(rules)}.")
        self.walk_rule = rules.pop()  # the rule that commits the block (walk.WALKS)
        super().__init__(head, embed_weight, token_table, fold_norms=any(p.route == "folded" for p in self.plans.plans))
        self._side = torch.cuda.Stream(device=self.device) if any(p.overlap for p in self.plans.plans) else None
        self._counters = KernelCounters(self.device) if any(p.fused for p in self.plans.plans) else None
        self._head_forward = head_forward(self.head, lambda ids: self.token_table[ids])  # the torch route

    def plan(self, batch: int) -> SelectPlan:
        """The plan a call of `batch` requests runs."""
        return self.plans.at(batch)

    def propose(self, logits: torch.Tensor, hidden: torch.Tensor, anchor_hidden: torch.Tensor) -> Proposal:
        """logits [b*S, V] (merge: this rank's columns), hidden [b, S, Hm], anchor [b, Hm] -> Proposal, by plan(b)."""
        b, s = self._check(hidden, anchor_hidden)
        plan = self.plan(b)
        vocab = self.token_table.shape[0] if plan.merge is None else logits.shape[-1]  # a merge: the rank's shard
        if logits.dim() != 2 or tuple(logits.shape) != (b * s, vocab):
            raise ValueError(
                f"select: logits must be [{b * s}, {vocab}] (b*S slots x vocabulary), got {tuple(logits.shape)}."
            )
        with torch.no_grad():
            return propose(logits, hidden, anchor_hidden, topk=self.topk, scores=self._scores, plan=plan)

    def _check(self, pass_hidden: torch.Tensor, anchor_hidden: torch.Tensor) -> tuple[int, int]:
        hm = self.head.model_hidden_size
        if pass_hidden.dim() != 3 or pass_hidden.shape[-1] != hm:
            raise ValueError(f"select: hidden must be [b, S, {hm}] slot hidden states, got {tuple(pass_hidden.shape)}.")
        b, s, _ = pass_hidden.shape
        if not 1 <= s <= self.num_slots:
            raise ValueError(f"select: {s} slots; this head drafts 1..{self.num_slots} (block_size - 1).")
        if tuple(anchor_hidden.shape) != (b, hm):
            raise ValueError(f"select: anchor_hidden must be [{b}, {hm}], got {tuple(anchor_hidden.shape)}.")
        for name, t in (("hidden", pass_hidden), ("anchor_hidden", anchor_hidden)):
            if t.device != self.device:
                raise ValueError(f"select: {name} is on {t.device} but the head is on {self.device}; move it there.")
        return b, s

    def _scores(self, vals, ids, lse, pass_hidden, anchor_hidden, plan: SelectPlan):
        """The pipeline's head step on the plan's route -> (start, pair, log-probs, draft ids or None)."""
        if plan.fused:
            return self._scores_fused(vals, ids, lse, pass_hidden, anchor_hidden, plan)
        return self._head_forward(vals, ids, lse, pass_hidden, anchor_hidden, plan)

    def _pass_projection(self, pass_hidden):
        """-> pass_hidden_proj without its bias (folded into node_const) [b, S, H] (cuBLAS)."""
        return F.linear(pass_hidden.to(self.dtype), self.w_pass)

    def _anchor_projection(self, anchor_hidden, plan: SelectPlan):
        """-> anchor state t [b, H] and [anchor_out | W_t t + b] [b, D+H] (one GEMM on t)."""
        t = self.head.context_proj(anchor_hidden.to(self.dtype))
        if plan.fused:  # one Triton RMSNorm launch, like the other norms of the fused path
            t = head_norm.rmsnorm_triton(t, self.head.anchor_norm.weight, _norm_eps(self.head.anchor_norm))
        else:
            t = self.head.anchor_norm(t)
        return t, F.linear(t, self.w_anchor, self.b_anchor)

    def _projections(self, pass_hidden, anchor_hidden, plan: SelectPlan) -> tuple:
        """-> (pass projection, t, anchor, join_pass, join_anchor); with overlap both run on the side stream."""
        if not plan.overlap:
            return self._pass_projection(pass_hidden), *self._anchor_projection(anchor_hidden, plan), None, None
        side = SideStream(self._side)
        with side:
            pass_proj = self._pass_projection(pass_hidden)
            pass_ready = side.record()
            t, anchor = self._anchor_projection(anchor_hidden, plan)
            anchor_ready = side.record()
        join_pass, join_anchor = lambda: side.join(pass_ready, pass_proj), lambda: side.join(anchor_ready, t, anchor)
        return pass_proj, t, anchor, join_pass, join_anchor

    def _scores_fused(self, vals, ids, lse, pass_hidden, anchor_hidden, plan: SelectPlan):
        """The fused routes -> (start, pair, log-probs [b, S, K], the greedy walk's ids [b, S] or None)."""
        b, s, k = ids.shape
        pass_proj, t, anchor, join_pass, join_anchor = self._projections(pass_hidden, anchor_hidden, plan)
        lp, x, xn = self._nodes_fused(vals, ids, lse, pass_proj, plan, join_pass)
        if plan.route == "folded":
            cat, sumsq = self._layers_folded(x, xn, b, t, plan, join_anchor)
        else:
            cat, sumsq = self._layers_fused(x, xn, b, t, plan, join_anchor), None
        start, pair, draft = self._factors_fused(cat, sumsq, anchor, ids, plan)
        return start, pair, lp.view(b, s, k), draft

    def _nodes_fused(self, vals, ids, lse, pass_proj, plan: SelectPlan, join_pass=None):
        """-> log-probs fp32 [b*S, K], residual x [b*L, H], first attention input [b*L, H]. Folded: x is [b*L, 2H] and
        its rows' sums of squares [b*L, H / 16] stand for the attention input."""
        b, s, k = ids.shape
        pdl, rows, h = plan.pdl, b * s * k, self.width
        flat_vals, flat_lse = vals.reshape(b * s, k).float(), lse.reshape(b * s).float()
        lp, up = head_nodes.confidence_up_triton(
            flat_vals, flat_lse, self.w_feat, self.b_feat, self.feat_ln_eps, self.dtype, pdl=pdl
        )
        norm, folds = self.head.layers[0].attn_norm, plan.route == "folded"
        feat = gemm_epilogue_triton(up, self.w_down, pdl=pdl) if folds else F.linear(up, self.w_down)  # [b*S*K, H]
        if join_pass is not None:
            join_pass()
        cat = torch.empty((rows, 2 * h), dtype=self.dtype, device=self.device) if folds else None
        # the norm left to QKV
        folded = dict(out=cat[:, :h], sumsq_out=head_norm.sumsq_parts(rows, h, self.device)) if folds else {}
        x, xn = head_nodes.lattice_nodes_triton(
            ids,
            self.token_table,
            pass_proj,
            feat,
            self.node_const,
            norm.weight,
            _norm_eps(norm),
            **folded,
            pdl=pdl,
            launch_pdl=join_pass is None,  # the first launch after a join waits in full
        )
        return lp, (cat if folds else x), xn

    def _layers_fused(self, x, xn, b, t, plan: SelectPlan, join_anchor=None):
        """The unfolded route's lattice transformer on x [b*L, H] (updated in place) -> concat[h, h*t] [b*L, 2H]."""
        n, pdl = x.shape[0] // b, plan.pdl
        bias = self.attn_bias[..., :n, :n]  # [1, heads, n, n], 16-aligned rows: taken as is
        layers = self.head.layers
        ffn_up_in_triton = tuning.gemm_band(x.shape[0])[2]  # the up GEMM with its bias + SiLU in its epilogue
        for i, layer in enumerate(layers):
            attn, mlp = layer.attn, layer.mlp
            qkv = F.linear(xn, attn.in_proj_weight, attn.in_proj_bias)  # [b*n, 3H]
            joined = i == len(layers) - 1 and join_anchor is not None
            if joined:  # t for the last FFN down; the attention (no weight to prefetch) takes the full-order launch
                join_anchor()
            attended = lattice_attention_triton(qkv, bias, attn.num_heads, pdl=pdl, launch_pdl=not joined)
            xn = self._residual_norm(x, attended, attn.out_proj, self._after_attn[i], plan)
            if ffn_up_in_triton:
                hidden = linear_silu_triton(xn, mlp.up_proj.weight, mlp.up_proj.bias, pdl=pdl)
            else:
                hidden = F.silu(mlp.up_proj(xn))
            cross = t if i == len(layers) - 1 else None
            xn = self._residual_norm(x, hidden, mlp.down_proj, self._after_mlp[i], plan, cross)
        return xn

    def _layers_folded(self, cat, sumsq, b, t, plan: SelectPlan, join_anchor=None):
        """Folded lattice layers: cat [b*L, 2H] = [x, x * t], sumsq [b*L, H / 16] -> (cat, sumsq)."""
        rows, h = cat.shape[0], self.width
        n, x, pdl = rows // b, cat[:, :h], plan.pdl
        bias = self.attn_bias[..., :n, :n]
        layers = self.head.layers
        for i, layer in enumerate(layers):
            attn, mlp = layer.attn, layer.mlp
            qkv = gemm_epilogue_triton(
                x, self.w_qkv_folded[i], attn.in_proj_bias, norm=(sumsq, _norm_eps(layer.attn_norm)), pdl=pdl
            )
            last = i == len(layers) - 1
            joined = last and join_anchor is not None
            if joined:  # as in _layers_fused: the attention after the join, every GEMM launched early
                join_anchor()
            attended = lattice_attention_triton(qkv, bias, attn.num_heads, pdl=pdl, launch_pdl=not joined)
            sumsq = head_norm.sumsq_parts(rows, h, self.device)
            gemm_epilogue_triton(
                attended, attn.out_proj.weight, attn.out_proj.bias, residual=x, sumsq_out=sumsq, pdl=pdl
            )
            norm = (sumsq, _norm_eps(layer.mlp_norm))
            hidden = gemm_epilogue_triton(x, self.w_up_folded[i], mlp.up_proj.bias, silu=True, norm=norm, pdl=pdl)
            sumsq = head_norm.sumsq_parts(rows, h, self.device)
            cross = (t, cat[:, h:]) if last else None
            gemm_epilogue_triton(
                hidden, mlp.down_proj.weight, mlp.down_proj.bias, residual=x, sumsq_out=sumsq, cross=cross, pdl=pdl
            )
        return cat, sumsq

    def _residual_norm(self, x, branch, linear: torch.nn.Linear, norm: torch.nn.RMSNorm, plan: SelectPlan, cross=None):
        """x += linear(branch) in place -> RMSNorm(x) [rows, H]; with cross (anchor t): concat[h, h*t], x unchanged."""
        y = F.linear(branch, linear.weight, linear.bias)
        return head_norm.add_rmsnorm_triton(x, y, norm.weight, _norm_eps(norm), cross=cross, pdl=plan.pdl)

    def _factors_fused(self, cat, sumsq, anchor, ids, plan: SelectPlan):
        """concat[h, h*t] [b*L, 2H], anchor [b, D+H], ids [b, S, K] -> (start fp32 [b, K], pair fp32 [b, S-1, K, K],
        greedy draft ids [b, S] or None). Folded: the factor GEMM applies the output norm from sumsq."""
        (b, s, k), d, pdl = ids.shape, self.factor_dim, plan.pdl
        if sumsq is not None:  # the per-request bias + SiLU in the GEMM's epilogue
            norm = (sumsq, _norm_eps(self.head.output_norm))
            fused = gemm_epilogue_triton(
                cat,
                self.w_factor_folded,
                norm=norm,
                norm_width=self.width,
                pdl=pdl,
                silu=True,
                group_bias=anchor[:, d:],
                rows_per_group=s * k,
            )
            edges = gemm_epilogue_triton(fused, self.w_edge, self.b_edge, pdl=pdl)
        else:
            fused = head_norm.row_bias_silu_triton(
                F.linear(cat, self.w_factor), anchor[:, d:], rows_per_group=s * k, pdl=pdl
            )
            edges = F.linear(fused, self.w_edge, self.b_edge)
        edges = edges.view(b, s, k, 2 * d)
        if plan.walk != "greedy":  # the scores alone: the pipeline runs the rule's kernel after them
            start, pair = head_scores.lattice_cosine_triton(edges, anchor[:, :d], self.sigma, self.vector_eps, pdl=pdl)
            return start, pair, None
        counters = self._counters.at_least(b)  # one per request
        return head_scores.lattice_cosine_walk_triton(
            edges, anchor[:, :d], self.sigma, self.vector_eps, ids, counters, pdl=pdl
        )
