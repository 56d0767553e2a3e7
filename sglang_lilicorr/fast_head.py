"""Serving-time select path of a trained LiLiCorr head (paper Section 3, App. A/F):
LM-head logits -> fused top-K + logsumexp -> token-table gather -> head -> greedy walk.

`FastLiLiCorrSelect` wraps a `LiLiCorrHead` (same weights; the lattice layers, norms and
projections are the head's own modules) and precomputes what is constant at serving:

  token table        [V, H]        head.token_table(target embedding)
  node_const         [S, K, H] f32 slot + rank embeddings + pass_hidden_proj.bias + feature down bias
  w_feat, b_feat     [H, 5], [H]   feature LayerNorm's affine folded into the feature up projection
  attn_bias          [1, h, L, L]  lattice attention bias, in the head's dtype, 16-aligned rows
  w_factor           [H, 2H]       factor_input_proj over concat[h, h*t] (the t term moves to the anchor)
  w_anchor, b_anchor [D+H, H]      anchor_out_head and factor_input_proj's t block + bias: one GEMM on t
  w_edge, b_edge     [2D, H]       out_head | in_head: one GEMM

Two implementations of the same math, chosen by `fused`:
  fused=False  PyTorch ops (the lattice layers run as LatticeLayer.forward).
  fused=True   Triton epilogues (kernels/head_*.py): features+LayerNorm+up+SiLU in one kernel,
               gather+sum+RMSNorm node kernel, residual-add+RMSNorm (+ h*t) kernels, bias+SiLU,
               and one cosine-score kernel for start and pair factors that also runs the greedy
               walk (its last program per request); the lattice attention as one
               Triton kernel per (request, head, query block) (kernels/lattice_attention.py);
               the FFN up GEMM with its bias + SiLU epilogue (kernels/ffn_silu.py) and the out /
               FFN down GEMMs with the residual add + RMSNorm epilogue and the feature down GEMM
               with the node assembly + RMSNorm epilogue (kernels/linear_norm.py) where their
               measured tables prefer them; cuBLAS GEMMs between.
`overlap=True` (CUDA, fused) runs the pass and anchor projections on a side stream.
`pdl` launches every Triton kernel of the main stream with programmatic dependent launch
(kernels/pdl.py; CUDA sm_90+, fused), and `triton_gemms` runs the head's GEMMs of at most
TRITON_GEMM_MAX_ROWS rows as Triton GEMMs with their epilogues (kernels/ffn_silu.py), which can start
early under PDL where cuBLAS kernels cannot. True / False force them; None (the default) takes the
measured tables below, per head width, number of lattice rows of the call and GEMM shape.
`norm_epilogue` forces those GEMM + norm epilogues (nodes, residual adds) on or off (None:
kernels/linear_norm.py's measured table decides per shape).
`fold_norms` (version 16) runs each lattice layer as its five Triton GEMMs and the attention, nothing
between (kernels/ffn_silu.py): the residual adds in the epilogues of the GEMMs that produce the
branches, which also write their rows' partial sums of squares (as does the node kernel); each RMSNorm
inside the GEMM that reads its output (rstd per row from those partials, the gain folded into a copy
of its weight: w_*_folded); the last add also writes x * t, so the factor GEMM applies the output norm
to concat[x, x*t].
True / False force it; None takes FOLD_NORMS_MAX_ROWS (where PDL is on).
`prefetch_weights` (version 17): each Triton GEMM launched early under PDL fetches its weight slice into
L2 before it waits on the kernel before it (kernels/prefetch.py); False turns that off. The pass projection
beside the top-K, the select's first kernel, never does (version 22).
`pass_beside_topk` (version 19): select_from_logits (and select) run the pass projection on the main stream as a
Triton GEMM launched just before the top-K, whose split kernel runs beside it under PDL and waits on it only at its end
(kernels/topk_lse_fused.py): no side-stream join before the nodes, so every kernel after the top-K launches early.
There, with folded norms, `nodes_in_gemm` makes the node assembly the feature down GEMM's epilogue (one launch fewer).
True / False force them; None takes PASS_BESIDE_TOPK_MAX_ROWS (where PDL is on and the norms fold).
`release_early` (version 23): under PDL the confidence kernel, a short one, releases the next kernel at its start
instead of after its wait, so that the feature GEMM (with the nodes) fetches its weight and constants a kernel earlier.
True / False force it at every size where PDL is on (True needs PDL); None takes RELEASE_EARLY_MAX_ROWS.
`narrow_tiles` (version 25): the Triton GEMMs that NARROW_TILES names per head width run 64 x 16 tiles (ffn_silu's
"narrow" config: twice the programs of the 64 x 32 "skinny" tiles, the same bits) at bs 1, where more programs stream
the weight sooner. True runs all five roles (see NARROW_TILES) narrow at every size, wherever they run as Triton GEMMs
(needs the fused path and a 16-bit head: fp32 keeps ffn_silu's fp32 config); False: none.
Version 27, at bs 1: `topk_launch` (TopKLaunch fields of the top-K split; None: TOPK_LAUNCH), `pass_tiles` (the
ffn_silu config of the pass projection beside the top-K; False: by M; None: PASS_TILES) and `merge_in_confidence`
(select_from_logits and select run only the top-K's split kernel, and the confidence kernel merges each row's partials
itself, kernels/head_nodes.py `parts`: one launch fewer; True / False force it, None: MERGE_IN_CONFIDENCE_MAX_ROWS).
At their tables' settings (bs 1) all three give the default path's bits (select_digest). Elsewhere the logsumexp
may round one fp32 ulp apart: another chunk length sums the vocabulary in another order (the testbed head with 8-tile
chunks at bs 1), and the merge inside the confidence kernel orders its sum over chunks as that kernel compiles it (the
testbed head at bs 4 and 16: log-probs one ulp apart, features, ids and draft equal; PERF_NOTES.md, version 29).
`attention_block_m` (version 28): the lattice attention's query rows per program
(None: ATTENTION_BLOCK_M, else the kernel's default by batch size).
`cosine_split` (version 26): the cosine + walk kernel cuts each factor's D columns over that many programs, whose partial
Grams the factor's last program sums in a fixed order (kernels/head_scores.py); an int forces it (1: not split), None
takes COSINE_SPLIT.
`fused_stages` cuts the fused path into projections / nodes / lattice / factors (with the walk) for
per-stage timing (benchmarks/head_bench.py).
Everything is static-shaped with no host syncs, so `select` can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .head import LiLiCorrHead, confidence_features
from .kernels import topk_lse, uses_triton
from .lattice import lattice_attention_bias
from .walk import greedy_walk


# Measured on an H100 (head_bench, PERF_NOTES.md version 14): head width -> the most lattice rows
# (b * S * K) at which ...
PDL_MAX_ROWS = {256: 512}  # ... PDL is faster (the testbed head loses 4-5 us from bs 16); other widths: every size
TRITON_GEMM_MAX_ROWS = {256: 512, 1024: 128}  # ... the Triton GEMMs beat cuBLAS (the paper head: bs 1 only); others: none
# head width -> (largest K, largest N) of the GEMMs that go to Triton there; absent: every shape. The paper head
# at bs 1 (version 15, benchmarks/results/h100_gemm_chain_v15): in chains, 1024 -> 1024 4.85 us vs cuBLAS 5.56
# and 1024 -> 2048 5.4 vs 5.75; cuBLAS keeps the QKV (6.35 vs 6.81) and the K = 2048 GEMMs (6.87 vs 6.98, skinny_wide_k).
# (With version 17's weight prefetch every lattice shape beats cuBLAS in those chains; the table serves only the
# unfolded bs-1 path, fold_norms=False, which was not re-measured.)
TRITON_GEMM_MAX_SHAPE = {1024: (1024, 2048)}
TRITON_GEMM_ROWS_CAP = 512  # triton_gemms=True: GEMMs up to this many rows (the small-M launch configs)
# head width -> the most lattice rows at which the lattice's RMSNorms run folded into its Triton GEMMs (five norm
# launches fewer; fold_norms); others: never. H100, version 16 (benchmarks/results/h100_fold_v16/head_bench_*_0a138f1.log):
# post-logits folded / not, ms, paper head bs 1 0.123 / 0.128, bs 4 0.185 / 0.157; testbed head bs 1 0.070 / 0.077,
# bs 4 0.090 / 0.092, bs 16 0.160 / 0.128.
FOLD_NORMS_MAX_ROWS = {256: 512, 1024: 128}
# head width -> the most lattice rows at which select_from_logits runs the pass projection beside the top-K, with the
# nodes in the feature down GEMM (pass_beside_topk, nodes_in_gemm); others: never. Version 19 (PERF_NOTES.md), post-logits
# beside / not, ms: paper head bs 1 0.1062 / 0.1084 (H100), 0.1026 / 0.1041 (H200); testbed head bs 1 0.0578 / 0.0588,
# 0.0574 / 0.0582; at bs 4 it loses on both cards and heads (+1.3 to +1.9 us).
PASS_BESIDE_TOPK_MAX_ROWS = {256: 120, 1024: 120}
# head width -> the most lattice rows at which the confidence kernel releases the feature GEMM at its start (release_early,
# kernels/pdl.py); others: never. Version 23 (PERF_NOTES.md): paper head bs 1 -1.0 us (H100); testbed head +-0.2 us.
# (The lattice attention released early measured +1.1 us.)
RELEASE_EARLY_MAX_ROWS = {256: 120, 1024: 120}
# head width -> (the most lattice rows, the GEMM roles that run narrow tiles there); others: none. Version 25
# (PERF_NOTES.md), H100, bs 1, in-call medians of 7 interleaved rounds against the "skinny" tiles: paper head -1.5 us
# (the nodes and out|in GEMMs; QKV, out and FFN down lose 1.7-5.7 us narrow), testbed head -1.7 us (nodes, out, FFN up,
# factor). The roles: nodes = the feature down GEMM with the node epilogue, out_proj / ffn_up of each lattice layer,
# factor, out_in = the out|in vector GEMM.
NARROW_TILES = {1024: (120, ("nodes", "out_in")), 256: (120, ("nodes", "out_proj", "ffn_up", "factor"))}
# factor dimension D -> (the most lattice rows, programs per factor of the cosine + walk kernel there); others: 1 (the split
# must cut D into whole 128-column steps, so it is keyed by D, not by the head width). Version 26 (PERF_NOTES.md), H100,
# paper head (D = 1024) bs 1: the D loop of 8 steps in one program is ~3 us of that kernel; cut over 8 programs, -2.05 us
# in-call (2 / 4 programs in the probe: +0.4 / -0.4); the testbed head (D = 256, two steps) loses 0.7-1.6 us split.
COSINE_SPLIT = {1024: (120, 8)}
# Version 27 (PERF_NOTES.md; H100, bs 1, medians of 9 interleaved rounds, the same bits as before), head width -> (the most
# lattice rows, ...):
# ... the top-K split's TopKLaunch fields there (topk_launch): sub-tiles of 32 logits (the chunk's end re-ranks 256
# logits, not 512) and the first 4 tiles ranked at once (a chunk at bs 1 is 3-4 tiles), and on the testbed's vocabulary
# chunks of 3 tiles (16 splits, not 12);
TOPK_LAUNCH = {1024: (120, dict(group=32, collect_tiles=4)), 256: (120, dict(group=32, collect_tiles=4, few_rows_tiles=3))}
# ... the pass projection beside the top-K in 16-row tiles (pass_tiles; its M is one request's 15 slots): paper head
# -0.8 to -1.1 us alone, -1.95 with TOPK_LAUNCH; on the testbed head (K = 576) the same tiles measured +0.3 to +10 us;
PASS_TILES = {1024: (120, "thin")}
# ... where select_from_logits merges the top-K's partials in the confidence kernel (merge_in_confidence): testbed head
# -2.5 us with its TOPK_LAUNCH (-1.6 without the merge); the paper head loses 0.5 with it.
MERGE_IN_CONFIDENCE_MAX_ROWS = {256: 120}
# ... the lattice attention's query rows per program there (attention_block_m; the kernel's own default at bs 1 is 32).
# Version 28 (PERF_NOTES.md), 16 rows against 32, 9 interleaved rounds: H100 paper -0.54 us (8 of 9), testbed -1.34
# (9 of 9); H200 -1.12 / -1.54 (9 of 9); the same bits at bs 1 (select_digest, both heads; both block sizes take mma.sync).
ATTENTION_BLOCK_M = {1024: (120, 16), 256: (120, 16)}


def _norm_eps(norm: torch.nn.RMSNorm) -> float:
    return float(norm.eps) if norm.eps is not None else float(torch.finfo(norm.weight.dtype).eps)


class _SideStream:
    """Work forked from the current stream onto `stream`; join() makes the current stream wait for
    an event recorded there and marks the tensors made there as used by it (eager-mode safety)."""

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.stream, self.main = stream, torch.cuda.current_stream(stream.device)
        stream.wait_stream(self.main)
        self._ctx = torch.cuda.stream(stream)

    def __enter__(self) -> "_SideStream":
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.__exit__(*exc)

    def record(self) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def join(self, event: torch.cuda.Event, *tensors: torch.Tensor) -> None:
        self.main.wait_event(event)
        if not torch.cuda.is_current_stream_capturing():
            for tensor in tensors:
                tensor.record_stream(self.main)


class FastLiLiCorrSelect:
    """select(hidden [b, S, Hm], anchor_hidden [b, Hm], lm_head_weight [V, Hm])
    -> (draft token ids [b, S], candidate ids [b, S, K], candidate log-probs fp32 [b, S, K])."""

    def __init__(
        self,
        head: LiLiCorrHead,
        *,
        embed_weight: torch.Tensor | None = None,  # [V, Hm] target input embedding
        token_table: torch.Tensor | None = None,  # [V, H] head.token_table(embed_weight), if already built
        fused: bool | None = None,  # None: Triton where it runs (CUDA, or CPU with TRITON_INTERPRET=1)
        overlap: bool | None = None,  # side stream for the projections (fused CUDA only); None: on
        norm_epilogue: bool | None = None,  # node sum / residual add + RMSNorm in GEMM epilogues; None: where measured faster
        pdl: bool | None = None,  # programmatic dependent launch (fused, CUDA sm_90+); None: PDL_MAX_ROWS where supported
        triton_gemms: bool | None = None,  # small-M GEMMs in Triton (fused); None: TRITON_GEMM_MAX_ROWS with PDL
        fold_norms: bool | None = None,  # the lattice's RMSNorms inside the Triton GEMMs (fused); None: FOLD_NORMS_MAX_ROWS
        prefetch_weights: bool = True,  # Triton GEMMs launched early under PDL fetch their weight into L2 first
        pass_beside_topk: bool | None = None,  # the pass projection beside the top-K (True: where PDL is on); None: PASS_BESIDE_TOPK_MAX_ROWS
        nodes_in_gemm: bool | None = None,  # there, the nodes as the feature down GEMM's epilogue (folded norms); None: with it
        release_early: bool | None = None,  # the confidence kernel releases the next kernel at its start; None: table
        narrow_tiles: bool | None = None,  # 64 x 16 tiles for the GEMM roles of NARROW_TILES; None: that table
        cosine_split: int | None = None,  # programs per factor in the cosine + walk kernel; None: COSINE_SPLIT
        merge_in_confidence: bool | None = None,  # the top-K's merge inside the confidence kernel; None: table
        topk_launch: dict | None = None,  # TopKLaunch fields for the top-K split at every size; None: TOPK_LAUNCH
        pass_tiles: str | bool | None = None,  # ffn_silu config of the pass projection beside the top-K; None: PASS_TILES
        attention_block_m: int | None = None,  # query rows per lattice-attention program; None: ATTENTION_BLOCK_M
    ) -> None:
        if (embed_weight is None) == (token_table is None):
            raise ValueError("FastLiLiCorrSelect: pass exactly one of embed_weight=[V, Hm] or token_table=[V, H].")
        if not isinstance(head, LiLiCorrHead):
            raise TypeError(f"FastLiLiCorrSelect wraps a sglang_lilicorr.head.LiLiCorrHead, got {type(head).__name__}.")
        self.head = head.eval()
        cfg = head.config
        w = head.pass_hidden_proj.weight
        self.dtype, self.device = w.dtype, w.device
        self.num_slots, self.topk, self.width, self.factor_dim = cfg.num_slots, cfg.candidate_topk, head.width, cfg.factor_dim
        self.sigma, self.vector_eps = float(cfg.logit_scale), float(cfg.vector_eps)
        h = self.width
        self.fused = uses_triton(w) if fused is None else bool(fused)
        if self.fused and not uses_triton(w):
            raise ValueError(
                f"FastLiLiCorrSelect(fused=True) needs the head on CUDA (or CPU with TRITON_INTERPRET=1), "
                f"got {w.device}; pass fused=False for the PyTorch path."
            )
        self.overlap = self.fused and w.is_cuda and (overlap is None or bool(overlap))
        self._side = torch.cuda.Stream(device=self.device) if self.overlap else None
        self.norm_epilogue = norm_epilogue
        from .kernels.pdl import pdl_supported

        self._can_pdl = self.fused and w.is_cuda and pdl_supported(w)
        if pdl and not self._can_pdl:
            raise ValueError(
                f"FastLiLiCorrSelect(pdl=True) needs the fused path on a CUDA device of compute capability 9.0+, "
                f"got fused={self.fused} on {w.device}; pass pdl=None or False"
            )
        if triton_gemms and not self.fused:
            raise ValueError("FastLiLiCorrSelect(triton_gemms=True) needs the fused path (fused=True)")
        if fold_norms and (not self.fused or norm_epilogue or triton_gemms is False):
            raise ValueError(
                f"FastLiLiCorrSelect(fold_norms=True) runs every lattice GEMM as a Triton GEMM with the norms folded in: "
                f"it needs fused=True and excludes norm_epilogue=True / triton_gemms=False, got fused={self.fused}, "
                f"norm_epilogue={norm_epilogue}, triton_gemms={triton_gemms}"
            )
        if (pass_beside_topk or nodes_in_gemm) and (not self._can_pdl or pdl is False or fold_norms is False):
            raise ValueError(
                f"FastLiLiCorrSelect(pass_beside_topk / nodes_in_gemm=True) runs the pass projection beside the top-K under PDL "
                f"and the nodes in the folded-norm feature GEMM: it needs the fused path on a CUDA sm_90+ device with pdl and "
                f"fold_norms not False, got fused={self.fused} on {w.device}, pdl={pdl}, fold_norms={fold_norms}; pass None or False"
            )
        if release_early and (not self._can_pdl or pdl is False):
            raise ValueError(
                f"FastLiLiCorrSelect(release_early=True) releases the next kernel of a PDL chain early: it needs the fused path "
                f"on a CUDA sm_90+ device with pdl not False, got fused={self.fused} on {w.device}, pdl={pdl}; pass None or False"
            )
        if narrow_tiles and (not self.fused or self.dtype == torch.float32):
            raise ValueError(
                f"FastLiLiCorrSelect(narrow_tiles=True) sets the tiles of a 16-bit head's Triton GEMMs: it needs the fused path "
                f"and a bf16 / fp16 head, got fused={self.fused}, {self.dtype} on {w.device}; pass None or False"
            )
        if cosine_split is not None:
            if not self.fused:
                raise ValueError(
                    f"FastLiLiCorrSelect(cosine_split={cosine_split!r}) sets the Triton cosine + walk kernel's launch: it needs "
                    f"the fused path, got fused=False; pass None"
                )
            from .kernels.head_scores import LAUNCH, check_split

            check_split("FastLiLiCorrSelect(cosine_split=...)", self.factor_dim, LAUNCH._replace(split=cosine_split))
        if merge_in_confidence and not self.fused:
            raise ValueError(
                "FastLiLiCorrSelect(merge_in_confidence=True) merges the Triton top-K's partials in the Triton confidence "
                "kernel: it needs the fused path, got fused=False; pass None or False"
            )
        if pass_tiles and not self.fused:
            raise ValueError(
                f"FastLiLiCorrSelect(pass_tiles={pass_tiles!r}) sets the tiles of the Triton pass projection beside the top-K: "
                f"it needs the fused path, got fused=False; pass None or False"
            )
        if isinstance(pass_tiles, str):
            from .kernels.ffn_silu import CONFIGS

            if pass_tiles not in CONFIGS:
                raise ValueError(f"FastLiLiCorrSelect(pass_tiles={pass_tiles!r}): not an ffn_silu config; use one of {sorted(CONFIGS)}")
        if topk_launch is not None:
            from .kernels.topk_lse_fused import TopKLaunch

            unknown = set(topk_launch) - set(TopKLaunch._fields)
            if unknown:
                raise ValueError(f"FastLiLiCorrSelect(topk_launch=...): {sorted(unknown)} are not TopKLaunch fields {TopKLaunch._fields}")
        self.narrow_tiles, self.cosine_split, self.merge_in_confidence = narrow_tiles, cosine_split, merge_in_confidence
        if attention_block_m is not None and (not self.fused or attention_block_m < 16 or attention_block_m & (attention_block_m - 1)):
            raise ValueError(
                f"FastLiLiCorrSelect(attention_block_m={attention_block_m!r}) sets the Triton lattice attention's query rows per "
                f"program: it needs the fused path and a power of two >= 16, got fused={self.fused}; pass None"
            )
        self.topk_launch, self.pass_tiles, self.attention_block_m = topk_launch, pass_tiles, attention_block_m
        self.pdl, self.triton_gemms, self.fold_norms = pdl, triton_gemms, fold_norms
        self.pass_beside_topk, self.nodes_in_gemm, self.release_early = pass_beside_topk, nodes_in_gemm, release_early
        self._prefetch = None if prefetch_weights else False  # linear_act_triton's prefetch: None = when launched early
        # int32 zeros for the last-program counters (kernels/linear_norm.py's row tiles, the cosine kernel's
        # walk per request; this stream only, each kernel leaves them zero), sized up front so that a
        # CUDA-graph capture never reallocates them (4096 tiles of >= 16 rows: 65536 lattice rows, bs 546)
        self._row_counters = torch.zeros(4096, dtype=torch.int32, device=self.device) if self.fused else None

        with torch.no_grad():
            if token_table is None:
                token_table = head.token_table(embed_weight.to(self.device))
            if token_table.dim() != 2 or token_table.shape[1] != h:
                raise ValueError(f"FastLiLiCorrSelect: token_table {tuple(token_table.shape)} is not [V, {h}].")
            self.token_table = token_table.to(self.device, self.dtype).contiguous()  # [V, H]

            self.w_pass = head.pass_hidden_proj.weight.contiguous()  # [H, Hm], bias in node_const
            mlp, ln = head.feature_mlp, head.feature_norm
            up_w = mlp.up_proj.weight.float()  # [H, 5]
            ln_w = ln.weight.float() if ln.weight is not None else torch.ones(up_w.shape[1], device=self.device)
            ln_b = ln.bias.float() if ln.bias is not None else torch.zeros(up_w.shape[1], device=self.device)
            self.w_feat = (up_w * ln_w).contiguous()  # [H, 5] fp32
            self.b_feat = (up_w @ ln_b + mlp.up_proj.bias.float()).contiguous()  # [H] fp32
            self.feat_ln_eps = float(ln.eps)
            self.w_down = mlp.down_proj.weight.contiguous()  # [H, H], bias in node_const
            self.node_const = (
                head.slot_embedding[0, 0].float()  # [S, 1, H]
                + head.rank_embedding[0, 0].float()  # [1, K, H]
                + mlp.down_proj.bias.float()
                + head.pass_hidden_proj.bias.float()
            ).contiguous()  # [S, K, H] fp32
            self.node_const_model = self.node_const.to(self.dtype)

            n_max = self.num_slots * self.topk
            pad = -(-n_max // 16) * 16
            bias = torch.zeros(1, cfg.num_heads, n_max, pad, device=self.device, dtype=self.dtype)
            bias[..., :n_max] = lattice_attention_bias(head.relative_slot_bias, head.same_slot_bias, self.num_slots, self.topk)
            self.attn_bias = bias[..., :n_max]  # [1, heads, L, L], row stride 16-aligned for SDPA kernels

            wf = head.factor_input_proj.weight  # [H, 3H] over concat[h, t, h*t]
            self.w_factor = torch.cat([wf[:, :h], wf[:, 2 * h :]], dim=1).contiguous()  # [H, 2H]
            self.w_anchor = torch.cat([head.anchor_out_head.weight, wf[:, h : 2 * h]], dim=0).contiguous()  # [D+H, H]
            self.b_anchor = torch.cat([head.anchor_out_head.bias, head.factor_input_proj.bias]).contiguous()  # [D+H]
            self.w_edge = torch.cat([head.out_head.weight, head.in_head.weight], dim=0).contiguous()  # [2D, H]
            self.b_edge = torch.cat([head.out_head.bias, head.in_head.bias]).contiguous()  # [2D]

        layers = head.layers
        # the RMSNorm that follows each residual add: layer i's mlp_norm, then layer i+1's attn_norm / output_norm
        self._after_attn = [layer.mlp_norm for layer in layers]
        self._after_mlp = [layers[i + 1].attn_norm for i in range(len(layers) - 1)] + [head.output_norm]
        if self.fused and fold_norms is not False and (fold_norms or self.width in FOLD_NORMS_MAX_ROWS):
            # fold_norms: each pre-norm's gain folded into a copy of the weight of the GEMM that reads it
            from .kernels.ffn_silu import fold_norm_gain

            with torch.no_grad():
                self.w_qkv_folded = [fold_norm_gain(layer.attn.in_proj_weight, layer.attn_norm.weight) for layer in layers]
                self.w_up_folded = [fold_norm_gain(layer.mlp.up_proj.weight, layer.mlp_norm.weight) for layer in layers]
                self.w_factor_folded = fold_norm_gain(self.w_factor, head.output_norm.weight)

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

    # --- stages ------------------------------------------------------------------------------

    def candidates(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor):
        """hidden [b, S, Hm], lm_head_weight [V, Hm] -> (vals fp32 [b, S, K], ids [b, S, K], lse fp32 [b, S])."""
        return self._candidates_from_logits(self._logits(hidden, lm_head_weight), *hidden.shape[:2])

    def _logits(self, hidden, lm_head_weight):
        """hidden [b, S, Hm], lm_head_weight [V, Hm] -> the slots' logits [b*S, V]."""
        b, s, hm = hidden.shape
        if lm_head_weight.dim() != 2 or lm_head_weight.shape != (self.token_table.shape[0], hm):
            raise ValueError(
                f"select: lm_head_weight must be [{self.token_table.shape[0]}, {hm}] (vocabulary x hidden), "
                f"got {tuple(lm_head_weight.shape)}."
            )
        return F.linear(hidden.reshape(b * s, hm).to(lm_head_weight.dtype), lm_head_weight)

    def _candidates_from_logits(self, logits, b, s, beside: bool = False):
        """`beside`: the top-K split runs beside the kernel launched before it (_pass_beside_topk)."""
        rows = b * s * self.topk
        vals, ids, lse = topk_lse(logits, self.topk, pdl=self._pdl_at(rows), beside=beside, launch=self._topk_launch(rows))
        return vals.view(b, s, self.topk), ids.view(b, s, self.topk), lse.view(b, s)

    def _candidate_parts(self, logits, b, s, beside: bool):
        """The top-K's split kernel only, as _candidates_from_logits launches it -> its partials (TopKParts), which the
        confidence kernel merges (merge_in_confidence)."""
        from .kernels.topk_lse_fused import LAUNCH, topk_lse_parts

        rows = b * s * self.topk
        launch = LAUNCH._replace(**self._topk_launch(rows))
        return topk_lse_parts(logits, self.topk, launch=launch, pdl=self._pdl_at(rows), beside=beside)

    def _pass_projection(self, pass_hidden, pdl: bool = False):
        """-> pass_hidden_proj without its bias (folded into node_const) [b, S, H]: where the select runs it beside
        the top-K (_passes_beside_topk) a Triton GEMM, launched there with PDL (`pdl`), so that lattice_scores gets
        the same bits; else cuBLAS."""
        b, s, hm = pass_hidden.shape
        x = pass_hidden.to(self.dtype)
        if not self._passes_beside_topk(b * s * self.topk):
            return F.linear(x, self.w_pass)
        from .kernels.ffn_silu import linear_act_triton

        # No weight prefetch: launched first in the select, its wait overlaps nothing, and a prefetch ahead of it only
        # delays its release of the top-K split beside it (-1.4 us at paper bs 1, H100: PERF_NOTES.md version 22).
        return linear_act_triton(
            x.reshape(b * s, hm), self.w_pass, pdl=pdl, prefetch=False, config=self._pass_tiles(b * s * self.topk)
        ).view(b, s, -1)

    def _passes_beside_topk(self, rows: int) -> bool:
        """Whether a select from logits with `rows` lattice rows runs the pass projection beside the top-K: forced by
        pass_beside_topk wherever PDL is on at that size (the top-K needs it to run beside), else by the table."""
        if self.pass_beside_topk is not None:
            return self.pass_beside_topk and self._pdl_at(rows)
        return self._can_pdl and self._folds_norms(rows) and rows <= PASS_BESIDE_TOPK_MAX_ROWS.get(self.width, 0)

    def _anchor_projection(self, anchor_hidden):
        """-> anchor state t [b, H] and [anchor_out | W_t t + b] [b, D+H] (one GEMM on t)."""
        t = self.head.context_proj(anchor_hidden.to(self.dtype))
        if self.fused:  # one Triton RMSNorm launch, like the other norms of the fused path
            from .kernels.head_norm import rmsnorm_triton

            t = rmsnorm_triton(t, self.head.anchor_norm.weight, _norm_eps(self.head.anchor_norm))
        else:
            t = self.head.anchor_norm(t)
        return t, F.linear(t, self.w_anchor, self.b_anchor)

    def lattice_scores(self, vals, ids, lse, pass_hidden, anchor_hidden):
        """Candidates + drafter states -> (start fp32 [b, K], pair fp32 [b, S-1, K, K], log-probs fp32 [b, S, K])."""
        self._check_candidates(vals, ids, lse, pass_hidden, anchor_hidden)
        with torch.no_grad():
            if self.fused:
                return self._scores_fused(vals, ids, lse, pass_hidden, anchor_hidden)[:3]
            return self._scores_torch(vals, ids, lse, pass_hidden, anchor_hidden)

    def _check_candidates(self, vals, ids, lse, pass_hidden, anchor_hidden) -> None:
        b, s = self._check(pass_hidden, anchor_hidden)
        if vals.shape != (b, s, self.topk) or ids.shape != vals.shape or lse.shape != (b, s):
            raise ValueError(
                f"select: candidates vals {tuple(vals.shape)} / ids {tuple(ids.shape)} / lse {tuple(lse.shape)} "
                f"do not match [{b}, {s}, {self.topk}] / [{b}, {s}]."
            )

    def _scores_torch(self, vals, ids, lse, pass_hidden, anchor_hidden):
        b, s, k = vals.shape
        h, d, n = self.width, self.factor_dim, s * self.topk
        lp = vals.float() - lse.float().unsqueeze(-1)  # [b, S, K]
        feats = F.layer_norm(confidence_features(lp).to(self.dtype).float(), (5,), eps=self.feat_ln_eps)
        feat = F.linear(F.silu(F.linear(feats, self.w_feat, self.b_feat)).to(self.dtype), self.w_down)
        pass_proj = self._pass_projection(pass_hidden)
        t, anchor = self._anchor_projection(anchor_hidden)
        x = self.token_table[ids] + pass_proj.unsqueeze(2) + feat + self.node_const_model[:s]  # [b, S, K, H]
        x = x.reshape(b, n, h)
        bias = self.attn_bias[..., :n, :n]
        for layer in self.head.layers:
            x = layer(x, bias)
        x = self.head.output_norm(x)
        tt = t.unsqueeze(1)
        fused = F.silu(F.linear(torch.cat([x, x * tt], dim=-1), self.w_factor) + anchor[:, None, d:])
        edges = F.linear(fused, self.w_edge, self.b_edge).view(b, s, k, 2, d).float()
        out_vec, in_vec = F.normalize(edges, dim=-1, eps=self.vector_eps).unbind(3)
        anchor_out = F.normalize(anchor[:, :d].float(), dim=-1, eps=self.vector_eps)
        start = self.sigma * torch.einsum("bd,bkd->bk", anchor_out, in_vec[:, 0])
        pair = self.sigma * torch.matmul(out_vec[:, :-1], in_vec[:, 1:].transpose(-1, -2))
        return start, pair, lp

    def _projections(self, pass_hidden, anchor_hidden, pass_proj=None) -> tuple:
        """-> (pass projection, t, anchor, join_pass, join_anchor): with overlap both projections run on the
        side stream, forked here, and each is joined where first needed by calling its join (None without
        overlap). (Forked before the top-K instead, they slowed it down from bs 4 on: PERF_NOTES.md version 17.)
        A given `pass_proj` (made on the main stream: _pass_beside_topk) is taken as is, with no join."""
        if not self.overlap:
            proj = self._pass_projection(pass_hidden) if pass_proj is None else pass_proj
            return proj, *self._anchor_projection(anchor_hidden), None, None
        side = _SideStream(self._side)
        with side:
            if pass_proj is None:
                pass_proj = self._pass_projection(pass_hidden)
                pass_ready = side.record()
            else:
                pass_ready = None
            t, anchor = self._anchor_projection(anchor_hidden)
            anchor_ready = side.record()
        join_pass = None if pass_ready is None else lambda: side.join(pass_ready, pass_proj)
        return pass_proj, t, anchor, join_pass, lambda: side.join(anchor_ready, t, anchor)

    def _scores_fused(self, vals, ids, lse, pass_hidden, anchor_hidden, walk: bool = False, pass_proj=None, parts=None):
        """-> (start, pair, log-probs [b, S, K], draft ids [b, S] from the cosine kernel's greedy walk if `walk` else None);
        `pass_proj`: the pass projection made on the main stream before the top-K (_pass_beside_topk), else None;
        `parts`: the top-K's partials instead of vals and lse (None), merged by the confidence kernel into `ids`."""
        b, s, k = ids.shape
        beside = pass_proj is not None
        pass_proj, t, anchor, join_pass, join_anchor = self._projections(pass_hidden, anchor_hidden, pass_proj)
        lp, x, xn = self._nodes_fused(vals, ids, lse, pass_proj, join_pass, node_gemm=beside and self.nodes_in_gemm is not False,
                                      parts=parts)
        cat, sumsq = self._layers_fused(x, xn, b, t, join_anchor)
        start, pair, draft = self._factors_fused(cat, sumsq, anchor, b, s, ids if walk else None)
        return start, pair, lp.view(b, s, k), draft

    def _nodes_fused(self, vals, ids, lse, pass_proj, join_pass=None, node_gemm: bool = False, parts=None):
        """-> log-probs fp32 [b*S, K], residual stream x [b*L, H], first attention input [b*L, H]. Where the
        norms fold into the GEMMs (_folds_norms): x is a [b*L, 2H] buffer whose first half is the residual
        stream (the last layer writes x * t into the second), and the sums of squares of its rows stand
        in for the attention input (fp32 [b*L, H / 16], kernels/head_norm.py); there `node_gemm` (the pass
        projection on the main stream, no join) makes the nodes the feature down GEMM's epilogue. `parts` (vals and lse
        None): the top-K's partials, which the confidence kernel merges, writing the ids into `ids`."""
        from .kernels.ffn_silu import linear_act_triton
        from .kernels.head_nodes import confidence_up_triton, lattice_nodes_triton
        from .kernels.head_norm import sumsq_parts
        from .kernels.linear_norm import lattice_nodes_linear_triton

        b, s, k = ids.shape
        pdl = self._pdl_at(b * s * k)
        if parts is None:
            vals, lse = vals.reshape(b * s, k).float(), lse.reshape(b * s).float()
        lp, up = confidence_up_triton(
            vals, lse, self.w_feat, self.b_feat, self.feat_ln_eps, self.dtype, pdl=pdl, release_early=self._releases_early(b * s * k),
            parts=parts, ids_out=None if parts is None else ids,
        )
        norm, rows, h = self.head.layers[0].attn_norm, b * s * k, self.width
        folds = self._folds_norms(rows)
        counters = None if folds else self._norm_counters(rows, h)
        if counters is not None:  # the down GEMM with the node sum + norm in its epilogue
            if join_pass is not None:
                join_pass()
            x, xn = lattice_nodes_linear_triton(
                up, self.w_down, ids, self.token_table, pass_proj, self.node_const, norm.weight, _norm_eps(norm), counters
            )
            return lp, x, xn
        if folds and node_gemm:  # launched early: the pass projection is this stream's, made before the top-K
            cat, sumsq = torch.empty((rows, 2 * h), dtype=self.dtype, device=self.device), sumsq_parts(rows, h, self.device)
            nodes = (ids.contiguous(), self.token_table, pass_proj.contiguous(), self.node_const)
            linear_act_triton(
                up, self.w_down, nodes=nodes, out=cat[:, :h], sumsq_out=sumsq, pdl=pdl, prefetch=self._prefetch,
                config=self._tiles("nodes", rows),
            )
            return lp, cat, sumsq
        # [b*S*K, H]; where the norms fold, the Triton GEMM that carries the node epilogue above: the same bits either way
        feat = linear_act_triton(up, self.w_down, pdl=pdl, prefetch=self._prefetch) if folds else self._linear(up, self.w_down)
        if join_pass is not None:
            join_pass()
        cat = torch.empty((rows, 2 * h), dtype=self.dtype, device=self.device) if folds else None
        folded = dict(out=cat[:, :h], sumsq_out=sumsq_parts(rows, h, self.device)) if folds else {}  # the norm left to QKV
        x, xn = lattice_nodes_triton(
            ids, self.token_table, pass_proj, feat, self.node_const, norm.weight, _norm_eps(norm), **folded,
            pdl=pdl, launch_pdl=join_pass is None,  # the first launch after a join waits in full
        )
        return lp, (cat if folds else x), xn

    def _layers_fused(self, x, xn, b, t, join_anchor=None):
        """Lattice transformer on x [b*L, H] (updated in place) -> (concat[h, h*t] [b*L, 2H], None); with
        folded norms (x, xn as _nodes_fused gives them) -> (x: [x, x * t], the sums of squares of x's rows),
        each norm inside the GEMM that reads it, each residual add in the GEMM before (_layers_folded)."""
        from .kernels.ffn_silu import linear_silu_triton, prefer_triton
        from .kernels.lattice_attention import lattice_attention_triton

        if self._folds_norms(x.shape[0]):
            return self._layers_folded(x, xn, b, t, join_anchor)
        n, pdl = x.shape[0] // b, self._pdl_at(x.shape[0])
        bias = self.attn_bias[..., :n, :n]  # [1, heads, n, n], 16-aligned rows: taken as is
        layers = self.head.layers
        for i, layer in enumerate(layers):
            attn = layer.attn
            qkv = self._linear(xn, attn.in_proj_weight, attn.in_proj_bias)  # [b*n, 3H]
            last = i == len(layers) - 1
            joined = last and join_anchor is not None
            if joined:  # t for the last FFN down; the attention has no weight to prefetch, so it takes the full-order launch
                join_anchor()
            attended = lattice_attention_triton(
                qkv, bias, attn.num_heads, block_m=self._attention_block_m(x.shape[0]), pdl=pdl, launch_pdl=not joined
            )
            xn = self._residual_norm(x, attended, attn.out_proj, self._after_attn[i])
            mlp = layer.mlp
            if prefer_triton(xn.shape[0]) or self._gemm_in_triton(xn.shape[0], mlp.up_proj.weight):  # up GEMM with bias + SiLU in its epilogue
                hidden = linear_silu_triton(xn, mlp.up_proj.weight, mlp.up_proj.bias, pdl=pdl, prefetch=self._prefetch)
            else:
                hidden = F.silu(mlp.up_proj(xn))
            xn = self._residual_norm(x, hidden, mlp.down_proj, self._after_mlp[i], cross=t if last else None)
        return xn, None

    def _layers_folded(self, cat, sumsq, b, t, join_anchor=None):
        """The lattice layers as five Triton GEMMs + the attention each: cat [b*L, 2H] holds the residual
        stream x in its first half, sumsq [b*L, H / 16] its rows' partial sums of squares; every GEMM
        that adds into x writes them anew for the next one's norm, and the last also writes x * t into
        cat's second half -> (cat, sumsq of the final x)."""
        from .kernels.ffn_silu import linear_act_triton
        from .kernels.head_norm import sumsq_parts
        from .kernels.lattice_attention import lattice_attention_triton

        rows, h = cat.shape[0], self.width
        n, x = rows // b, cat[:, :h]
        launch = dict(pdl=self._pdl_at(rows), prefetch=self._prefetch)
        bias = self.attn_bias[..., :n, :n]
        layers = self.head.layers
        for i, layer in enumerate(layers):
            attn, mlp = layer.attn, layer.mlp
            qkv = linear_act_triton(x, self.w_qkv_folded[i], attn.in_proj_bias, norm=(sumsq, _norm_eps(layer.attn_norm)), **launch)
            last = i == len(layers) - 1
            joined = last and join_anchor is not None
            if joined:  # as in _layers_fused: the attention after the join, every GEMM launched early
                join_anchor()
            attended = lattice_attention_triton(
                qkv, bias, attn.num_heads, block_m=self._attention_block_m(rows), pdl=launch["pdl"], launch_pdl=not joined
            )
            sumsq = sumsq_parts(rows, h, self.device)
            linear_act_triton(
                attended, attn.out_proj.weight, attn.out_proj.bias, residual=x, sumsq_out=sumsq,
                config=self._tiles("out_proj", rows), **launch,
            )
            norm = (sumsq, _norm_eps(layer.mlp_norm))
            hidden = linear_act_triton(
                x, self.w_up_folded[i], mlp.up_proj.bias, silu=True, norm=norm, config=self._tiles("ffn_up", rows), **launch
            )
            sumsq = sumsq_parts(rows, h, self.device)
            linear_act_triton(
                hidden, mlp.down_proj.weight, mlp.down_proj.bias, residual=x, sumsq_out=sumsq,
                cross=(t, cat[:, h:]) if last else None, **launch,
            )
        return cat, sumsq

    def _residual_norm(self, x, branch, linear: torch.nn.Linear, norm: torch.nn.RMSNorm, cross=None):
        """x += linear(branch) (in place; not with cross) -> RMSNorm(x) [rows, H], or concat[h, h*t]
        [rows, 2H] with cross (the anchor state t): one GEMM with the add + norm in its epilogue
        where _norm_counters says so, else the GEMM (self._linear) + add_rmsnorm_triton."""
        from .kernels.head_norm import add_rmsnorm_triton
        from .kernels.linear_norm import linear_add_rmsnorm_triton

        counters = self._norm_counters(*x.shape)
        if counters is None:
            y = self._linear(branch, linear.weight, linear.bias)
            return add_rmsnorm_triton(x, y, norm.weight, _norm_eps(norm), cross=cross, pdl=self._pdl_at(x.shape[0]))
        return linear_add_rmsnorm_triton(branch, linear.weight, linear.bias, x, norm.weight, _norm_eps(norm), counters, cross)

    def _norm_counters(self, rows: int, h: int):
        """The row-tile counters of kernels/linear_norm.py where its GEMM + norm epilogue serves
        [rows, h] (its measured table, or `norm_epilogue`), else None (cuBLAS + a norm kernel)."""
        from .kernels.linear_norm import prefer_fused, row_tiles

        if not (prefer_fused(h, rows) if self.norm_epilogue is None else self.norm_epilogue):
            return None
        return self._counters(row_tiles(rows, h, self.dtype))

    def _counters(self, need: int) -> torch.Tensor:
        """The int32 zero counters of this stream's last-program kernels (row tiles, requests), >= need entries."""
        if self._row_counters.numel() < need:
            if self._row_counters.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(
                    f"select: this batch needs {need} kernel counters, more than the {self._row_counters.numel()} "
                    f"allocated; run one eager select at this batch size before capturing a CUDA graph of it"
                )
            self._row_counters = torch.zeros(need, dtype=torch.int32, device=self.device)
        return self._row_counters

    def _factors_fused(self, cat, sumsq, anchor, b, s, ids=None):
        """concat[h, h*t] [b*L, 2H], anchor [b, D+H] -> (start fp32 [b, K], pair fp32 [b, S-1, K, K],
        draft ids [b, S] walked in the cosine kernel if candidate `ids` [b, S, K] are given, else None).
        With folded norms `cat` is [x, x * t] and sumsq the sums of squares of x's rows (_layers_folded):
        the factor GEMM applies the output norm (its rstd per row, its gain in w_factor_folded)."""
        from .kernels.ffn_silu import linear_act_triton
        from .kernels.head_norm import row_bias_silu_triton
        from .kernels.head_scores import LAUNCH, lattice_cosine_triton, lattice_cosine_walk_triton, walk_counters

        d, k, pdl = self.factor_dim, self.topk, self._pdl_at(cat.shape[0])
        if sumsq is not None:
            norm = (sumsq, _norm_eps(self.head.output_norm))
            fused = linear_act_triton(
                cat, self.w_factor_folded, silu=True, group_bias=anchor[:, d:], rows_per_group=s * k,
                norm=norm, norm_width=self.width, pdl=pdl, prefetch=self._prefetch, config=self._tiles("factor", cat.shape[0]),
            )
        elif self._gemm_in_triton(cat.shape[0], self.w_factor, absorbs_launch=True):  # the per-request bias + SiLU in its epilogue
            fused = linear_act_triton(
                cat, self.w_factor, silu=True, group_bias=anchor[:, d:], rows_per_group=s * k, pdl=pdl, prefetch=self._prefetch,
            )
        else:
            fused = row_bias_silu_triton(F.linear(cat, self.w_factor), anchor[:, d:], rows_per_group=s * k, pdl=pdl)  # [b*L, H]
        edges = self._linear(fused, self.w_edge, self.b_edge, config=self._tiles("out_in", cat.shape[0])).view(b, s, k, 2 * d)
        if ids is None:
            return (*lattice_cosine_triton(edges, anchor[:, :d], self.sigma, self.vector_eps, pdl=pdl), None)
        launch = LAUNCH._replace(split=self._cosine_split(cat.shape[0]))
        counters = self._counters(walk_counters(b, s, launch))
        return lattice_cosine_walk_triton(edges, anchor[:, :d], self.sigma, self.vector_eps, ids, counters, launch, pdl=pdl)

    def _folds_norms(self, rows: int) -> bool:
        """Whether a call with `rows` lattice rows folds the lattice's norms into its Triton GEMMs (see fold_norms)."""
        if self.fold_norms is not None:
            return self.fold_norms
        return (self.fused and not self.norm_epilogue and self.triton_gemms is not False and self._pdl_at(rows)
                and rows <= FOLD_NORMS_MAX_ROWS.get(self.width, 0))

    def _releases_early(self, rows: int) -> bool:
        """Whether a call with `rows` lattice rows has its confidence kernel release the next kernel at its start (see
        release_early): only under PDL."""
        if not self._pdl_at(rows):
            return False
        if self.release_early is not None:
            return self.release_early
        return rows <= RELEASE_EARLY_MAX_ROWS.get(self.width, 0)

    def _tiles(self, role: str, rows: int) -> str | None:
        """The launch config of the Triton GEMM `role` (a role of NARROW_TILES) at `rows` lattice rows: "narrow" where
        narrow_tiles or NARROW_TILES say so, else None (ffn_silu's config by M and dtype: fp32 keeps its own)."""
        if self.dtype == torch.float32:
            return None
        if self.narrow_tiles is not None:
            return "narrow" if self.narrow_tiles else None
        max_rows, roles = NARROW_TILES.get(self.width, (0, ()))
        return "narrow" if rows <= max_rows and role in roles else None

    def _topk_launch(self, rows: int) -> dict:
        """The TopKLaunch fields the top-K split takes at `rows` lattice rows (see topk_launch): {} keeps its defaults."""
        if self.topk_launch is not None:
            return self.topk_launch
        max_rows, fields = TOPK_LAUNCH.get(self.width, (0, {}))
        return fields if rows <= max_rows else {}

    def _pass_tiles(self, rows: int) -> str | None:
        """The ffn_silu config of the pass projection beside the top-K at `rows` lattice rows (see pass_tiles); None: by M."""
        if self.dtype == torch.float32 or self.pass_tiles is False:
            return None
        if self.pass_tiles is not None:
            return self.pass_tiles
        max_rows, config = PASS_TILES.get(self.width, (0, None))
        return config if rows <= max_rows else None

    def _attention_block_m(self, rows: int) -> int | None:
        """Query rows per lattice-attention program at `rows` lattice rows (see attention_block_m); None: the kernel's
        default by batch size."""
        if self.attention_block_m is not None:
            return self.attention_block_m
        max_rows, block_m = ATTENTION_BLOCK_M.get(self.width, (0, None))
        return block_m if rows <= max_rows else None

    def _merges_in_confidence(self, rows: int) -> bool:
        """Whether a select from logits with `rows` lattice rows merges the top-K in the confidence kernel (see
        merge_in_confidence)."""
        if self.merge_in_confidence is not None:
            return self.merge_in_confidence
        return rows <= MERGE_IN_CONFIDENCE_MAX_ROWS.get(self.width, 0)

    def _cosine_split(self, rows: int) -> int:
        """Programs per factor of the cosine + walk kernel at `rows` lattice rows (see cosine_split)."""
        if self.cosine_split is not None:
            return self.cosine_split
        max_rows, split = COSINE_SPLIT.get(self.factor_dim, (0, 1))
        return split if rows <= max_rows else 1

    def _pdl_at(self, rows: int) -> bool:
        """Whether a call with `rows` lattice rows launches its Triton kernels with PDL (see pdl)."""
        if self.pdl is not None:
            return self.pdl
        return self._can_pdl and rows <= PDL_MAX_ROWS.get(self.width, rows)

    def _gemm_in_triton(self, rows: int, weight: torch.Tensor, absorbs_launch: bool = False) -> bool:
        """Whether a head GEMM of `rows` rows by `weight` [N, K] runs as a Triton GEMM (see triton_gemms).
        `absorbs_launch`: its Triton epilogue replaces a launch (the factor's bias + SiLU), worth more
        than TRITON_GEMM_MAX_SHAPE's margins, so the shape table does not apply."""
        if self.triton_gemms is not None:
            return self.triton_gemms and rows <= TRITON_GEMM_ROWS_CAP
        n, k = weight.shape
        max_k, max_n = (k, n) if absorbs_launch else TRITON_GEMM_MAX_SHAPE.get(self.width, (k, n))
        return self._pdl_at(rows) and rows <= TRITON_GEMM_MAX_ROWS.get(self.width, 0) and k <= max_k and n <= max_n

    def _linear(self, x, weight, bias=None, config: str | None = None):
        """x @ weight.T + bias on the main stream: a Triton GEMM (with PDL where _pdl_at; `config` its tiles, None: by M)
        where _gemm_in_triton, else cuBLAS."""
        if not self._gemm_in_triton(x.shape[0], weight):
            return F.linear(x, weight, bias)
        from .kernels.ffn_silu import linear_act_triton

        return linear_act_triton(x, weight, bias, pdl=self._pdl_at(x.shape[0]), prefetch=self._prefetch, config=config)

    def fused_stages(self, vals, ids, lse, pass_hidden, anchor_hidden) -> dict:
        """The fused path (without the side stream) cut into its stages, name -> zero-argument call
        on the previous stage's outputs (computed once here), for per-stage timing and launch
        counts (benchmarks/head_bench.py). The `lattice` stage updates its input x in place, so
        repeated calls drift its values (not its cost)."""
        if not self.fused:
            raise ValueError("fused_stages: this FastLiLiCorrSelect runs the PyTorch path; build it with fused=True.")
        b, s = self._check(pass_hidden, anchor_hidden)
        with torch.no_grad():
            pass_proj, (t, anchor) = self._pass_projection(pass_hidden), self._anchor_projection(anchor_hidden)
            lp, x, xn = self._nodes_fused(vals, ids, lse, pass_proj)
            cat, sumsq = self._layers_fused(x.clone(), xn, b, t)
        stages = {
            "projections": lambda: (self._pass_projection(pass_hidden), self._anchor_projection(anchor_hidden)),
            "nodes": lambda: self._nodes_fused(vals, ids, lse, pass_proj),
            "lattice": lambda: self._layers_fused(x, xn, b, t),
            "factors": lambda: self._factors_fused(cat, sumsq, anchor, b, s, ids),  # with the walk, as served
        }
        return {name: torch.no_grad()(fn) for name, fn in stages.items()}

    def walk(self, start: torch.Tensor, pair: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Greedy walk (App. F) over the factors -> draft token ids [b, S]."""
        if uses_triton(start):
            from .kernels.walk import greedy_walk_triton

            rows = start.shape[0] * ids.shape[1] * ids.shape[2]
            return greedy_walk_triton(start, pair, ids, pdl=self._pdl_at(rows))  # the gather of the walked ids in the same kernel
        path = greedy_walk(start, pair)
        return ids.gather(2, path.unsqueeze(-1)).squeeze(-1)

    # --- entry points ------------------------------------------------------------------------

    def select_from_candidates(self, vals, ids, lse, pass_hidden, anchor_hidden):
        """Head + walk on given candidates -> (draft ids [b, S], ids [b, S, K], log-probs fp32 [b, S, K]).
        The fused path walks inside its cosine kernel (kernels/head_scores.py)."""
        if not self.fused:
            start, pair, lp = self.lattice_scores(vals, ids, lse, pass_hidden, anchor_hidden)
            return self.walk(start, pair, ids), ids, lp
        self._check_candidates(vals, ids, lse, pass_hidden, anchor_hidden)
        with torch.no_grad():
            lp, draft = self._scores_fused(vals, ids, lse, pass_hidden, anchor_hidden, walk=True)[2:]
        return draft, ids, lp

    def _select_fused_from_logits(self, logits, hidden, anchor_hidden, b, s):
        """select_from_logits on the fused path, with the pass projection beside the top-K where _passes_beside_topk."""
        pass_proj = None
        if self._passes_beside_topk(b * s * self.topk):
            # the top-K split writes its buffers while this GEMM may still read its input, so the input (a copy if
            # hidden is not already the head's dtype and contiguous) stays allocated until the top-K is launched
            pass_input = hidden.to(self.dtype).contiguous()
            pass_proj = self._pass_projection(pass_input, pdl=True)
        beside, parts = pass_proj is not None, None
        if self._merges_in_confidence(b * s * self.topk):  # only the split kernel here: the confidence kernel merges
            parts = self._candidate_parts(logits, b, s, beside)
            vals, lse, ids = None, None, torch.empty((b, s, self.topk), dtype=torch.int64, device=self.device)
        else:
            vals, ids, lse = self._candidates_from_logits(logits, b, s, beside=beside)
        pass_input = None  # the top-K is launched: the input may go back to the allocator (stream-ordered)
        lp, draft = self._scores_fused(vals, ids, lse, hidden, anchor_hidden, walk=True, pass_proj=pass_proj, parts=parts)[2:]
        return draft, ids, lp

    def select_from_logits(self, logits: torch.Tensor, hidden: torch.Tensor, anchor_hidden: torch.Tensor):
        """logits [b*S, V] of the slots -> top-K/LSE + head + walk -> (draft ids [b, S], ids [b, S, K],
        log-probs fp32 [b, S, K])."""
        b, s = self._check(hidden, anchor_hidden)
        if logits.dim() != 2 or logits.shape[0] != b * s or logits.shape[1] != self.token_table.shape[0]:
            raise ValueError(f"select: logits must be [{b * s}, {self.token_table.shape[0]}] (b*S x V), got {tuple(logits.shape)}.")
        with torch.no_grad():
            if self.fused:
                return self._select_fused_from_logits(logits, hidden, anchor_hidden, b, s)
            candidates = self._candidates_from_logits(logits, b, s)
        return self.select_from_candidates(*candidates, hidden, anchor_hidden)

    def select(self, hidden: torch.Tensor, anchor_hidden: torch.Tensor, lm_head_weight: torch.Tensor):
        """hidden [b, S, Hm] drafter slot states, anchor_hidden [b, Hm], lm_head_weight [V, Hm]
        -> (draft token ids [b, S], candidate ids [b, S, K], candidate log-probs fp32 [b, S, K])."""
        self._check(hidden, anchor_hidden)
        with torch.no_grad():
            if self.fused:
                return self._select_fused_from_logits(self._logits(hidden, lm_head_weight), hidden, anchor_hidden, *hidden.shape[:2])
            vals, ids, lse = self.candidates(hidden, lm_head_weight)
        return self.select_from_candidates(vals, ids, lse, hidden, anchor_hidden)

    __call__ = select


def greedy_margin(start: torch.Tensor, pair: torch.Tensor) -> torch.Tensor:
    """[b] fp32: the smallest best-minus-second-best score gap along the greedy path of (start, pair).
    Two score sets that differ by less than half of it everywhere walk the same path."""
    rows = torch.arange(start.shape[0], device=start.device)
    if start.shape[-1] < 2:
        return torch.full((start.shape[0],), float("inf"), device=start.device)
    top2 = start.float().topk(2, dim=-1).values
    gap = top2[:, 0] - top2[:, 1]
    cur = start.argmax(-1)
    for s in range(pair.shape[1]):
        row = pair[rows, s, cur].float()
        top2 = row.topk(2, dim=-1).values
        gap = torch.minimum(gap, top2[:, 0] - top2[:, 1])
        cur = row.argmax(-1)
    return gap


def reference_select(head: LiLiCorrHead, token_table, hidden, anchor_hidden, lm_head_weight):
    """The PyTorch definition `FastLiLiCorrSelect.select` must equal: LiLiCorrHead.forward + walk.greedy_walk
    on the stable-sorted top-K of the logits. -> (draft ids, candidate ids, log-probs, start, pair)."""
    from .kernels import topk_lse_reference

    b, s, hm = hidden.shape
    k = head.config.candidate_topk
    with torch.no_grad():
        logits = F.linear(hidden.reshape(b * s, hm).to(lm_head_weight.dtype), lm_head_weight)
        vals, ids, lse = topk_lse_reference(logits, k)
        lp = (vals - lse.unsqueeze(-1)).view(b, s, k)
        ids = ids.view(b, s, k)
        start, pair = head(token_table[ids], lp, hidden, anchor_hidden)
        path = greedy_walk(start, pair)
    return ids.gather(2, path.unsqueeze(-1)).squeeze(-1), ids, lp, start, pair
