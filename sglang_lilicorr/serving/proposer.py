"""The LiLiCorr draft-block proposal after SGLang's DFlash draft pass: pass_hidden [b, S, Hm] --LM head--> logits
--FastLiLiCorrSelect.propose--> draft tokens [b, S], static and sync-free so it is captured in the draft CUDA graph (TP:
vocab_parallel.py; LILICORR_WALK picks the walk). Batches above the largest draft graph replay eager graphs or run
eagerly. Anchors live per request-pool slot (`anchor_table`), staged into batch order before each draft pass."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fast_path.plan import PYTORCH, Device, HeadGeometry, plans_for
from ..fast_path.precompile import CompileReport, precompile
from ..fast_path.select import FastLiLiCorrSelect
from ..head import LiLiCorrHead
from ..walk import WALKS
from . import ALGORITHM_NAME
from .draft_check import env_choice
from .vocab_parallel import ShardedCandidates, VocabShard

EAGER_BUCKET = 8  # requests between the eager proposal's graph sizes above the largest draft graph
WALK_ENV = "LILICORR_WALK"
RULES = {  # what each of walk.WALKS commits, as the start-up line says it
    "greedy": "the greedy walk (each slot the best continuation of the slot before; the paper's rule)",
    "viterbi": "the Viterbi path (the exact maximiser of the block's start + pair scores)",
}


def walk_rule() -> str:
    """LILICORR_WALK, checked: the rule that commits each drafted block (default greedy)."""
    return env_choice(WALK_ENV, WALKS, "greedy", "a decode rule")


def last_rows(*, num_rows: int, extend_lens: torch.Tensor | None, commit_lens: torch.Tensor | None) -> torch.Tensor:
    """Row of each request's last verified token in a target-hidden batch: prefill packs requests back to back
    (extend_lens [b]); verify pads each to the block (num_rows = b * B) and commits commit_lens [b] rows."""
    if commit_lens is not None:
        b = commit_lens.shape[0]
        stride = num_rows // max(b, 1)
        base = torch.arange(b, device=commit_lens.device, dtype=torch.int64) * stride
        return base + commit_lens.to(torch.int64) - 1
    if extend_lens is None:
        raise ValueError("last_rows: pass extend_lens (prefill) or commit_lens (verify)")
    return torch.cumsum(extend_lens.to(torch.int64).flatten(), dim=0) - 1


def _span(sizes: list[int]) -> str:
    """Batch sizes as a log line shows them: "-", "a..b" for a run of three or more, else the list."""
    if len(sizes) > 2 and sizes == list(range(sizes[0], sizes[-1] + 1)):
        return f"{sizes[0]}..{sizes[-1]}"
    return str(sizes) if sizes else "-"


class LiLiCorrProposer:
    def __init__(
        self,
        *,
        head: LiLiCorrHead,
        # [V, Hm] the target's real vocabulary rows (no padding); [vocab.size, Hm] its shard
        lm_head_weight: torch.Tensor,
        embed_weight: torch.Tensor,  # [V', Hm], V' >= V, the target's input embedding table (the whole vocabulary)
        block_size: int,
        vocab: VocabShard | None = None,  # under tensor parallelism: which rows lm_head_weight holds
        walk: str = "greedy",  # the rule that commits the block (walk.WALKS; the server's: walk_rule())
    ) -> None:
        cfg = head.config
        if int(block_size) != cfg.block_size:
            raise ValueError(f"LiLiCorrProposer: block_size={block_size} but the head is trained for {cfg.block_size}")
        self.block_size = cfg.block_size
        self.slots = cfg.num_slots
        self.topk = cfg.candidate_topk
        self.lm_head_weight = lm_head_weight
        self.sharded = None if vocab is None else ShardedCandidates(lm_head_weight, vocab, self.topk)
        vocab_size = lm_head_weight.shape[0] if vocab is None else vocab.vocab_size
        # Triton kernels only on CUDA; the PyTorch path elsewhere
        device = Device.of(head.pass_hidden_proj.weight) if lm_head_weight.is_cuda else PYTORCH
        plans = plans_for(HeadGeometry.of(head), device, walk=walk, merge=self.sharded)
        self.select = FastLiLiCorrSelect(head, embed_weight=embed_weight[:vocab_size], plans=plans)
        self.anchor_table: torch.Tensor | None = None  # [request slots, Hm]
        self.anchors: torch.Tensor | None = None  # [max rows, Hm]
        self.out: torch.Tensor | None = None  # [max rows * S] int64
        self.block_row_before: torch.Tensor | None = None  # [max rows] int64: r * B - 1, verify's row base
        self.eager_in: torch.Tensor | None = None  # [max rows, S, Hm] the eager graphs' input
        self.eager_graphs: dict[int, torch.cuda.CUDAGraph] = {}  # bucket (requests) -> graph writing out[: bucket * S]
        self.precompiled: set[tuple[str, int]] = set()  # ("draft" | "eager", batch size): kernels built (precompile)

    def startup_line(self) -> str:
        """Which rule commits the block, in one line."""
        rule = self.select.walk_rule
        return (
            f"{ALGORITHM_NAME}: each drafted block is committed by {RULES[rule]} "
            f"({WALK_ENV}={rule}; one of {', '.join(WALKS)})."
        )

    def allocate(self, *, num_request_slots: int, max_rows: int) -> None:
        """Static buffers, once SGLang's request pool exists (num_request_slots slots, batches of <= max_rows)."""
        hm, dtype, device = self.lm_head_weight.shape[1], self.lm_head_weight.dtype, self.lm_head_weight.device
        # ordinary tensors: written in place both inside inference_mode (the draft graph) and outside it
        with torch.inference_mode(False):
            self.anchor_table = torch.zeros((int(num_request_slots), hm), dtype=dtype, device=device)
            self.anchors = torch.zeros((int(max_rows), hm), dtype=dtype, device=device)
            self.out = torch.zeros((int(max_rows) * self.slots,), dtype=torch.int64, device=device)
            self.block_row_before = torch.arange(int(max_rows), dtype=torch.int64, device=device) * self.block_size - 1
        if self.sharded is not None:
            self.sharded.allocate(int(max_rows) * self.slots)

    def anchor_rows(
        self, *, num_rows: int, extend_lens: torch.Tensor | None, commit_lens: torch.Tensor | None
    ) -> torch.Tensor:
        """`last_rows`; the verify layout (b blocks of B rows) from the static row base, in one launch."""
        if commit_lens is not None and self.block_row_before is not None:
            b = commit_lens.shape[0]
            if num_rows == b * self.block_size and b <= self.block_row_before.shape[0]:
                return self.block_row_before[:b] + commit_lens  # [b] int64
        return last_rows(num_rows=num_rows, extend_lens=extend_lens, commit_lens=commit_lens)

    def publish_anchors(self, anchor_rows: torch.Tensor, req_pool_indices: torch.Tensor) -> None:
        """anchor_rows [b, Hm] (projected target state of each request's last verified token)."""
        self.anchor_table.index_copy_(0, req_pool_indices.to(torch.int64), anchor_rows.to(self.anchor_table.dtype))

    def stage_anchors(self, req_pool_indices: torch.Tensor) -> None:
        """Gather the batch's anchors into rows 0..b-1 of the static `anchors` buffer."""
        b = req_pool_indices.shape[0]
        if self.anchors is None:
            raise RuntimeError("LiLiCorrProposer.stage_anchors before allocate(): SGLang allocates the pools first")
        if b > self.anchors.shape[0]:
            raise RuntimeError(
                f"LiLiCorrProposer: batch of {b} requests exceeds the {self.anchors.shape[0]} it was sized for"
            )
        torch.index_select(self.anchor_table, 0, req_pool_indices.to(torch.int64), out=self.anchors[:b])

    @torch.inference_mode()
    def propose(self, pass_hidden: torch.Tensor, anchor_hidden: torch.Tensor) -> torch.Tensor:
        """pass_hidden [b, S, Hm], anchor_hidden [b, Hm] -> draft tokens [b, S] int64."""
        hm = self.lm_head_weight.shape[1]  # the LM head of the whole vocabulary, or of this rank's shard
        logits = F.linear(pass_hidden.reshape(-1, hm).to(self.lm_head_weight.dtype), self.lm_head_weight)
        return self.select.propose(logits, pass_hidden, anchor_hidden).draft

    def propose_eager(self, pass_hidden: torch.Tensor) -> torch.Tensor:
        """pass_hidden [b, S, Hm] no draft graph covers -> draft [b, S]: the least eager graph holding b, or eager."""
        b = pass_hidden.shape[0]
        bucket = min((n for n in self.eager_graphs if n >= b), default=None)
        if bucket is None:
            return self.propose(pass_hidden, self.anchors[:b])
        self.eager_in[:b].copy_(pass_hidden)
        self.eager_graphs[bucket].replay()
        return self.out[: b * self.slots].view(b, self.slots)

    def warm(self, *, graph_batch_sizes: list[int], capture: bool, max_batch: int | None = None) -> list[int]:
        """For the batches no draft graph covers, up to `max_batch`: with `capture`, graphs of the proposal at
        `eager_sizes`, else one eager run at each size -> the sizes run."""
        rows, device = self.anchors.shape[0], self.lm_head_weight.device
        rows = rows if max_batch is None else min(rows, int(max_batch))
        with torch.inference_mode(False):
            self.eager_in = torch.zeros(
                (rows, self.slots, self.lm_head_weight.shape[1]), dtype=self.lm_head_weight.dtype, device=device
            )
        capture = capture and device.type == "cuda" and self.sharded is None
        sizes = self.eager_sizes(graph_batch_sizes=graph_batch_sizes, capture=capture, max_batch=max_batch)
        self.precompile(eager_sizes=sizes)
        for b in sizes:
            self.propose(self.eager_in[:b], self.anchors[:b])
        if capture and sizes:
            torch.cuda.synchronize(device)
            pool = torch.cuda.graph_pool_handle()
            for b in reversed(sizes):  # largest first: the smaller graphs reuse its memory
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.out[: b * self.slots].copy_(self.propose(self.eager_in[:b], self.anchors[:b]).reshape(-1))
                self.eager_graphs[b] = graph
        return sizes

    def eager_sizes(self, *, graph_batch_sizes: list[int], capture: bool, max_batch: int | None = None) -> list[int]:
        """The batch sizes `warm` runs with these arguments (after allocate())."""
        rows = self.anchors.shape[0] if max_batch is None else min(self.anchors.shape[0], int(max_batch))
        top = max(graph_batch_sizes, default=0)
        if capture and self.lm_head_weight.is_cuda and self.sharded is None:
            return sorted({*range(top + EAGER_BUCKET, rows, EAGER_BUCKET), rows} - set(range(top + 1)))
        return list(range(top + 1, rows + 1))

    def precompile(self, *, graph_batch_sizes: list[int] = (), eager_sizes: list[int] = ()) -> CompileReport | None:
        """Build concurrently the Triton kernels of the draft graphs and eager proposal at these sizes -> report."""
        draft = sorted({int(b) for b in graph_batch_sizes} - {b for kind, b in self.precompiled if kind == "draft"})
        eager = sorted({int(b) for b in eager_sizes} - {b for kind, b in self.precompiled if kind == "eager"})
        if not draft and not eager:
            return None
        hm, dtype, device = self.lm_head_weight.shape[1], self.lm_head_weight.dtype, self.lm_head_weight.device

        def run():
            block = torch.zeros((max(draft, default=0) * self.block_size, hm), dtype=dtype, device=device)
            for b in draft:
                self(block[: b * self.block_size])
            pass_hidden = torch.zeros((max(eager, default=0), self.slots, hm), dtype=dtype, device=device)
            for b in eager:
                self.propose(pass_hidden[:b], self.anchors[:b])

        label = f"{ALGORITHM_NAME} select, draft graphs at bs {_span(draft)}, eager proposal at bs {_span(eager)}"
        report = precompile(run, device=device, label=label)
        if report is not None:
            self.precompiled.update([("draft", b) for b in draft] + [("eager", b) for b in eager])
        return report

    def __call__(self, hidden_states: torch.Tensor, input_ids: torch.Tensor | None = None) -> None:
        """SGLang's draft-sampler protocol: hidden_states [b*B, Hm] of the draft block -> `out[: b*S]`."""
        b = hidden_states.shape[0] // self.block_size
        pass_hidden = hidden_states.view(b, self.block_size, -1)[:, 1:]
        self.out[: b * self.slots].copy_(self.propose(pass_hidden, self.anchors[:b]).reshape(-1))
