"""LiLiCorrWorker: SGLang's DFlash v2 speculative worker whose draft block LiLiCorrProposer proposes instead of the
drafter's per-slot argmax; the rest is DFlashWorkerV2's. Overrides (no SGLang source touched): the draft sampler, the
draft-KV append (append_graphs.py), the memory pool, the attention backends, the CUDA graphs, and the decode step
(verify_width.py, narrow_verify.py)."""

from __future__ import annotations

import logging
import os
import time

import torch
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.mem_cache.allocation_sizing import get_alloc_page_size
from sglang.srt.runtime_context import get_parallel
from sglang.srt.speculative.dflash_utils import is_dense_head_weight
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from . import ALGORITHM_NAME
from .append_graphs import AppendGraphs
from .graphs import eager_batches_possible, graph_batch_sizes
from .kv_rows import check_rows
from .models.lilicorr_draft import LiLiCorrDraftModel
from .narrow_verify import chain_step, narrow_step, serves
from .proposer import LiLiCorrProposer, walk_rule
from .server_args import ServingConfigError
from .target_warmup import warm as warm_target_prefill
from .verification import Verification, install_request_refusal
from .verify_attention import configure as configure_verify_attention, target_attention_backends
from .verify_tiers import build_tier, captured_graphs, measure_replay
from .verify_width import ADAPTIVE, CHAIN, WIDTH_ENV, AcceptanceRecord, StepCosts, WidthPolicy, widths_from_env
from .width_metrics import WidthMetrics
from .vocab_parallel import VocabShard

logger = logging.getLogger(__name__)
POLICY_LOG_S = 30.0  # seconds of serving between two log lines of the width policy's view


def lm_head_rows(lm_head, vocab_size: int, tp_group) -> tuple[torch.Tensor, VocabShard | None]:
    """This rank's LM-head rows over the real vocabulary: ([V, Hm], None), or under TP ([n, Hm], its VocabShard)."""
    weight = getattr(lm_head, "weight", None)
    if not is_dense_head_weight(weight):
        raise ServingConfigError(
            f"{ALGORITHM_NAME} needs the target's LM head as a dense bf16/fp16/fp32 matrix (its top-K reads full-"
            "vocabulary logits); this target's LM head is quantized. Serve an unquantized target or use DFLASH."
        )
    shard = getattr(lm_head, "shard_indices", None)
    if shard is not None and int(shard.num_added_elements) != 0:
        raise ServingConfigError(
            f"{ALGORITHM_NAME} does not support an added vocabulary on the target LM head (LoRA extra vocab)."
        )
    if shard is not None and int(shard.num_org_elements) < vocab_size:  # vocabulary-parallel: rank r's contiguous ids
        start, size = int(shard.org_vocab_start_index), int(shard.num_org_elements)
        vocab = VocabShard(start, size, vocab_size, int(tp_group.world_size), tp_group.all_gather_into_tensor)
        return weight[:size], vocab
    if weight.shape[0] < vocab_size:
        raise ServingConfigError(f"target LM head has {weight.shape[0]} rows for a {vocab_size}-token vocabulary.")
    return weight[:vocab_size], None


def slowest_rank(tp_group):
    """Under tensor parallelism, values -> each one's max over the ranks (on their CPU group); else None."""

    def agree(values: list[float]) -> list[float]:
        held = torch.tensor(values, dtype=torch.float64)
        torch.distributed.all_reduce(held, op=torch.distributed.ReduceOp.MAX, group=tp_group.cpu_group)
        return held.tolist()

    return agree if int(tp_group.world_size) > 1 else None


def full_embedding(embed, vocab_size: int) -> torch.Tensor:
    """The target's input embedding over the whole vocabulary [>= V, Hm], all-gathered once if sharded."""
    weight = getattr(embed, "weight", None)
    if weight is None:
        raise ServingConfigError(f"{ALGORITHM_NAME}: the target exposes no input embedding table.")
    shard = getattr(embed, "shard_indices", None)
    if shard is not None and int(shard.num_org_elements) < vocab_size:
        if int(shard.num_added_elements) != 0 or not is_dense_head_weight(weight):
            raise ServingConfigError(
                f"{ALGORITHM_NAME}: the target's vocabulary-parallel input embedding is quantized or holds an added "
                "vocabulary; serve this target with --tp-size 1 or use DFLASH."
            )
        with torch.no_grad():
            weight = embed.tp_group.all_gather(weight, dim=0)  # [ranks * padded shard, Hm]: global ids in order
    if weight.shape[0] < vocab_size:
        raise ServingConfigError(
            f"the target's input embedding has {weight.shape[0]} rows for a {vocab_size}-token vocabulary."
        )
    return weight


