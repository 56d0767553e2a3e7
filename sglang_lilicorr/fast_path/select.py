"""Serving-time select path of a trained LiLiCorr head (paper Section 3, App. A/F):
LM-head logits -> fused top-K + logsumexp -> token-table gather -> head -> greedy walk (or Viterbi).

`FastLiLiCorrSelect` wraps a `LiLiCorrHead` (same weights; the lattice layers, norms and projections are the
head's own modules) with the constants the serving path precomputes from it (constants.py).

How a call runs is its plan (plan.py: the route, PDL, the side stream), one per batch-size bucket, resolved at
construction from kernels/tuning.py's measured tables (or given: `plans`) and taken by the call's batch size. The
torch route runs the head's own forward (LiLiCorrHead, as training does); the fused routes run Triton kernels around
the GEMMs: features + LayerNorm + up + SiLU in one kernel, the node kernel (gather + sum + RMSNorm), residual add +
RMSNorm (+ h*t), the lattice attention, and one cosine kernel for the start and pair factors that also runs the greedy
walk (kernels/head_*.py, lattice_attention.py). `walk` picks the rule that commits the block (walk.WALKS): the greedy
walk (App. F, the paper's), or the exact Viterbi path, which the cosine kernel leaves to the Viterbi kernel
(kernels/walk.py); on the torch route walk.py's decoders. The folded route runs every GEMM as a Triton GEMM with its
epilogue (kernels/gemm_epilogue.py) and folds the lattice's norms into them (each layer five GEMMs and the attention:
the residual adds in the epilogues of the GEMMs that produce the branches, which also write their rows' partial sums
of squares; each RMSNorm inside the GEMM that reads its output, its gain folded into a copy of the weight; the last
add also writes x * t); the unfolded route runs cuBLAS GEMMs (the FFN up + SiLU in Triton where its table prefers it)
between the norm kernels. With PDL (kernels/pdl.py) early-launched Triton GEMMs prefetch their weights into L2.
Everything is static-shaped with no host syncs, so `select` can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..head import LiLiCorrHead
from .counters import KernelCounters
from ..kernels import head_nodes, head_norm, head_scores
from ..kernels.device import uses_triton
from ..kernels import tuning
from ..kernels.gemm_epilogue import gemm_epilogue_triton, linear_silu_triton
from ..kernels.lattice_attention import lattice_attention_triton
from ..kernels.topk_lse import topk_lse
from ..kernels.walk import greedy_walk_triton, viterbi_triton
from .constants import SelectConstants
from .plan import Device, HeadGeometry, SelectPlan, SelectPlans, plans_for
from .side_stream import SideStream
from ..walk import WALKS

WALK_KERNELS = {"greedy": greedy_walk_triton, "viterbi": viterbi_triton}  # walk.WALKS's rules in Triton, ids gathered


def _norm_eps(norm: torch.nn.RMSNorm) -> float:
    return float(norm.eps) if norm.eps is not None else float(torch.finfo(norm.weight.dtype).eps)


class FastLiLiCorrSelect(SelectConstants):
    """select(hidden [b, S, Hm], anchor_hidden [b, Hm], lm_head_weight [V, Hm])
    -> (draft token ids [b, S], candidate ids [b, S, K], candidate log-probs fp32 [b, S, K])."""

    def __init__(
        self,
        head: LiLiCorrHead,
        *,
        embed_weight: torch.Tensor | None = None,  # [V, Hm] target input embedding
        token_table: torch.Tensor | None = None,  # [V, H] head.token_table(embed_weight), if already built
        plans: SelectPlans | None = None,  # None: plans_for(this head, its device), kernels/tuning.py's tables
        walk: str = "greedy",  # the rule that commits the block (walk.WALKS): greedy, or viterbi (the exact path)
    ) -> None:
        if (embed_weight is None) == (token_table is None):
            raise ValueError("FastLiLiCorrSelect: pass exactly one of embed_weight=[V, Hm] or token_table=[V, H].")
        if not isinstance(head, LiLiCorrHead):
            raise TypeError(f"FastLiLiCorrSelect wraps a sglang_lilicorr.head.LiLiCorrHead, got {type(head).__name__}.")
        if walk not in WALKS:
            raise ValueError(
                f"FastLiLiCorrSelect: walk={walk!r} is not a decode rule; choose one of {', '.join(WALKS)}."
            )
        self.walk_rule = walk
        self.geometry, device = HeadGeometry.of(head), Device.of(head.pass_hidden_proj.weight)
        self.plans = plans_for(self.geometry, device) if plans is None else plans
        for plan in self.plans.plans:
            plan.check(device)
        super().__init__(head, embed_weight, token_table, fold_norms=any(p.route == "folded" for p in self.plans.plans))
        self._side = torch.cuda.Stream(device=self.device) if any(p.overlap for p in self.plans.plans) else None
        self._counters = KernelCounters(self.device) if any(p.fused for p in self.plans.plans) else None

    def plan(self, batch: int) -> SelectPlan:
        """The plan a call of `batch` requests runs."""
        return self.plans.at(batch)

    # --- inputs ------------------------------------------------------------------------------

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

    def _check_candidates(self, vals, ids, lse, pass_hidden, anchor_hidden) -> None:
        b, s = self._check(pass_hidden, anchor_hidden)
        if vals.shape != (b, s, self.topk) or ids.shape != vals.shape or lse.shape != (b, s):
            raise ValueError(
                f"select: candidates vals {tuple(vals.shape)} / ids {tuple(ids.shape)} / lse {tuple(lse.shape)} "
                f"do not match [{b}, {s}, {self.topk}] / [{b}, {s}]."
            )

    # --- stages ------------------------------------------------------------------------------

    def candidates(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor):
        """hidden [b, S, Hm], lm_head_weight [V, Hm] -> (vals fp32 [b, S, K], ids [b, S, K], lse fp32 [b, S])."""
        b, s = hidden.shape[:2]
        return self._candidates_from_logits(self._logits(hidden, lm_head_weight), b, s, self.plan(b))

    def _logits(self, hidden, lm_head_weight):
        """hidden [b, S, Hm], lm_head_weight [V, Hm] -> the slots' logits [b*S, V]."""
        b, s, hm = hidden.shape
        if lm_head_weight.dim() != 2 or lm_head_weight.shape != (self.token_table.shape[0], hm):
            raise ValueError(
                f"select: lm_head_weight must be [{self.token_table.shape[0]}, {hm}] (vocabulary x hidden), "
                f"got {tuple(lm_head_weight.shape)}."
            )
        return F.linear(hidden.reshape(b * s, hm).to(lm_head_weight.dtype), lm_head_weight)

    def _candidates_from_logits(self, logits, b, s, plan: SelectPlan):
        vals, ids, lse = topk_lse(logits, self.topk, pdl=plan.pdl)
        return vals.view(b, s, self.topk), ids.view(b, s, self.topk), lse.view(b, s)

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

    def lattice_scores(self, vals, ids, lse, pass_hidden, anchor_hidden):
        """Candidates + drafter states -> (start fp32 [b, K], pair fp32 [b, S-1, K, K], log-probs fp32 [b, S, K])."""
        self._check_candidates(vals, ids, lse, pass_hidden, anchor_hidden)
        plan = self.plan(ids.shape[0])
        with torch.no_grad():
            if plan.fused:
                return self._scores_fused(vals, ids, lse, pass_hidden, anchor_hidden, plan)[:3]
            return self._scores_torch(vals, ids, lse, pass_hidden, anchor_hidden)

    def _scores_torch(self, vals, ids, lse, pass_hidden, anchor_hidden):
        """The PyTorch route: the trained head's own forward (the code training runs) on the token table's rows."""
        lp = vals.float() - lse.float().unsqueeze(-1)  # [b, S, K]
        start, pair = self.head(self.token_table[ids], lp, pass_hidden, anchor_hidden)
        return start.float(), pair.float(), lp

    def _projections(self, pass_hidden, anchor_hidden, plan: SelectPlan) -> tuple:
        """-> (pass projection, t, anchor, join_pass, join_anchor): with the plan's overlap both projections run on the
        side stream, forked here, and each is joined where first needed by calling its join (None without overlap).
        (Forked before the top-K instead, they slowed it down from bs 4 on: PERF_NOTES.md.)"""
        if not plan.overlap:
            return self._pass_projection(pass_hidden), *self._anchor_projection(anchor_hidden, plan), None, None
        side = SideStream(self._side)
        with side:
            pass_proj = self._pass_projection(pass_hidden)
            pass_ready = side.record()
            t, anchor = self._anchor_projection(anchor_hidden, plan)
            anchor_ready = side.record()
        return (
            pass_proj,
            t,
            anchor,
            lambda: side.join(pass_ready, pass_proj),
            lambda: side.join(anchor_ready, t, anchor),
        )

    def _scores_fused(self, vals, ids, lse, pass_hidden, anchor_hidden, plan: SelectPlan, walk: bool = False):
        """-> (start, pair, log-probs [b, S, K], draft ids [b, S] committed by the select's rule if `walk` else
        None)."""
        b, s, k = ids.shape
        pass_proj, t, anchor, join_pass, join_anchor = self._projections(pass_hidden, anchor_hidden, plan)
        lp, x, xn = self._nodes_fused(vals, ids, lse, pass_proj, plan, join_pass)
        if plan.route == "folded":
            cat, sumsq = self._layers_folded(x, xn, b, t, plan, join_anchor)
        else:
            cat, sumsq = self._layers_fused(x, xn, b, t, plan, join_anchor), None
        start, pair, draft = self._factors_fused(cat, sumsq, anchor, b, s, plan, ids if walk else None)
        return start, pair, lp.view(b, s, k), draft

    def _nodes_fused(self, vals, ids, lse, pass_proj, plan: SelectPlan, join_pass=None):
        """-> log-probs fp32 [b*S, K], residual stream x [b*L, H], first attention input [b*L, H]. On the folded route
        x is a [b*L, 2H] buffer whose first half is the residual stream (the last layer writes x * t into the second),
        and the sums of squares of its rows stand in for the attention input (fp32 [b*L, H / 16],
        kernels/head_norm.py)."""
        b, s, k = ids.shape
        pdl, rows, h = plan.pdl, b * s * k, self.width
        lp, up = head_nodes.confidence_up_triton(
            vals.reshape(b * s, k).float(),
            lse.reshape(b * s).float(),
            self.w_feat,
            self.b_feat,
            self.feat_ln_eps,
            self.dtype,
            pdl=pdl,
        )
        norm, folds = self.head.layers[0].attn_norm, plan.route == "folded"
        if folds:  # [b*S*K, H]
            feat = gemm_epilogue_triton(up, self.w_down, pdl=pdl)
        else:
            feat = F.linear(up, self.w_down)
        if join_pass is not None:
            join_pass()
        cat = torch.empty((rows, 2 * h), dtype=self.dtype, device=self.device) if folds else None
        folded = (
            dict(out=cat[:, :h], sumsq_out=head_norm.sumsq_parts(rows, h, self.device)) if folds else {}
        )  # the norm left to QKV
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
            if (
                joined
            ):  # t for the last FFN down; the attention has no weight to prefetch, so it takes the full-order launch
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
        """The folded route's lattice layers as five Triton GEMMs + the attention each: cat [b*L, 2H] holds the
        residual stream x in its first half, sumsq [b*L, H / 16] its rows' partial sums of squares; every GEMM
        that adds into x writes them anew for the next one's norm, and the last also writes x * t into
        cat's second half -> (cat, sumsq of the final x)."""
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
            gemm_epilogue_triton(
                hidden,
                mlp.down_proj.weight,
                mlp.down_proj.bias,
                residual=x,
                sumsq_out=sumsq,
                cross=(t, cat[:, h:]) if last else None,
                pdl=pdl,
            )
        return cat, sumsq

    def _residual_norm(self, x, branch, linear: torch.nn.Linear, norm: torch.nn.RMSNorm, plan: SelectPlan, cross=None):
        """x += linear(branch) (in place; not with cross) -> RMSNorm(x) [rows, H], or concat[h, h*t] [rows, 2H] with
        cross (the anchor state t): the cuBLAS GEMM + add_rmsnorm_triton."""
        y = F.linear(branch, linear.weight, linear.bias)
        return head_norm.add_rmsnorm_triton(x, y, norm.weight, _norm_eps(norm), cross=cross, pdl=plan.pdl)

    def _factors_fused(self, cat, sumsq, anchor, b, s, plan: SelectPlan, ids=None):
        """concat[h, h*t] [b*L, 2H], anchor [b, D+H] -> (start fp32 [b, K], pair fp32 [b, S-1, K, K],
        draft ids [b, S] committed by the select's rule if candidate `ids` [b, S, K] are given, else None: the greedy
        walk in the cosine kernel, another rule's kernel after it).
        On the folded route `cat` is [x, x * t] and sumsq the sums of squares of x's rows (_layers_folded):
        the factor GEMM applies the output norm (its rstd per row, its gain in w_factor_folded)."""
        d, k, pdl = self.factor_dim, self.topk, plan.pdl
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
        if ids is None or self.walk_rule != "greedy":  # the scores alone, then (with ids) the rule's kernel
            start, pair = head_scores.lattice_cosine_triton(edges, anchor[:, :d], self.sigma, self.vector_eps, pdl=pdl)
            return start, pair, None if ids is None else self.walk(start, pair, ids)
        counters = self._counters.at_least(b)  # one per request
        return head_scores.lattice_cosine_walk_triton(
            edges, anchor[:, :d], self.sigma, self.vector_eps, ids, counters, pdl=pdl
        )

    def fused_stages(self, vals, ids, lse, pass_hidden, anchor_hidden) -> dict:
        """The fused path (without the side stream) cut into its stages, name -> zero-argument call
        on the previous stage's outputs (computed once here), for per-stage timing and launch
        counts (benchmarks/head_bench.py). The `lattice` stage updates its input x in place, so
        repeated calls drift its values (not its cost)."""
        b, s = self._check(pass_hidden, anchor_hidden)
        plan = self.plan(b)
        if not plan.fused:
            raise ValueError("fused_stages: the plan at this batch size runs the torch route; give a fused plan.")

        def lattice(x, xn):
            if plan.route == "folded":
                return self._layers_folded(x, xn, b, t, plan)
            return self._layers_fused(x, xn, b, t, plan), None

        with torch.no_grad():
            pass_proj, (t, anchor) = self._pass_projection(pass_hidden), self._anchor_projection(anchor_hidden, plan)
            lp, x, xn = self._nodes_fused(vals, ids, lse, pass_proj, plan)
            cat, sumsq = lattice(x.clone(), xn)
        stages = {
            "projections": lambda: (self._pass_projection(pass_hidden), self._anchor_projection(anchor_hidden, plan)),
            "nodes": lambda: self._nodes_fused(vals, ids, lse, pass_proj, plan),
            "lattice": lambda: lattice(x, xn),
            "factors": lambda: self._factors_fused(cat, sumsq, anchor, b, s, plan, ids),  # with the commit, as served
        }
        return {name: torch.no_grad()(fn) for name, fn in stages.items()}

    def walk(self, start: torch.Tensor, pair: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The select's rule (greedy walk, App. F, or Viterbi) over the factors -> draft token ids [b, S]."""
        if uses_triton(start):  # the gather of the committed ids in the same kernel
            return WALK_KERNELS[self.walk_rule](start, pair, ids, pdl=self.plan(start.shape[0]).pdl)
        path = WALKS[self.walk_rule](start, pair)
        return ids.gather(2, path.unsqueeze(-1)).squeeze(-1)

    # --- entry points ------------------------------------------------------------------------

    def select_from_candidates(self, vals, ids, lse, pass_hidden, anchor_hidden):
        """Head + walk on given candidates -> (draft ids [b, S], ids [b, S, K], log-probs fp32 [b, S, K]).
        The fused path walks greedily inside its cosine kernel (kernels/head_scores.py)."""
        plan = self.plan(ids.shape[0])
        if not plan.fused:
            start, pair, lp = self.lattice_scores(vals, ids, lse, pass_hidden, anchor_hidden)
            return self.walk(start, pair, ids), ids, lp
        self._check_candidates(vals, ids, lse, pass_hidden, anchor_hidden)
        with torch.no_grad():
            lp, draft = self._scores_fused(vals, ids, lse, pass_hidden, anchor_hidden, plan, walk=True)[2:]
        return draft, ids, lp

    def _select_fused_from_logits(self, logits, hidden, anchor_hidden, b, s):
        """select_from_logits on a fused route."""
        plan = self.plan(b)
        vals, ids, lse = self._candidates_from_logits(logits, b, s, plan)
        lp, draft = self._scores_fused(vals, ids, lse, hidden, anchor_hidden, plan, walk=True)[2:]
        return draft, ids, lp

    def select_from_logits(self, logits: torch.Tensor, hidden: torch.Tensor, anchor_hidden: torch.Tensor):
        """logits [b*S, V] of the slots -> top-K/LSE + head + walk -> (draft ids [b, S], ids [b, S, K],
        log-probs fp32 [b, S, K])."""
        b, s = self._check(hidden, anchor_hidden)
        if logits.dim() != 2 or logits.shape[0] != b * s or logits.shape[1] != self.token_table.shape[0]:
            raise ValueError(
                f"select: logits must be [{b * s}, {self.token_table.shape[0]}] (b*S x V), got {tuple(logits.shape)}."
            )
        with torch.no_grad():
            if self.plan(b).fused:
                return self._select_fused_from_logits(logits, hidden, anchor_hidden, b, s)
            candidates = self._candidates_from_logits(logits, b, s, self.plan(b))
        return self.select_from_candidates(*candidates, hidden, anchor_hidden)

    def select(self, hidden: torch.Tensor, anchor_hidden: torch.Tensor, lm_head_weight: torch.Tensor):
        """hidden [b, S, Hm] drafter slot states, anchor_hidden [b, Hm], lm_head_weight [V, Hm]
        -> (draft token ids [b, S], candidate ids [b, S, K], candidate log-probs fp32 [b, S, K])."""
        b, s = self._check(hidden, anchor_hidden)
        with torch.no_grad():
            if self.plan(b).fused:
                return self._select_fused_from_logits(self._logits(hidden, lm_head_weight), hidden, anchor_hidden, b, s)
            vals, ids, lse = self.candidates(hidden, lm_head_weight)
        return self.select_from_candidates(vals, ids, lse, hidden, anchor_hidden)

    __call__ = select