class LiLiCorrWorker(DFlashWorkerV2):
    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker) -> None:
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        if not isinstance(self.draft_model, LiLiCorrDraftModel):
            raise ServingConfigError(
                f"{ALGORITHM_NAME}: the draft loaded as {type(self.draft_model).__name__}, not LiLiCorrDraftModel; "
                'its config.json must declare architectures ["LiLiCorrDraftModel"].'
            )
        target_model = self.model_runner.model
        vocab_size = int(self.model_runner.model_config.vocab_size)
        lm_head_weight, vocab = lm_head_rows(
            unwrap_lora_layer(target_model.lm_head), vocab_size, get_parallel().tp_group
        )
        self.proposer = LiLiCorrProposer(
            head=self.draft_model.lilicorr_head,
            lm_head_weight=lm_head_weight,
            embed_weight=full_embedding(target_model.get_input_embeddings(), vocab_size),
            block_size=int(self.block_size),
            vocab=vocab,
            walk=walk_rule(),
        )
        self._batch_slots: torch.Tensor | None = None  # req_pool_indices of the batch in flight
        self._warned_eager = False
        self.widths = widths_from_env(int(self.block_size))
        self.tiers: dict = {}  # width < B -> VerifyTier, captured in init_cuda_graphs
        self.policy: WidthPolicy | None = None  # where more than one width is served
        self.metrics = WidthMetrics.create()
        self._last_decode: tuple[int, int, float] | None = None  # (width, batch, perf_counter) of the last decode step
        self._policy_logged = 0.0  # perf_counter of the policy's last log line
        self.append_graphs: AppendGraphs | None = None  # the verify's draft-KV append, captured in init_cuda_graphs
        logger.info(
            "%s worker ready: block_size=%d, K=%d, head width=%d, %s.",
            ALGORITHM_NAME,
            self.proposer.block_size,
            self.proposer.topk,
            self.draft_model.lilicorr_head.width,
            "whole LM head on this rank"
            if vocab is None
            else f"LM head ids {vocab.start}..{vocab.start + vocab.size - 1} of {vocab.vocab_size} on this rank, "
            f"top-K/LSE merged over {vocab.ranks} ranks, head and walk replicated",
        )
        logger.info(self.proposer.startup_line())
        self.verification = Verification.detect()
        logger.log(
            logging.INFO if self.verification.exact_sampling else logging.WARNING, self.verification.startup_line()
        )
        if self.verification.refuses_sampled:
            install_request_refusal(self.verification)

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        super().alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        pool = req_to_token_pool if req_to_token_pool is not None else self.model_runner.req_to_token_pool
        context, page = int(self.model_runner.model_config.context_len), int(get_alloc_page_size())
        check_rows(int(pool.req_to_token.shape[1]), context, int(self.block_size), page)
        request_slots = int(pool.req_to_token.shape[0])
        self.proposer.allocate(num_request_slots=request_slots, max_rows=max([request_slots, *graph_batch_sizes()]))

    def init_attention_backends(self):
        super().init_attention_backends()
        # The target's backends exist now; its verify graphs are captured later (init_cuda_graphs).
        configure_verify_attention(
            target_attention_backends(self.model_runner),
            int(self.block_size),
            self.model_runner.dtype,
            eager=eager_batches_possible(self.server_args.max_running_requests),
        )
        # Before serving: no batch of new prompts compiles SGLang's prefill kernel while its requests wait.
        warm_target_prefill(self.model_runner)

    def _maybe_build_draft_sampler(self):
        # called right before the draft graphs are captured; the returned object runs inside each of them
        logger.info(
            "%s: draft pass + top-K/LSE + head + walk captured together in the draft CUDA graph (batch sizes %s).",
            ALGORITHM_NAME,
            sorted(graph_batch_sizes()),
        )
        # its kernels (and the eager sizes' that `warm` runs next) compile concurrently now
        sizes, max_batch = graph_batch_sizes(), self.server_args.max_running_requests
        self.proposer.precompile(
            graph_batch_sizes=sizes,
            eager_sizes=self.proposer.eager_sizes(graph_batch_sizes=sizes, capture=True, max_batch=max_batch),
        )
        return self.proposer

    def init_cuda_graphs(self) -> None:
        super().init_cuda_graphs()
        captured = self._draft_sampler is not None
        warmed = self.proposer.warm(
            graph_batch_sizes=graph_batch_sizes() if captured else [],
            capture=captured,
            max_batch=self.server_args.max_running_requests,
        )
        logger.info(
            "%s: the proposal warmed at %s batch sizes above the draft graphs; eager batches replay graphs of %s "
            "requests.",
            ALGORITHM_NAME,
            len(warmed),
            sorted(self.proposer.eager_graphs) or "no",
        )
        if self._draft_sampler is None:
            logger.warning(
                "%s: the draft CUDA graph is disabled (see the DFLASH message above, or "
                "--cuda-graph-backend-decode disabled); the head and walk run eagerly after each draft pass. "
                "Expect much lower throughput; do not compare its tokens/s with a graphed run.",
                ALGORITHM_NAME,
            )
        self._init_verify_widths()
        if captured:
            self._capture_append(sizes=[b for b in graph_batch_sizes() if b <= self.server_args.max_running_requests])

    @property
    def chain(self) -> int:
        """The width-1 step's plain decode forwards: CHAIN, or as many as a shorter block has columns."""
        return min(CHAIN, int(self.block_size))

    def _capture_append(self, sizes: list[int]) -> None:
        """The draft-KV append of a verify step of every served width, captured at the draft graphs' batch sizes."""
        if not sizes:
            return
        graphs = AppendGraphs(
            max_batch=max(sizes),
            block_size=int(self.block_size),
            hidden_width=int(self.draft_model.fc.weight.shape[1]),
            dtype=self.model_runner.dtype,
            device=self.device,
        )
        widths = sorted({*self.widths, self.chain} if 1 in self.widths else self.widths)  # width 1 appends its chain
        fused = self._use_fused_kv_materialize, self._fused_kv_helper  # SGLang turns its fused append off for good
        with torch.inference_mode():  # where it fails, as under a capture: the eager appends keep it
            graphs.capture(self._append_and_publish, sizes, widths)
        self._use_fused_kv_materialize, self._fused_kv_helper = fused
        self.append_graphs = graphs if graphs.graphs else None

    def _init_verify_widths(self) -> None:
        """Capture the narrower widths' verify, time every width's step, and build the policy; one start-up line."""
        block = int(self.block_size)
        runner = self.model_runner
        why_fixed = None
        if self.widths == (block,):
            why_fixed = "pinned"
        elif self._need_mamba_verify_commit:
            why_fixed = "a hybrid (Mamba) target keeps the whole block"
        elif self._draft_sampler is None or runner.decode_cuda_graph_runner is None:
            why_fixed = "CUDA graphs are off, so no width's cost can be measured"
        if why_fixed is None:
            eager = eager_batches_possible(self.server_args.max_running_requests)

            def configure(backend, width):
                configure_verify_attention([backend], width, runner.dtype, eager=eager)

            self.tiers = {w: build_tier(runner, w, configure) for w in self.widths if w < block}
            verify_graphs = {w: captured_graphs(t.graph_runner) for w, t in self.tiers.items()}
            if block in self.widths:
                verify_graphs[block] = captured_graphs(runner.decode_cuda_graph_runner)
            draft_graphs = captured_graphs(self.draft_model_runner.decode_cuda_graph_runner)
            replay = measure_replay(verify_graphs, draft_graphs, self.chain)
            agree = slowest_rank(get_parallel().tp_group)
            if agree is not None:  # every rank must verify the same width
                replay = dict(zip(sorted(replay), agree([replay[k] for k in sorted(replay)])))
            if not replay:
                why_fixed = "no captured graph could be timed"
            else:
                costs = StepCosts(replay, agree=agree)
                self.policy = WidthPolicy(self.widths, costs, AcceptanceRecord(block - 1), chain=self.chain)
        if why_fixed is not None and self.widths != (block,):
            self.widths = (block,)
        logger.info(
            "%s: verify width %s (%s=%s).",
            ALGORITHM_NAME,
            f"adaptive over {list(self.widths)}" if self.policy else f"{self.widths[-1]} ({why_fixed})",
            WIDTH_ENV,
            os.environ.get(WIDTH_ENV, ADAPTIVE),
        )

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        self._batch_slots = batch.req_pool_indices
        decoding = not (batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle())
        if not decoding or batch.req_pool_indices is None or batch.spec_info is None:
            self._last_decode = None
            return super().forward_batch_generation(
                batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
            )
        size, block = len(batch.reqs), int(self.block_size)
        now = time.perf_counter()
        if self.policy is not None and self._last_decode is not None:
            width, last_size, then = self._last_decode
            self.policy.costs.observe(width, last_size, now - then)
        narrow = self.policy is not None and serves(self, batch)  # else the block (a grammar: not its cost)
        width = block if self.policy is None else self.policy.width(size, narrow=narrow)
        if (
            self.policy is not None
            and now - self._policy_logged > POLICY_LOG_S
            and self.policy.costs.covers(self.widths, size)
        ):
            self._policy_logged = now
            logger.info("%s: verify width policy at %s.", ALGORITHM_NAME, self.policy.describe(size))
        if width > 1:  # a draft pass reads the batch's anchors; a width-1 step drafts nothing
            self.proposer.stage_anchors(batch.req_pool_indices)
        if width == 1:
            result = chain_step(self, batch, self.chain, self.tiers[1], on_publish=on_publish)
        elif width < block:
            result = narrow_step(self, batch, width, self.tiers[width], on_publish=on_publish)
        else:
            result = super().forward_batch_generation(
                batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
            )
        self._last_decode = (width, size, now) if narrow else None
        self.metrics.step(width, result, size)
        return result

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int], batch_size: int = 0) -> None:
        # SGLang's host-side report of each verify step's accepted draft counts, in launch order
        if self.policy is not None:
            width = self.policy.verified(num_correct_drafts_per_req)
            self.metrics.verified(width, num_correct_drafts_per_req, self.policy.record)

    def _append_target_hidden_to_draft_kv_by_loc(self, *, commit_lens=None, extend_lens=None, **append) -> None:
        # SGLang's arguments pass through in `append`; a verify's append replays its captured graph if it has one
        loc_2d, graphs = append.get("cache_loc_2d"), self.append_graphs
        if graphs is not None and loc_2d is not None:
            inputs = dict(target_hidden=append["target_hidden"], cache_loc_2d=loc_2d, positions=append["positions"])
            if graphs.replay(**inputs, commit_lens=commit_lens, slots=self._batch_slots):
                return
        self._append_and_publish(commit_lens=commit_lens, extend_lens=extend_lens, slots=self._batch_slots, **append)

    def _append_and_publish(self, *, slots, commit_lens=None, extend_lens=None, **append) -> None:
        """SGLang's append, then each request's anchor (its last verified projected row); `slots`: pool slots."""
        super()._append_target_hidden_to_draft_kv_by_loc(commit_lens=commit_lens, extend_lens=extend_lens, **append)
        context = self.draft_model.take_context_hidden()  # [cache_loc rows, Hm] or None (nothing appended)
        if context is not None and slots is not None:
            rows = self.proposer.anchor_rows(
                num_rows=int(context.shape[0]), extend_lens=extend_lens, commit_lens=commit_lens
            )
            self.proposer.publish_anchors(context.index_select(0, rows), slots)

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states, lm_head, chunk_size: int = 256):
        # the drafted slots' hidden states [b*S, Hm] of a draft run without its CUDA graph: propose eagerly
        slots = self.proposer.slots
        b = hidden_states.shape[0] // slots
        if not self._warned_eager and self._draft_sampler is not None:
            logger.warning(
                "%s: a batch of %d requests is larger than the captured draft graphs; its proposal ran eagerly "
                "(raise --cuda-graph-max-bs-decode to capture it).",
                ALGORITHM_NAME,
                b,
            )
            self._warned_eager = True
        return self.proposer.propose_eager(hidden_states.view(b, slots, -1)).reshape(-1)
